"""`accord serve` on the embedded default, as its own process, with the reference workers.

In a scratch folder: ``accord keys create`` makes the keys, ``accord serve --port 0`` runs the
API and the engine over ``.accord/accord.db``, the three reference workers run as ``accord
worker run`` processes on the same file, the model-ingest workflow is activated (compiled and
admitted) through the API, runs are started through the API and followed over SSE until they
complete; SIGTERM stops the server (exit 0). The keys CLI lists and revokes, and a revoked key is
refused at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
ACCORD = Path(sys.executable).parent / "accord"
CONTRACTS = ROOT / "schemas" / "contracts"
EMBEDDED = "sqlite:///.accord/accord.db"
WORKERS = (
    ("metadata-extract", "accord_worker_metadata_extract.handler:worker"),
    ("thumbnail-render", "accord_worker_thumbnail_render.handler:worker"),
    ("semantic-analyse", "accord_worker_semantic_analyse.handler:worker"),
)
MODELS = ("cube.3mf", "plate-with-hole.stl")


def _env() -> dict[str, str]:
    paths = [str(ROOT / "workers" / folder / "src") for folder, _ in WORKERS]
    old = os.environ.get("PYTHONPATH")
    return os.environ | {
        "PYTHONUNBUFFERED": "1",
        "COLUMNS": "200",
        "PYTHONPATH": os.pathsep.join([*paths, *([old] if old else [])]),
    }


async def _accord(cwd: Path, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        str(ACCORD),
        *args,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_env(),
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@contextlib.asynccontextmanager
async def _process(cwd: Path, name: str, *args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    log = (cwd / f"{name}.log").open("ab")
    proc = await asyncio.create_subprocess_exec(
        str(ACCORD), *args, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=log, env=_env()
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 30)
        log.close()
        assert code == 0, f"{name} exited {code}: {(cwd / f'{name}.log').read_text()[-3000:]}"


async def _serving_url(proc: asyncio.subprocess.Process, cwd: Path) -> str:
    assert proc.stdout is not None
    async with asyncio.timeout(60):
        while True:
            line = (await proc.stdout.readline()).decode()
            assert line, f"accord serve ended: {(cwd / 'serve.log').read_text()[-3000:]}"
            if line.startswith("serving on "):
                return line.split()[2]


async def _follow(client: httpx.AsyncClient, run_id: str) -> list[dict[str, Any]]:
    """Every event of the run's stream up to its ``end``."""
    events: list[dict[str, Any]] = []
    async with client.stream("GET", f"/v1/runs/{run_id}/events") as stream:
        assert stream.status_code == 200
        kind = ""
        async for line in stream.aiter_lines():
            if line.startswith("event:"):
                kind = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                events.append({"sse": kind, "data": json.loads(line.split(":", 1)[1])})
                if kind == "end":
                    break
    return events


async def test_accord_serve_runs_the_model_ingest_workflow_with_the_reference_workers(
    tmp_path: Path,
) -> None:
    code, out, err = await _accord(
        tmp_path, "keys", "create", "--role", "admin", "--tenant", "demo", "--json"
    )
    assert code == 0, err
    admin = json.loads(out)["key"]
    code, out, err = await _accord(
        tmp_path,
        "keys",
        "create",
        "--role",
        "viewer",
        "--tenant",
        "demo",
        "--name",
        "to revoke",
        "--json",
    )
    viewer = json.loads(out)
    objects = tmp_path / ".accord" / "objects" / "demo" / "models"
    objects.mkdir(parents=True)
    for name in MODELS:
        shutil.copy(ROOT / "examples" / "models" / name, objects / name.replace(" ", "-"))
    serve_args = ["serve", "--port", "0", "--contracts", str(CONTRACTS)]
    async with contextlib.AsyncExitStack() as stack:
        server = await stack.enter_async_context(_process(tmp_path, "serve", *serve_args))
        url = await _serving_url(server, tmp_path)
        for folder, spec in WORKERS:
            await stack.enter_async_context(
                _process(
                    tmp_path,
                    folder,
                    "worker",
                    "run",
                    spec,
                    "--transport",
                    EMBEDDED,
                    "--store",
                    EMBEDDED,
                    "--contracts",
                    str(CONTRACTS),
                    "--heartbeat-ms",
                    "500",
                )
            )
        headers = {"Authorization": f"Bearer {admin}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
            async with asyncio.timeout(60):  # the workers announce their capabilities
                while len((await client.get("/v1/capabilities")).json()["workers"]) < 3:
                    await asyncio.sleep(0.2)
            source = (ROOT / "workflows" / "model-ingest.yaml").read_text(encoding="utf-8")
            made = await client.post("/v1/workflows", json={"source": source})
            assert made.status_code == 201, made.text
            ids = []
            for name in MODELS:
                model_id = Path(name).stem
                got = await client.post(
                    "/v1/runs",
                    json={"workflow": "model-ingest", "context": {"modelId": model_id}},
                    headers={"Idempotency-Key": f"ingest-{model_id}"},
                )
                assert got.status_code == 201, got.text
                assert got.json()["tenant"] == "demo"
                ids.append(got.json()["run_id"])
            for run_id in ids:
                async with asyncio.timeout(90):
                    events = await _follow(client, run_id)
                end = events[-1]
                assert end["sse"] == "end" and end["data"]["status"] == "completed", (
                    events[-3:],
                    (tmp_path / "serve.log").read_text()[-2000:],
                )
                kinds = [e["data"]["event"]["kind"] for e in events if e["sse"] == "history"]
                assert kinds[0] == "run-started" and "stage-succeeded" in kinds, kinds
                run = (await client.get(f"/v1/runs/{run_id}")).json()
                assert run["stages"]["technical-metadata"]["status"] == "completed"
            listed = (await client.get("/v1/runs", params={"workflow": "model-ingest"})).json()
            assert sorted(r["run_id"] for r in listed["runs"]) == sorted(ids)
            audit = (await client.get("/v1/audit", params={"action": "run.start"})).json()
            assert sorted(r["target"] for r in audit["records"]) == sorted(ids)
        # the keys CLI: list shows no secret; a revoked key is refused by the running server
        code, out, err = await _accord(tmp_path, "keys", "list", "--json")
        assert code == 0, err
        listed_keys = json.loads(out)
        assert {k["key_id"] for k in listed_keys} >= {viewer["key_id"]}
        assert all("key" not in k for k in listed_keys)
        async with httpx.AsyncClient(base_url=url, timeout=30) as anon:
            auth = {"Authorization": f"Bearer {viewer['key']}"}
            assert (await anon.get("/v1/runs", headers=auth)).status_code == 200
            code, out, err = await _accord(tmp_path, "keys", "revoke", viewer["key_id"], "--json")
            assert code == 0 and json.loads(out)["revoked"] is True, err
            refused = await anon.get("/v1/runs", headers=auth)
            assert refused.status_code == 401, refused.text
        code, out, err = await _accord(tmp_path, "keys", "revoke", viewer["key_id"], "--json")
        assert code == 1 and json.loads(out)["ok"] is False
        code, out, err = await _accord(
            tmp_path, "keys", "create", "--role", "boss", "--tenant", "demo", "--json"
        )
        assert code == 2 and "role" in json.loads(out)["error"]
