"""Intake while the store is unavailable: a delivery whose commit meets a retryable StoreError
is held and made again in place (for up to ``hold_ms``), not nacked, so a store outage does not
spend the delivery budget that poison messages are measured against; past ``hold_ms``, and at
once for an error that is not retryable, it is nacked as before. Memory store and transport,
with a store that refuses commits on demand."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from accord.adapters import open_transport
from accord.adapters.clock import SystemClock
from accord.adapters.stores.memory import MemoryStore
from accord.engine.ports import Commit, Delivery
from accord.engine.runtime.actions import ActionContext
from accord.engine.runtime.orchestrator import Engine
from accord.errors import StoreError
from accord.testing.plans import model_ingest_shape

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:  # tests/integration is no package: reach its helpers by path
    sys.path.insert(0, HERE)
from engine_shell_support import ACTIONS, assert_drained, wait_terminal, worker_fleet  # noqa: E402

from accord.engine.runtime.orchestrator import EngineOptions  # noqa: E402


class Unavailable(MemoryStore):
    """A memory store whose next ``failing`` commits raise ``StoreError(retryable=...)``."""

    failing = 0
    retryable = True
    refused = 0

    async def commit(self, commit: Commit) -> int:
        if self.failing:
            self.failing -= 1
            self.refused += 1
            raise StoreError("the store is unavailable", retryable=self.retryable)
        return await super().commit(commit)


PLAN = model_ingest_shape(name="held")


async def _engine(store: Unavailable) -> Engine:
    clock = SystemClock()
    transport = open_transport("memory://?max_deliveries=2", clock=clock)
    engine = Engine(
        store, transport, clock, options=EngineOptions(poll_ms=10, owner="engine"), actions=ACTIONS
    )
    await engine.register_plan(PLAN)
    await engine.start()
    return engine


async def _dead_letters_while_refused(engine: Engine, store: Unavailable) -> list[Delivery]:
    """Start a run, refuse every commit from then on, and wait (up to 4 s) for its outcomes to
    reach the outcome queue's dead letters; returns them."""
    await engine.start_run("held", {"modelId": "m"})
    store.failing = 10**6
    async with worker_fleet(engine.transport):
        for _ in range(200):
            if await engine.transport.dead_letters(engine.intake.queue):
                break
            await engine.clock.sleep(20)
    return await engine.transport.dead_letters(engine.intake.queue)


async def test_an_unavailable_store_holds_outcomes_instead_of_spending_their_deliveries() -> None:
    store = Unavailable(SystemClock())
    engine = await _engine(store)
    try:
        runs = [await engine.start_run("held", {"modelId": f"m{i}"}) for i in range(4)]
        store.failing = 12  # well past a delivery limit of 2, had each refusal been a nack
        async with worker_fleet(engine.transport):
            await wait_terminal(store, runs)
        await engine.executor.wait_idle()
        finished = await assert_drained(engine, PLAN, runs)
        assert {r.status for r in finished} == {"completed"}
        assert store.refused == 12 and engine.hold.held >= 1
        assert await engine.transport.dead_letters(engine.intake.queue) == []
    finally:
        await engine.stop()
        await engine.transport.close()


async def test_past_hold_ms_a_delivery_is_nacked_and_counted_as_before() -> None:
    store = Unavailable(SystemClock())
    engine = await _engine(store)
    engine.hold.hold_ms = 100
    try:
        dead = await _dead_letters_while_refused(engine, store)
        assert dead and dead[0].delivery_count == 2  # held, nacked, held again, dead-lettered
        assert engine.hold.held >= 2
    finally:
        store.failing = 0
        await engine.stop()
        await engine.transport.close()


async def test_an_error_that_is_not_retryable_is_nacked_at_once() -> None:
    store = Unavailable(SystemClock())
    store.retryable = False
    engine = await _engine(store)
    try:
        assert await _dead_letters_while_refused(engine, store)
        assert engine.hold.held == 0
    finally:
        store.failing = 0
        await engine.stop()
        await engine.transport.close()


async def test_an_action_whose_outcome_meets_an_outage_runs_once() -> None:
    """The action's outcome is committed again in place, so the outbox sweep (lease 300 ms here)
    never runs the action a second time merely because the store blinked."""
    store, clock = Unavailable(SystemClock()), SystemClock()
    calls: list[str] = []

    async def lookup(payload: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
        calls.append(ctx.run_id)
        store.failing = 3  # this action's own outcome meets the outage
        return {"hit": False}

    plan = model_ingest_shape(name="held-action", lookup_action=True)
    transport = open_transport("memory://", clock=clock)
    engine = Engine(
        store,
        transport,
        clock,
        options=EngineOptions(poll_ms=10, lease_ms=300, owner="engine"),
        actions={**ACTIONS, "test.lookup@1": lookup},
    )
    await engine.register_plan(plan)
    await engine.start()
    try:
        run = await engine.start_run(plan.name, {"modelId": "m"})
        async with worker_fleet(transport):
            await wait_terminal(store, [run])
            await asyncio.sleep(0.5)  # past the sweep's lease: a second run would show now
        await engine.executor.wait_idle()
        assert [r.status for r in await assert_drained(engine, plan, [run])] == ["completed"]
        assert calls == [run] and store.refused == 3 and engine.hold.held >= 1
    finally:
        await engine.stop()
        await transport.close()
