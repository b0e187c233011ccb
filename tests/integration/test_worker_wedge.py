"""A worker whose broker goes away while its handlers finish wedges nothing.

A worker runtime with one slot serves BullMQ on a private ``redis-server``. Its handler holds
the first job until the server has been killed (SIGKILL; the AOF keeps every acknowledged
write); a second job is already taken and waits for the slot. The server comes back after
:data:`OUTAGE_S`, shorter than the jobs' lock (``visibility_ms``), so locks the worker renews
outlive the outage: a job the worker neither acknowledged nor returned would stay ``active``
for as long as the worker lives, and two of them fill its prefetch so it takes no new work.

Twice over: with the broker back within ``answer_s`` (the answers are retried until confirmed),
and away for longer (the jobs go back to the queue and their redeliveries are answered, the
finished one from its acceptance record). Either way every job is answered, each handler ran
once, nothing is left waiting, active or delayed, no slot is lost, and a job published
afterwards is served by the single slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from accord.adapters import open_transport
from accord.adapters.transports._base import QueueOptions
from accord.adapters.transports.bullmq import BullmqTransport
from accord.adapters.transports.memory import MemoryTransport
from accord.canonical import canonical_json
from accord.engine.runtime.intake import OUTCOMES_QUEUE
from accord.errors import TransportError
from accord.worker.acceptance import AcceptanceLog
from accord.worker.runtime import Runtime
from accord.worker.sdk import Context, Worker

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # tests/integration is no package: reach tests.services from the root
    sys.path.insert(0, ROOT)
from tests.services import PrivateRedis  # noqa: E402

pytestmark = pytest.mark.timeout(90)

QUEUE = "wedge"
CAPABILITY = "test.wedge@1"
OUTAGE_S = 2.0
LOCK_MS = 10_000  # longer than the outage: the locks held survive it
FINAL = ("succeeded", "failed")


def job(n: int, *, hold: bool = False) -> tuple[str, bytes]:
    envelope = {
        "messageId": f"msg_w{n}", "messageType": "wedge-request", "contractVersion": 1,
        "correlationId": f"run_w{n}", "causationId": None, "producer": "accord-engine",
        "tenant": "acme", "occurredAt": "2026-01-01T00:00:00.000Z", "runId": f"run_w{n}",
        "stage": "work", "attempt": 1, "fence": f"{n:032x}", "idempotencyKey": f"idem_w{n}",
        "payload": {"n": n, "hold": hold},
    }  # fmt: skip
    return str(envelope["messageId"]), canonical_json(envelope)


class Outcomes:
    """What reached the outcomes queue, read as the engine reads it (batches one by one)."""

    def __init__(self, transport: BullmqTransport) -> None:
        self.transport = transport
        self.final: dict[str, str] = {}  # run id -> final outcome kind
        self.accepted: Counter[str] = Counter()

    async def read(self) -> None:
        while True:  # the stream retries on its own; a failing iterator is consumed again
            with contextlib.suppress(Exception):
                async for delivery in self.transport.consume(OUTCOMES_QUEUE, 16):
                    doc = json.loads(delivery.body)
                    for member in doc["outcomes"] if doc["messageType"] == "batch" else [doc]:
                        kind = member["messageType"]
                        if kind in FINAL:
                            self.final[member["runId"]] = kind
                        elif kind == "accepted":
                            self.accepted[member["runId"]] += 1
                    with contextlib.suppress(Exception):
                        await self.transport.ack(delivery)
            await asyncio.sleep(0.2)

    async def wait(self, runs: set[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not runs <= set(self.final) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        missing = sorted(runs - set(self.final))
        assert not missing, f"never answered: {missing} (answered {self.final})"


@contextlib.asynccontextmanager
async def task_of(coro: Any) -> AsyncIterator[asyncio.Task[Any]]:
    task = asyncio.get_running_loop().create_task(coro)
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def left_in(transport: BullmqTransport, queue: str) -> dict[str, int]:
    counts = await transport.queue(queue).getJobCounts(
        "wait", "active", "delayed", "paused", "prioritized"
    )
    return {state: int(n) for state, n in counts.items() if int(n)}


@pytest.mark.parametrize("answer_s", [30.0, 0.5], ids=["back-in-time", "away-too-long"])
async def test_a_broker_outage_while_handlers_finish_leaves_no_job_held(
    tmp_path: Path, answer_s: float
) -> None:
    server = PrivateRedis(tmp_path).start()
    url = (
        f"bullmq://127.0.0.1:{server.port}/0?prefix=wedge&visibility_ms={LOCK_MS}"
        "&stalled_ms=500&max_deliveries=20"
    )
    worker_side, engine_side = open_transport(url), open_transport(url)
    assert isinstance(engine_side, BullmqTransport)
    gate, holding = asyncio.Event(), asyncio.Event()
    runs: Counter[str] = Counter()

    async def handler(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        runs[ctx.run_id] += 1
        if payload["hold"]:
            holding.set()
            await gate.wait()
        return {"n": payload["n"]}

    worker = Worker("wedge")
    worker.bind(CAPABILITY, handler, queue=QUEUE)
    acceptance = AcceptanceLog(tmp_path / "acceptance.db")
    runtime = Runtime(
        worker, worker_side, acceptance=acceptance, slots=1, answer_s=answer_s,
        heartbeat_ms=60_000,
    )  # fmt: skip
    outcomes, stop = Outcomes(engine_side), asyncio.Event()
    try:
        async with task_of(runtime.run(stop)), task_of(outcomes.read()):
            await engine_side.publish(QUEUE, *job(1, hold=True))
            await asyncio.wait_for(holding.wait(), 10)
            for n in (2, 3):  # job 2 is taken at once (prefetch 2) and waits for the slot
                await engine_side.publish(QUEUE, *job(n))
            await asyncio.sleep(0.3)
            server.kill()
            gate.set()  # job 1 finishes with its broker gone; job 2 takes the slot
            await asyncio.sleep(OUTAGE_S)
            server.start()
            await outcomes.wait({"run_w1", "run_w2", "run_w3"}, timeout_s=40)
            await engine_side.publish(QUEUE, *job(4))  # the single slot still takes work
            await outcomes.wait({"run_w4"}, timeout_s=20)
            # every job is settled: nothing waiting, active or delayed on either queue
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                left = {q: await left_in(engine_side, q) for q in (QUEUE, OUTCOMES_QUEUE)}
                if not any(left.values()):
                    break
                await asyncio.sleep(0.1)
            assert not any(left.values()), f"jobs left held or waiting: {left}"
            assert await engine_side.dead_letters(QUEUE) == []
            stop.set()
        assert outcomes.final == dict.fromkeys(
            ("run_w1", "run_w2", "run_w3", "run_w4"), "succeeded"
        )
        assert runs == Counter(run_w1=1, run_w2=1, run_w3=1, run_w4=1)  # each handler ran once
        assert not runtime._tasks, "a job is still being served"
        # no slot lost: both semaphores are back to full
        assert runtime._slots._value == 1 and runtime._held._value == 2
        if answer_s < OUTAGE_S:  # jobs went back to the queue and were answered on redelivery
            assert runtime.stats["returned"] >= 1 and runtime.stats["reannounced"] >= 1
    finally:
        await worker_side.close()
        await engine_side.close()
        acceptance.close()
        server.kill()


class Outage(MemoryTransport):
    """A real in-memory queue whose outcome publishes fail while ``away`` is set."""

    def __init__(self) -> None:
        super().__init__(None, QueueOptions(visibility_ms=30_000, max_deliveries=100, poll_ms=5))
        self.away = True
        self.outcomes: list[dict[str, Any]] = []

    async def publish(self, queue: str, message_id: str, body: bytes, delay_ms: int = 0) -> None:
        if queue == OUTCOMES_QUEUE:
            if self.away:
                raise TransportError(f"publish to {queue!r} failed: broker away", retryable=True)
            doc = json.loads(body)
            self.outcomes += doc["outcomes"] if doc["messageType"] == "batch" else [doc]
        await super().publish(queue, message_id, body, delay_ms)


async def test_an_acceptance_never_confirmed_is_released_and_served_on_redelivery(
    tmp_path: Path,
) -> None:
    """``accepted`` cannot be published within ``answer_s``: the handler does not run, the claim
    is released and the job returned; once the broker answers, its redelivery runs the handler
    once, as a first delivery, and nothing is left held."""
    transport, runs = Outage(), Counter[str]()

    async def handler(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        runs[ctx.run_id] += 1
        return {"n": payload["n"]}

    worker = Worker("wedge")
    worker.bind(CAPABILITY, handler, queue=QUEUE)
    acceptance = AcceptanceLog(tmp_path / "acceptance.db")
    runtime = Runtime(worker, transport, acceptance=acceptance, slots=1, answer_s=0.2)
    stop = asyncio.Event()
    try:
        async with task_of(runtime.run(stop)):
            await transport.publish(QUEUE, *job(1))
            async with asyncio.timeout(10):
                while runtime.stats["returned"] < 2:  # tried, returned, redelivered, again
                    await asyncio.sleep(0.01)
            assert runs == Counter() and runtime.stats["handler_runs"] == 0
            transport.away = False
            async with asyncio.timeout(10):
                while not any(o["messageType"] == "succeeded" for o in transport.outcomes):
                    await asyncio.sleep(0.01)
            stop.set()
        assert runs == Counter(run_w1=1)
        assert [o["messageType"] for o in transport.outcomes] == ["accepted", "succeeded"]
        assert runtime.stats["reannounced"] == 0  # released: served as a first delivery
        assert runtime._slots._value == 1 and runtime._held._value == 2
        assert await transport.dead_letters(QUEUE) == []
    finally:
        acceptance.close()
        await transport.close()
