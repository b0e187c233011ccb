"""Shared pieces of the engine-loop tests: a running engine with in-process actions and a
no-op worker fleet, and the drain checks (I1) every test ends with."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from accord.engine.machine.replay import replay
from accord.engine.machine.state import HistoryEntry, RunState
from accord.engine.ports import Store, Transport
from accord.engine.runtime.actions import ActionContext
from accord.engine.runtime.orchestrator import Engine
from accord.testing.invariants import assert_i1_terminal, assert_run_invariants
from accord.testing.plans import QUEUES
from accord.testing.workers import run_noop_worker
from accord.workflow.plan import Plan


async def audit(payload: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
    return {"audited": ctx.run_id}


async def lookup(payload: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
    return {"hit": False, "modelId": payload.get("modelId")}


ACTIONS = {"test.audit@1": audit, "test.lookup@1": lookup}


@contextlib.asynccontextmanager
async def worker_fleet(transport: Transport, queues: Sequence[str] = QUEUES) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(run_noop_worker(transport, queues, stop=stop))
    try:
        yield
    finally:
        stop.set()
        await task


async def wait_terminal(store: Store, run_ids: Sequence[str], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    pending = set(run_ids)
    while pending and time.monotonic() < deadline:
        for rid in list(pending):
            stored = await store.load(rid)
            if stored is not None and RunState.from_json(stored.state).terminal:
                pending.discard(rid)
        await asyncio.sleep(0.02)
    assert not pending, f"I1: {len(pending)} run(s) not terminal within {timeout_s}s"


async def assert_drained(
    engine: Engine, plan: Plan, run_ids: Sequence[str], queues: Sequence[str] = QUEUES
) -> list[RunState]:
    """I1 after a drain: every run terminal, outbox empty, queues empty; and I12 per run."""
    await engine.dispatcher.flush()
    runs = []
    for rid in run_ids:
        stored = await engine.store.load(rid)
        assert stored is not None, f"I1: run {rid} lost"
        run = RunState.from_json(stored.state)
        history = [HistoryEntry.from_json(h) for h in await engine.store.history(rid)]
        assert_i1_terminal(run)
        assert replay(plan, history) == run
        assert_run_invariants(plan, run, history)
        runs.append(run)
    leftover = await engine.store.claim_outbox(1000, "drain-check", 0)
    assert leftover == [], f"I1/I7: outbox not empty after drain: {[e.topic for e in leftover]}"
    for queue in (*queues, engine.intake.queue):
        waiting = await _ready(engine.transport, queue)
        assert waiting == 0, f"I1: {waiting} message(s) left on {queue}"
    return runs


async def _ready(transport: Transport, queue: str) -> int:
    consumer = transport.consume(queue, 100)
    try:
        delivery = await asyncio.wait_for(anext(consumer), 0.05)
        await transport.nack(delivery)
        return 1
    except TimeoutError:
        return 0
    finally:
        await consumer.aclose()  # type: ignore[attr-defined]
