"""The Worker SDK against the real engine: model-ingest compiled from workflows/, SQLite store and
embedded queue, the platform actions, and SDK workers whose handlers return contract-valid
results. The first run of a model goes through the workers and fills the cache; the second takes
the decision's cache-hit branch straight to publish."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from accord.cli.workflow import compile_file
from accord.contracts.catalog import Catalog
from accord.contracts.fixture_values import message_of
from accord.contracts.sources import load_catalog
from accord.engine.runtime.orchestrator import Engine
from accord.worker import Context, Worker
from accord.worker.fleet import ingest_stack, wait_terminal
from accord.workflow.plan import Plan, TaskStage

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compiled() -> tuple[Plan, Catalog]:
    catalog = load_catalog(ROOT / "schemas" / "contracts")
    return compile_file(ROOT / "workflows" / "model-ingest.yaml", catalog).unwrap(), catalog


def fleet(plan: Plan, catalog: Catalog, calls: list[str]) -> list[Worker]:
    workers = []
    for stage in plan.stages:
        if not (isinstance(stage, TaskStage) and stage.type == "worker"):
            continue
        contract = catalog.message(stage.capability.result)
        assert contract is not None
        result = message_of(contract.payload, full=False)
        w = Worker(stage.capability.name.replace(".", "-"))

        def handle(payload: dict[str, Any], ctx: Context, r: Any = result) -> dict[str, Any]:
            calls.append(ctx.capability)
            ctx.progress(50, "half way")
            return dict(r) | {"modelId": payload["modelId"]}

        w.bind(stage.capability.ref, handle)
        workers.append(w)
    return workers


def seed_models(state: Path, names: list[str]) -> None:
    for name in names:
        path = state / "objects" / "acme" / "models" / f"{name}.stl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"solid {name}\nendsolid {name}\n".encode())


async def test_second_run_of_a_model_takes_the_cache_hit_branch(
    compiled: tuple[Plan, Catalog], tmp_path: Path
) -> None:
    plan, catalog = compiled
    seed_models(tmp_path, ["m1", "m2"])
    calls: list[str] = []
    url = f"sqlite:///{tmp_path / 'accord.db'}"
    async with ingest_stack(url, plan, catalog, fleet(plan, catalog, calls), state=tmp_path) as s:
        first = [await s.engine.start_run(plan.name, {"modelId": m}, tenant="acme")
                 for m in ("m1", "m2")]  # fmt: skip
        await wait_terminal(s.engine, first, 60)
        await s.platform.writer.drain()
        assert len(calls) == 6 and s.platform.writer.written == 6
        second = await s.engine.start_run(plan.name, {"modelId": "m1"}, tenant="acme")
        await wait_terminal(s.engine, [second], 60)
        for run_id in first:
            await assert_path(s.engine, run_id, hit=False)
        await assert_path(s.engine, second, hit=True)
        assert len(calls) == 6  # no worker ran for the cached model
        rows = s.platform.catalogue.rows("acme")
        assert [(r["modelId"], r["revision"]) for r in rows] == [("m1", 2), ("m2", 1)]
        assert len(s.platform.audit.rows()) == 3
        assert [rt.stats["handler_runs"] for rt in s.runtimes] == [2, 2, 2]


async def assert_path(engine: Engine, run_id: str, *, hit: bool) -> None:
    run = await engine.load(run_id)
    assert run is not None and run.status == "completed", run
    assert ("cache-route->publish" in run.released) is hit
    assert ("cache-route->render-thumbnail" in run.released) is not hit
    lookup = run.stages["cache-lookup"].result
    assert lookup is not None and lookup["hit"] is hit
    assert lookup["outcome"] == ("hit" if hit else "miss")
    dispatched = [
        h.event.get("stage") for h in await engine.history(run_id)
        if h.accepted and h.event.get("kind") == "stage-accepted"
    ]  # fmt: skip
    assert ("render-thumbnail" in dispatched) is not hit


@pytest.mark.parametrize("loop", ["auto", "asyncio"])
def test_worker_command_serves_jobs_from_another_process(tmp_path: Path, loop: str) -> None:
    module = tmp_path / "tiny_worker.py"
    module.write_text(
        "from accord.worker import Worker\n"
        "worker = Worker('tiny')\n"
        "@worker.handler('cache.lookup@1', queue='tiny')\n"
        "async def lookup(payload, ctx):\n"
        "    return {'hit': False, 'outcome': 'miss'}\n"
    )
    url = f"sqlite:///{tmp_path / 'q.db'}"
    env = os.environ | {"PYTHONPATH": str(tmp_path)}
    cmd = [str(Path(sys.executable).parent / "accord"), "worker", "run", "tiny_worker:worker",
           "--transport", url, "--store", url, "--state", str(tmp_path / "w"),
           "--loop", loop]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        asyncio.run(_one_job(url, tmp_path))
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    assert "serving cache.lookup@1 on tiny" in out and "stopped after 1 jobs" in out
    assert f"({'uvloop' if loop == 'auto' else 'asyncio'} loop)" in out


async def _one_job(url: str, tmp_path: Path) -> None:
    from accord.adapters import open_store, open_transport

    store = open_store(url)
    transport = open_transport(url)
    envelope = {"messageId": "msg_1", "messageType": "cache-lookup-request", "contractVersion": 1,
                "correlationId": "r1", "producer": "test", "tenant": "acme",
                "occurredAt": "2026-01-01T00:00:00.000Z", "runId": "r1", "stage": "s",
                "attempt": 1, "fence": "ab" * 16, "payload": {"modelId": "m1"}}  # fmt: skip
    await transport.publish("tiny", "msg_1", json.dumps(envelope).encode())
    kinds = []
    async with asyncio.timeout(30):
        async for delivery in transport.consume("accord.outcomes", 4):
            kinds.append(json.loads(delivery.body)["messageType"])
            await transport.ack(delivery)
            if kinds[-1] == "succeeded":
                break
    assert kinds[0] == "accepted" and kinds[-1] == "succeeded"
    assert any(await store.live_capabilities(0))
    await transport.close()
    await store.close()


async def test_cancelling_a_run_reaches_the_running_handler(
    compiled: tuple[Plan, Catalog], tmp_path: Path
) -> None:
    plan, catalog = compiled
    seed_models(tmp_path, ["m1"])
    calls: list[str] = []
    workers = fleet(plan, catalog, calls)
    started, saw_cancel = asyncio.Event(), asyncio.Event()

    async def slow_render(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        started.set()
        for _ in range(1000):
            if ctx.cancelled:
                saw_cancel.set()
                ctx.raise_if_cancelled()
            await asyncio.sleep(0.01)
        raise AssertionError("never cancelled")

    render = Worker("slow-render")
    render.bind("thumbnail.render@3", slow_render)
    workers = [render, *(w for w in workers if "thumbnail.render@3" not in w.capabilities)]
    url = f"sqlite:///{tmp_path / 'accord.db'}"
    async with ingest_stack(url, plan, catalog, workers, state=tmp_path) as s:
        run_id = await s.engine.start_run(plan.name, {"modelId": "m1"}, tenant="acme")
        await asyncio.wait_for(started.wait(), 30)
        await s.engine.cancel(run_id, reason="operator changed their mind")
        await asyncio.wait_for(saw_cancel.wait(), 30)
        await wait_terminal(s.engine, [run_id], 30)
        run = await s.engine.load(run_id)
        assert run is not None and run.status in ("cancelled", "failed")
        assert run.stages["render-thumbnail"].status != "completed"
