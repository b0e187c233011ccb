"""The whole loop, end to end: engine loops + in-process actions + a worker fleet over the
transport, on memory and on SQLite with the embedded queue. Every run must complete, the outbox
and queues must drain (I1, I7), and every history must replay to its record (I12)."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_shell_support import ACTIONS, assert_drained, wait_terminal, worker_fleet

from accord.adapters import open_store, open_transport
from accord.adapters.clock import SystemClock
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.testing.plans import model_ingest_shape


def _urls(kind: str, tmp_path: Path) -> tuple[str, str]:
    if kind == "memory":
        return "memory://", "memory://"
    url = f"sqlite:///{tmp_path / 'accord.db'}"
    return url, url


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_model_ingest_shape_runs_complete_and_drain(kind: str, tmp_path: Path) -> None:
    store_url, transport_url = _urls(kind, tmp_path)
    clock = SystemClock()
    store = open_store(store_url, clock=clock)
    transport = open_transport(transport_url, clock=clock)
    engine = Engine(
        store, transport, clock, options=EngineOptions(poll_ms=10), actions=ACTIONS, owns_ports=True
    )
    plan = model_ingest_shape(lookup_action=True, finaliser=True)
    await engine.register_plan(plan)
    await engine.start()
    try:
        async with worker_fleet(transport):
            runs = [
                await engine.start_run(plan.name, {"modelId": f"m{i}"}, tenant="acme")
                for i in range(12)
            ]
            await wait_terminal(store, runs)
        await engine.executor.wait_idle()
        finished = await assert_drained(engine, plan, runs)
        assert {r.status for r in finished} == {"completed"}
        assert all(r.stages["publish"].status == "completed" for r in finished)
        assert all(r.finalisers == ("completed",) for r in finished)
    finally:
        await engine.stop()


async def test_two_engine_processes_share_one_sqlite_store(tmp_path: Path) -> None:
    """Two engines (separate connections, as two processes have) compete for outcomes, timers
    and the outbox of one file; compare-and-set and leases keep every invariant."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    plan = model_ingest_shape(name="shared", lookup_action=True, finaliser=True)
    engines = [
        Engine(
            open_store(url),
            open_transport(url),
            SystemClock(),
            options=EngineOptions(poll_ms=10, owner=f"engine-{i}"),
            actions=ACTIONS,
            owns_ports=True,
        )
        for i in range(2)
    ]
    await engines[0].register_plan(plan)
    for engine in engines:
        await engine.start()
    try:
        async with worker_fleet(engines[0].transport):
            runs = [
                await engines[i % 2].start_run(plan.name, {"modelId": f"m{i}"}) for i in range(16)
            ]
            await wait_terminal(engines[1].store, runs)
        for engine in engines:
            await engine.executor.wait_idle()
        finished = await assert_drained(engines[0], plan, runs)
        assert {r.status for r in finished} == {"completed"}
        assert sum(e.transitions for e in engines) >= 16 * 11  # 11 accepted events per run
        assert all(e.transitions > 0 for e in engines)
    finally:
        for engine in engines:
            await engine.stop()


async def test_admission_uses_live_announcements() -> None:
    clock = SystemClock()
    engine = Engine(open_store("memory://", clock=clock), open_transport("memory://"), clock,
                    actions=ACTIONS, owns_ports=True)  # fmt: skip
    plan = model_ingest_shape(name="admitted", lookup_action=True, finaliser=True)
    try:
        missing = {d.code for d in await engine.admit(plan)}
        assert missing == {"admission-no-live-worker"}
        await engine.announce("w1", ["test.render@1", "test.analyse@1"], 60_000)
        await engine.announce("w2", ["test.metadata@1", "test.publish@1"], 60_000)
        assert await engine.admit(plan) == []
    finally:
        await engine.stop()
