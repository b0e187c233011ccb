"""Search from the API and the CLI, over a live engine whose projector indexes as runs move.

A real engine on a SQLite file (its loops running, a worker answering, the projector registered
in the telemetry fan-out as ``accord serve`` does it), the API on a loopback uvicorn, and the
``accord`` executable in subprocesses reading the same files.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from tests.integration.test_api_support import (
    IDLE,
    QUEUE,
    ROOT,
    Api,
    _Server,
    catalog,
    fallback_plan,
    plan,
)

from accord.adapters import open_engine
from accord.adapters.ingress.app import create_app
from accord.adapters.ingress.control import ControlStore
from accord.adapters.ingress.limits import ApiLimits
from accord.cli.telemetry import projection_for
from accord.engine.runtime.orchestrator import EngineOptions
from accord.testing.workers import run_noop_worker

ACCORD = Path(sys.executable).parent / "accord"


@contextlib.asynccontextmanager
async def serving(tmp: Path) -> AsyncIterator[tuple[Api, str]]:
    url = f"sqlite:///{tmp / 'accord.db'}"
    search = projection_for(None, url)  # the default: beside the SQLite store
    assert search.url == f"sqlite:///{tmp / 'accord.projection.db'}"
    engine = open_engine(
        url, url, options=EngineOptions(poll_ms=10, grace_ms=200), catalog=catalog(),
        sink=search.sink,
    )  # fmt: skip
    assert search.attach(engine) is not None
    control = ControlStore(tmp / "control.db")
    app = create_app(engine, control, catalog=catalog(), root=ROOT,
                     limits=ApiLimits(rate_per_s=10_000, burst=10_000))  # fmt: skip
    app.state.projection = search.projection
    server = _Server(uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off",
                                    log_level="warning", access_log=False))  # fmt: skip
    for one in (plan(), plan("api-idle", IDLE), fallback_plan()):
        await engine.register_plan(one)
    await engine.announce("api-workers", ["test.work@1", "test.notify@1"], 86_400_000)
    await engine.start()
    stop = asyncio.Event()
    worker = asyncio.get_running_loop().create_task(
        run_noop_worker(engine.transport, [QUEUE], stop=stop)
    )
    serve = asyncio.get_running_loop().create_task(server.serve())
    try:
        async with asyncio.timeout(10):
            while not server.started:
                await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        api = Api(f"http://127.0.0.1:{port}", engine, control)
        for tenant in ("acme", "globex"):
            api.keys[("viewer", tenant)] = control.create_key("viewer", [tenant])[0]
            api.keys[("operator", tenant)] = control.create_key("operator", [tenant])[0]
        yield api, url
    finally:
        server.should_exit = True
        await asyncio.wait_for(serve, 15)
        stop.set()
        await asyncio.gather(worker, return_exceptions=True)
        await engine.stop()
        await search.close()
        control.close()


async def _start(api: Api, tenant: str, workflow: str, model: str) -> str:
    async with api.as_("operator", tenant) as client:
        got = await client.post("/v1/runs", json={"workflow": workflow,
                                                  "context": {"modelId": model}})  # fmt: skip
        assert got.status_code in (200, 201, 202), got.text
        return str(got.json()["run_id"])


async def _until_indexed(api: Api, tenant: str, q: str, count: int) -> dict[str, Any]:
    async with api.as_("viewer", tenant) as client, asyncio.timeout(30):
        while True:
            got = await client.get("/v1/search", params={"q": q})
            assert got.status_code == 200, got.text
            doc: dict[str, Any] = got.json()
            if doc["total"] >= count:
                return doc
            await asyncio.sleep(0.05)


def _cli(*args: str) -> tuple[int, Any]:
    done = subprocess.run([str(ACCORD), *args], capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip
    return done.returncode, json.loads(done.stdout)


async def test_search_from_the_api_is_tenant_scoped_faceted_and_says_it_lags(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as (api, _url):
        done = [await _start(api, "acme", "api-flow", f"m{i}") for i in range(3)]
        idle = await _start(api, "acme", "api-idle", "x")
        other = await _start(api, "globex", "api-flow", "g1")
        doc = await _until_indexed(api, "acme", "workflow:api-flow status:completed", 3)
        assert sorted(r["run_id"] for r in doc["runs"]) == sorted(done)
        assert doc["facets"]["status"] == {"completed": 3}
        assert doc["facets"]["version"] == {"api-flow@1.0.0": 3}
        assert doc["source"].startswith("derived index")
        assert doc["indexed_through_ms"] > 0 and doc["lag_ms"] is not None
        running = await _until_indexed(api, "acme", "status:running", 1)
        assert [r["run_id"] for r in running["runs"]] == [idle]
        everything = await _until_indexed(api, "acme", "", 4)
        assert other not in {r["run_id"] for r in everything["runs"]}  # acme sees only acme
        assert everything["facets"]["status"] == {"completed": 3, "running": 1}
        await _until_indexed(api, "globex", "", 1)
        async with api.as_("viewer", "acme") as client:
            got = await client.get("/v1/search", params={"q": "tenant:globex"})
            assert got.status_code == 403 and got.json()["code"] == "tenant-forbidden"
            got = await client.get("/v1/search", params={"tenant": "globex"})
            assert got.status_code == 403
            got = await client.get("/v1/search", params={"q": "colour:red"})
            assert got.status_code == 422 and "colour:red" in got.json()["detail"]
            got = await client.get("/v1/search", params={"q": "since:soon"})
            assert got.status_code == 422
        async with api.client() as anonymous:
            assert (await anonymous.get("/v1/search")).status_code == 401


async def test_search_rebuild_and_verify_from_the_cli(tmp_path: Path) -> None:
    async with serving(tmp_path) as (api, url):
        done = [await _start(api, "acme", "api-flow", f"m{i}") for i in range(2)]
        await _start(api, "globex", "api-idle", "x")
        await _until_indexed(api, "acme", "status:completed", 2)
        await _until_indexed(api, "globex", "status:running", 1)
    code, doc = _cli("runs", "search", "workflow:api-flow status:completed tenant:acme",
                     "--store", url, "--json")  # fmt: skip
    assert code == 0, doc
    assert sorted(r["run_id"] for r in doc["runs"]) == sorted(done)
    assert doc["facets"]["status"] == {"completed": 2} and doc["source"].startswith("derived")
    code, doc = _cli("telemetry", "verify", "--store", url, "--json")
    assert (code, doc["ok"], doc["checked"], doc["divergences"]) == (0, True, 3, [])
    code, doc = _cli("telemetry", "rebuild", "--store", url, "--json")
    assert (code, doc["runs"]) == (0, 3)
    code, doc = _cli("telemetry", "verify", "--store", url, "--sample", "2", "--json")
    assert (code, doc["ok"], doc["checked"]) == (0, True, 2)
    code, doc = _cli("telemetry", "failures", "--store", url, "--json")
    assert (code, doc["failures"]) == (0, [])
    code, doc = _cli("telemetry", "status", "--store", url, "--json")
    assert code == 0 and doc["runs"] == 3 and doc["failures"] == 0

    # a projection that lost a run: verify says which, and exits 1
    other = f"sqlite:///{tmp_path / 'empty.projection.db'}"
    code, doc = _cli("telemetry", "verify", "--store", url, "--projection", other, "--json")
    assert code == 1 and {d["problem"] for d in doc["divergences"]} == {"missing"}
    assert len(doc["divergences"]) == 3


def test_bad_search_input_is_refused_in_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'accord.db'}"
    code, doc = _cli("runs", "search", "colour:red", "--store", url, "--json")
    assert code == 2 and "colour:red" in doc["error"] and doc["ok"] is False
    code, doc = _cli("runs", "search", "", "--store", "redis://127.0.0.1:6379/15", "--json")
    assert code == 2 and "--projection" in doc["error"]
    code, doc = _cli("telemetry", "verify", "--store", url, "--projection", "mongo://x", "--json")
    assert code == 2 and "unknown scheme 'mongo'" in doc["error"]


async def test_with_the_projection_off_search_answers_404(tmp_path: Path) -> None:
    async with serving(tmp_path) as (api, _url):
        app = create_app(api.engine, api.control, catalog=catalog(), root=ROOT)  # no projection
        transport = httpx.ASGITransport(app=app)
        key = api.key("viewer", "acme")
        async with httpx.AsyncClient(
            transport=transport, base_url="http://test", headers={"Authorization": f"Bearer {key}"}
        ) as client:
            got = await client.get("/v1/search")
        assert got.status_code == 404 and got.json()["code"] == "projection-off"
