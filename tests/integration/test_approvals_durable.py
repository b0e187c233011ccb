"""Approval gates survive the engine: a run waits at its gate while the engine that dispatched
its work stops, and another engine on the same store takes the decision or fires the timeout.

Run on the embedded default (SQLite store and queue) and on Redis with BullMQ.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.services import ensure_redis, redis_url

from accord.adapters import open_engine
from accord.adapters.clock import SystemClock
from accord.engine.machine.events import ApprovalDecided, RunStarted
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.testing.plans import pin
from accord.testing.workers import run_noop_worker
from accord.workflow.plan import (
    ApprovalStage,
    Approvers,
    Binding,
    Plan,
    RetryPolicy,
    TaskStage,
    Timeouts,
)

QUEUE = "gate.work"


def _plan(timeout_ms: int) -> Plan:
    work = TaskStage(
        name="work",
        type="worker",
        capability=pin("test.work"),
        input={"modelId": Binding(source="context", path=("modelId",), raw="${context.modelId}")},
        on_success="review",
        on_failure="failed",
        retry=RetryPolicy(max_attempts=1),
        timeouts=Timeouts(queue_deadline_ms=60_000, execution_deadline_ms=60_000),
        queue=QUEUE,
    )
    gate = ApprovalStage(
        name="review",
        approvers=Approvers(),
        options=("approve", "reject"),
        on_approve="completed",
        on_reject="failed",
        timeout_ms=timeout_ms,
        on_timeout="failed",
    )
    return Plan.create(
        name=f"durable-gate-{timeout_ms}", version="1", entry="work", stages=(work, gate)
    )


def _embedded(tmp: Path) -> Callable[[str], Engine]:
    url = f"sqlite:///{tmp / 'gates.db'}"
    return lambda owner: open_engine(url, url, SystemClock(), EngineOptions(owner, poll_ms=10))


def _redis(tmp: Path) -> Callable[[str], Engine]:
    ensure_redis()
    store = redis_url(f"gt{uuid.uuid4().hex[:10]}")
    transport = f"bullmq://127.0.0.1:6379/15?prefix=gq{uuid.uuid4().hex[:10]}"
    return lambda owner: open_engine(
        store, transport, SystemClock(), EngineOptions(owner, poll_ms=10)
    )


OPENERS = {"embedded": _embedded, "redis-bullmq": _redis}


async def _status(engine: Engine, run_id: str, stage: str, want: str) -> None:
    async with asyncio.timeout(30):
        while True:
            run = await engine.load(run_id)
            assert run is not None
            if run.stages[stage].status == want or run.status == want:
                return
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("stack", sorted(OPENERS))
async def test_a_gate_waits_across_engines_then_is_approved_rejected_or_times_out(
    stack: str, tmp_path: Path
) -> None:
    opener = OPENERS[stack](tmp_path)
    long, short = _plan(600_000), _plan(1_500)
    first = opener("engine-a")
    stop = asyncio.Event()
    worker = asyncio.get_running_loop().create_task(
        run_noop_worker(first.transport, [QUEUE], stop=stop)
    )
    runs = {"approved": long, "rejected": long, "timed-out": short}
    try:
        for p in (long, short):
            await first.register_plan(p)
        await first.start()
        for run_id, p in runs.items():
            await first.deliver(RunStarted(run_id=run_id, tenant="acme", workflow=p.name,
                                           plan_digest=p.digest, context={"modelId": "m-1"},
                                           requested_by="key:requester"))  # fmt: skip
        for run_id in runs:
            await _status(first, run_id, "review", "waiting")
    finally:
        stop.set()
        await asyncio.gather(worker, return_exceptions=True)
        await first.stop()  # every run is waiting at its gate; nothing runs them now

    second = opener("engine-b")
    try:
        await second.start()
        decide = {"by": "key:ann", "role": "operator", "tenants": ("acme",)}
        done = await second.deliver(ApprovalDecided(run_id="approved", stage="review",
                                                    decision="approve", **decide))  # fmt: skip
        assert all(h.accepted for h in done.history)
        own = await second.deliver(ApprovalDecided(run_id="rejected", stage="review",
                                                   decision="reject", by="key:requester",
                                                   role="admin", tenants=("acme",)))  # fmt: skip
        assert [h.reason for h in own.history] == ["forbidden"]
        await second.deliver(ApprovalDecided(run_id="rejected", stage="review",
                                             decision="reject", **decide))  # fmt: skip
        for run_id, status in (("approved", "completed"), ("rejected", "failed"),
                               ("timed-out", "failed")):  # fmt: skip
            await _status(second, run_id, "review", status)
            async with asyncio.timeout(30):
                while (run := await second.load(run_id)) is not None and not run.terminal:
                    await asyncio.sleep(0.02)
            assert run is not None and run.status == status, (run_id, run.status, run.error)
        timed = await second.load("timed-out")
        assert timed is not None and timed.error is not None
        assert timed.error["code"] == "approval-timeout"
        rejected = await second.load("rejected")
        assert rejected is not None and rejected.error is not None
        assert rejected.error["code"] == "approval-rejected"
    finally:
        await second.stop()
