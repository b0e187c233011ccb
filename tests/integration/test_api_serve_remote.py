"""`accord serve --remote-workers FILE` with the reference remote worker, both as processes.

The server runs the API and the engine on the embedded default; the file routes the ``metadata``
queue to ``accord-metadata-extract-http`` (python -m), which takes the signed job over HTTP,
measures the model and answers with signed callbacks on the server's ``POST /v1/callbacks``. A
one-stage workflow is activated through the API (admission sees the remote's capability as
live), a run started through the API completes with the model's measurements, and a callback
with no valid signature is refused with 401.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
ACCORD = Path(sys.executable).parent / "accord"
CONTRACTS = ROOT / "schemas" / "contracts"
SECRET = "whsec_" + base64.b64encode(os.urandom(32)).decode()
WORKFLOW = """\
name: remote-extract
version: "1.0.0"
entry: extract
stages:
  - name: extract
    type: worker
    queue: metadata
    worker: metadata.extract@2
    input:
      modelId: "${context.modelId}"
      storageConnectionRef: local
      objectKey: "${context.objectKey}"
    retry: { max_attempts: 1 }
    on_success: completed
    on_failure: failed
terminals: [completed, failed]
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env() -> dict[str, str]:
    paths = [
        str(ROOT / "workers" / f / "src") for f in ("metadata-extract-http", "metadata-extract")
    ]
    old = os.environ.get("PYTHONPATH")
    return os.environ | {
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([*paths, *([old] if old else [])]),
        "META_SECRET": SECRET,
        "ACCORD_CALLBACK_SECRET": SECRET,
        "ACCORD_JOB_SECRETS": f"k1={SECRET}",
    }


@contextlib.asynccontextmanager
async def _process(cwd: Path, name: str, *argv: str) -> AsyncIterator[asyncio.subprocess.Process]:
    log = (cwd / f"{name}.log").open("ab")
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=log, env=_env()
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 30)
        log.close()
        # uvicorn.run re-raises the SIGTERM it shut down on once it is done
        assert code in (0, -signal.SIGTERM), (
            f"{name} exited {code}: {(cwd / f'{name}.log').read_text()[-3000:]}"
        )


async def _until_up(url: str) -> None:
    async with httpx.AsyncClient(timeout=2) as client, asyncio.timeout(60):
        while True:
            with contextlib.suppress(httpx.HTTPError):
                await client.get(url)
                return
            await asyncio.sleep(0.1)


async def test_a_stage_served_by_a_remote_http_worker_through_accord_serve(
    tmp_path: Path,
) -> None:
    objects = tmp_path / ".accord" / "objects"
    (objects / "demo" / "models").mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "models" / "cube.3mf", objects / "demo" / "models" / "cube.3mf")
    api_port, worker_port = _free_port(), _free_port()
    (tmp_path / "remote-workers.yaml").write_text(
        "remotes:\n"
        "  metadata:\n"
        "    capability: metadata.extract@2\n"
        f"    url: http://127.0.0.1:{worker_port}/v1/jobs\n"
        f"    cancel_url: http://127.0.0.1:{worker_port}/v1/cancel\n"
        "    allow: [127.0.0.1]\n"
        "    allow_http: true\n"
        "    signing_key: k1\n"
        "    secrets: {k1: 'env:META_SECRET'}\n",
        encoding="utf-8",
    )
    created = await asyncio.create_subprocess_exec(
        str(ACCORD), "keys", "create", "--role", "author", "--tenant", "demo", "--json",
        cwd=tmp_path, stdout=asyncio.subprocess.PIPE, env=_env(),
    )  # fmt: skip
    out, _ = await created.communicate()
    key = json.loads(out)["key"]
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(
            _process(
                tmp_path,
                "worker",
                sys.executable,
                "-m",
                "accord_worker_metadata_extract_http",
                "--port",
                str(worker_port),
                "--key-id",
                "k1",
                "--storage-root",
                str(objects),
                "--callback-url",
                f"http://127.0.0.1:{api_port}/v1/callbacks",
                "--contracts",
                str(CONTRACTS),
                "--heartbeat-ms",
                "500",
                "--acceptance-db",
                str(tmp_path / "acceptance.sqlite"),
            )
        )
        await stack.enter_async_context(
            _process(
                tmp_path,
                "serve",
                str(ACCORD),
                "serve",
                "--port",
                str(api_port),
                "--contracts",
                str(CONTRACTS),
                "--remote-workers",
                "remote-workers.yaml",
            )
        )
        url = f"http://127.0.0.1:{api_port}"
        await _until_up(f"{url}/healthz")
        await _until_up(f"http://127.0.0.1:{worker_port}/")
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
            made = await client.post("/v1/workflows", json={"source": WORKFLOW})
            assert made.status_code == 201, made.text
            got = await client.post(
                "/v1/runs",
                json={
                    "workflow": "remote-extract",
                    "context": {"modelId": "cube", "objectKey": "models/cube.3mf"},
                },
                headers={"Idempotency-Key": "remote-cube"},
            )
            assert got.status_code == 201, got.text
            run_id = got.json()["run_id"]
            async with asyncio.timeout(60):
                while (run := (await client.get(f"/v1/runs/{run_id}")).json())["status"] not in (
                    "completed",
                    "failed",
                ):
                    await asyncio.sleep(0.1)
            assert run["status"] == "completed", (run, (tmp_path / "serve.log").read_text()[-3000:])
            result = run["stages"]["extract"]["result"]
            assert (result["modelId"], result["vertexCount"], result["faceCount"]) == (
                "cube",
                8,
                12,
            )
            forged = await client.post("/v1/callbacks", content=b'{"messageType": "succeeded"}')
            assert forged.status_code == 401, forged.text
            assert forged.headers["content-type"].startswith("application/problem+json")
