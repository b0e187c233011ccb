"""A job whose attempt the engine superseded is never run by a worker.

A one-stage plan whose queue deadline passes before any worker runs: the engine times attempt 1
out, fences it, requests its cancellation and dispatches attempt 2. Then a worker starts, and
its handler must run once, for attempt 2:

- over BullMQ (the real Redis) and the embedded queue (its table in the store's own SQLite file,
  where the withdrawal rides in the commit that fences the attempt), attempt 1's job is gone from
  the broker before the worker starts: withdrawn, not delivered;
- over RabbitMQ (the real broker), which cannot take a message back from the middle of a queue,
  the job is still delivered, and the worker, reading the run record in the engine's store,
  acknowledges it without running the handler.

And a job a worker already holds (taken, waiting for its only slot) whose cancellation request
arrives before it starts is acknowledged unanswered, never run; the broker keeps that job with
its consumer (withdrawing it does nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aio_pika
import pytest
import redis

from accord.adapters import open_store, open_transport
from accord.adapters.clock import SystemClock
from accord.adapters.transports.bullmq import BullmqTransport, job_id_for
from accord.canonical import canonical_json
from accord.engine.machine.effects import RequestCancellation
from accord.engine.machine.state import RunState
from accord.engine.ports import Commit, QueueAdmin, Store, Transport, Withdraw
from accord.engine.runtime.dispatcher import Dispatcher
from accord.engine.runtime.intake import OUTCOMES_QUEUE
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.engine.runtime.outbox import entry_for
from accord.testing.plans import pin
from accord.worker.runtime import Runtime
from accord.worker.sdk import Context, Worker
from accord.worker.superseded import store_current
from accord.workflow.plan import Binding, Plan, RetryPolicy, TaskStage, Timeouts

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # tests/integration is no package: reach tests.services from the root
    sys.path.insert(0, ROOT)
from tests.services import REDIS_DB, ensure_rabbitmq, ensure_redis  # noqa: E402

pytestmark = pytest.mark.timeout(60)

AMQP = "amqp://guest:guest@127.0.0.1:5672/"
QUEUE_DEADLINE_MS = 2_000  # attempt 1 waits this long for a worker that is not there
CAPABILITY = "test.work@1"


def one_stage(queue: str) -> Plan:
    stage = TaskStage(
        name="work", type="worker", capability=pin("test.work"),
        input={"n": Binding(source="context", path=("n",), raw="${context.n}")},
        on_success="completed", on_failure="failed",
        retry=RetryPolicy(max_attempts=2, initial_backoff_ms=50, max_backoff_ms=50),
        timeouts=Timeouts(queue_deadline_ms=QUEUE_DEADLINE_MS, execution_deadline_ms=30_000),
        queue=queue,
    )  # fmt: skip
    return Plan.create(name=f"superseded-{queue}", version="1.0.0", entry="work", stages=(stage,))


class Broker:
    """One transport kind under a fresh name space, and its clean-up."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind, self.tag = kind, uuid.uuid4().hex[:10]
        self.opened: list[Transport] = []
        if kind == "bullmq":
            ensure_redis()
            self.url = f"bullmq://127.0.0.1:6379/{REDIS_DB}?prefix=sup-{self.tag}&stalled_ms=300"
        elif kind == "rabbitmq":
            ensure_rabbitmq()
            self.url = f"{AMQP}?prefix=sup{self.tag}."
        else:  # the embedded queue in the store's own file: joint commits
            self.url = f"sqlite:///{tmp / 'accord.db'}"

    def store(self) -> Store:
        return open_store(self.url if self.kind == "embedded" else "memory://")

    def open(self, store: Store | None = None) -> Transport:
        if self.kind == "embedded":
            transport = open_transport("embedded://", store=store)
        else:
            transport = open_transport(self.url)
        self.opened.append(transport)
        return transport

    async def cleanup(self) -> None:
        if self.kind == "bullmq":
            client = redis.Redis(port=6379, db=REDIS_DB)
            keys = list(client.scan_iter(match=f"sup-{self.tag}:*", count=1000))
            if keys:
                client.delete(*keys)
            client.close()
        elif self.kind == "rabbitmq":
            names = {n for t in self.opened for n in getattr(t, "declared", ())}
            connection = await aio_pika.connect(AMQP)
            async with connection:
                channel = await connection.channel()
                for name in sorted(names):
                    await channel.queue_delete(name)


@contextlib.asynccontextmanager
async def serving(runtime: Runtime) -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(runtime.run(stop))
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)


async def until(check: Callable[[], Any], what: str, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        await asyncio.sleep(0.02)


async def record(store: Store, run_id: str) -> RunState:
    stored = await store.load(run_id)
    assert stored is not None
    return RunState.from_json(stored.state)


@pytest.mark.parametrize("kind", ["bullmq", "embedded", "rabbitmq"])
async def test_a_job_superseded_in_the_queue_is_never_run(kind: str, tmp_path: Path) -> None:
    broker = Broker(kind, tmp_path)
    store = broker.store()
    engine_side = broker.open(store)
    engine = Engine(store, engine_side, SystemClock(), options=EngineOptions(poll_ms=10))
    queue = f"work{broker.tag}"
    plan = one_stage(queue)
    calls: Counter[int] = Counter()

    async def handler(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        calls[ctx.attempt] += 1
        return {"n": payload["n"]}

    try:
        await engine.register_plan(plan)
        await engine.start()
        run_id = await engine.start_run(plan.name, {"n": 1}, tenant="acme")

        async def retried() -> bool:
            st = (await record(store, run_id)).stages["work"]
            return st.attempt == 2 and st.current is not None and st.current.status == "queued"

        await until(retried, "attempt 1 timed out in the queue and attempt 2 was dispatched")
        first, second = (await record(store, run_id)).stages["work"].attempts
        assert (first.status, second.status) == ("timed-out", "queued")
        if kind == "rabbitmq":
            assert not isinstance(engine_side, Withdraw)  # no taking back: the worker looks
        else:  # withdrawn from the broker: only attempt 2's job is waiting
            assert isinstance(engine_side, QueueAdmin)
            waiting = {w.message_id for w in await engine_side.waiting(queue)}
            assert waiting == {second.job_id}, waiting
        if kind == "bullmq":  # BullMQ's own wait list and job hash, read raw
            client = redis.Redis(port=6379, db=REDIS_DB)
            try:
                listed = {
                    i.decode() for i in client.lrange(f"sup-{broker.tag}:{queue}:wait", 0, -1)
                }
                assert listed == {job_id_for(second.job_id)}
                # the job is gone; a tombstone keeps its id known for the dedup window
                key = f"sup-{broker.tag}:{queue}:{job_id_for(first.job_id)}"
                assert list(client.hkeys(key)) == [b"withdrawn"]
                assert 0 < client.pttl(key) <= 600_000
            finally:
                client.close()
            assert engine.dispatcher.withdrawn == 1

        worker = Worker("superseded")
        worker.bind(CAPABILITY, handler, queue=queue)
        current = store_current(store) if kind == "rabbitmq" else None
        worker_side = broker.open(store) if kind == "embedded" else broker.open()
        runtime = Runtime(worker, worker_side, current=current, drain_s=5)
        async with serving(runtime):

            async def ended() -> bool:
                return (await record(store, run_id)).terminal

            await until(ended, "the run ended")
        run = await record(store, run_id)
        assert run.status == "completed", run.status
        assert calls == Counter({2: 1}), f"handler runs per attempt: {dict(calls)}"
        assert runtime.stats["handler_runs"] == 1
        # delivered and refused unrun where the broker could not take it back, never delivered
        # where it could
        assert runtime.stats["superseded"] == (1 if kind == "rabbitmq" else 0)
        history = await store.history(run_id)
        refused = [(h["reason"], h["event"].get("attempt")) for h in history if not h["accepted"]]
        assert refused == [], f"the superseded attempt reported nothing: {refused}"
    finally:
        await engine.stop()
        for transport in broker.opened:
            await transport.close()
        await store.close()
        await broker.cleanup()


def job(n: int, *, hold: bool = False) -> tuple[str, bytes]:
    envelope = {
        "messageId": f"msg_t{n}", "messageType": "work-request", "contractVersion": 1,
        "correlationId": f"run_t{n}", "causationId": None, "producer": "accord-engine",
        "tenant": "acme", "occurredAt": "2026-01-01T00:00:00.000Z", "runId": f"run_t{n}",
        "stage": "work", "attempt": 1, "fence": f"{n:032x}", "idempotencyKey": f"idem_t{n}",
        "payload": {"n": n, "hold": hold},
    }  # fmt: skip
    return str(envelope["messageId"]), canonical_json(envelope)


async def test_a_job_taken_whose_cancellation_comes_first_is_not_run(tmp_path: Path) -> None:
    broker = Broker("bullmq", tmp_path)
    worker_side, engine_side = broker.open(), broker.open()
    assert isinstance(engine_side, BullmqTransport)
    queue = f"work{broker.tag}"
    gate, holding = asyncio.Event(), asyncio.Event()
    calls: Counter[str] = Counter()

    async def handler(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        calls[ctx.run_id] += 1
        if payload["hold"]:
            holding.set()
            await gate.wait()
        return {"n": payload["n"]}

    worker = Worker("superseded")
    worker.bind(CAPABILITY, handler, queue=queue)
    runtime = Runtime(worker, worker_side, slots=1, drain_s=5)  # prefetch 2: job 2 is taken
    store = open_store("memory://")
    dispatcher = Dispatcher(store, engine_side, SystemClock(), None, None, owner="test")
    try:
        async with serving(runtime):
            await engine_side.publish(queue, *job(1, hold=True))
            await asyncio.wait_for(holding.wait(), 10)
            await engine_side.publish(queue, *job(2))

            async def taken() -> bool:  # job 2 is active: locked by the worker, waiting
                counts = await engine_side.queue(queue).getJobCounts("active", "wait")
                return int(counts["active"]) == 2

            await until(taken, "job 2 taken by the worker")
            cancel = RequestCancellation(
                job_id="msg_t2", queue=queue, stage="work", attempt=1, fence=f"{2:032x}"
            )
            entry = entry_for("run_t2", cancel, 0)
            assert entry is not None
            await dispatcher.dispatch([entry])  # as the engine hands it off
            assert dispatcher.withdrawn == 0  # a job a worker holds stays with it

            async def heard() -> bool:
                return ("work", f"{2:032x}") in runtime.cancelled

            await until(heard, "the cancellation request reached the worker")
            gate.set()  # job 1 ends; job 2 would take the slot

            async def settled() -> bool:
                counts = await engine_side.queue(queue).getJobCounts(
                    "active", "wait", "delayed", "completed"
                )
                return int(counts["completed"]) == 2 and not int(counts["active"])

            await until(settled, "both jobs settled")
        assert calls == Counter(run_t1=1), f"handler runs: {dict(calls)}"
        assert runtime.stats["superseded"] == 1 and runtime.stats["served"] == 1
        answered = await outcomes(engine_side)
        assert answered.get("run_t2") is None, answered  # no answer: the engine moved on
        assert answered["run_t1"] == ["accepted", "succeeded"]
    finally:
        for transport in broker.opened:
            await transport.close()
        await store.close()
        await broker.cleanup()


async def outcomes(transport: Transport) -> dict[str, list[str]]:
    """The outcome kinds per run on the outcomes queue (batches unpacked), all taken."""
    seen: dict[str, list[str]] = {}
    stream = transport.consume(OUTCOMES_QUEUE, 16)
    try:
        while True:
            try:
                delivery = await asyncio.wait_for(anext(stream), 1.0)
            except TimeoutError:
                return seen
            doc = json.loads(delivery.body)
            for member in doc["outcomes"] if doc["messageType"] == "batch" else [doc]:
                seen.setdefault(member["runId"], []).append(member["messageType"])
            await transport.ack(delivery)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


def test_the_worker_command_reads_the_run_record_in_its_store(tmp_path: Path) -> None:
    """``accord worker run --store``: a job whose attempt the run record shows superseded is
    acknowledged and not run; the current attempt's job runs once."""
    module = tmp_path / "tiny_worker.py"
    module.write_text(
        "from pathlib import Path\n"
        "from accord.worker import Worker\n"
        "worker = Worker('tiny')\n"
        "@worker.handler('cache.lookup@1', queue='tiny')\n"
        "async def lookup(payload, ctx):\n"
        f"    Path({str(tmp_path)!r}, f'ran-{{ctx.attempt}}').touch()\n"
        "    return {'hit': False, 'outcome': 'miss'}\n"
    )
    url = f"sqlite:///{tmp_path / 'q.db'}"
    env = os.environ | {"PYTHONPATH": str(tmp_path)}
    cmd = [str(Path(sys.executable).parent / "accord"), "worker", "run", "tiny_worker:worker",
           "--transport", url, "--store", url, "--state", str(tmp_path / "w")]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        asyncio.run(_superseded_then_current(url))
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    assert "stopped after 1 jobs" in out, out
    assert sorted(p.name for p in tmp_path.glob("ran-*")) == ["ran-2"]


async def _superseded_then_current(url: str) -> None:
    store, transport = open_store(url), open_transport(url)
    stage = {"attempt": 2, "fence": "f2" * 16,
             "attempts": [{"attempt": 1, "fence": "f1" * 16, "status": "timed-out"},
                          {"attempt": 2, "fence": "f2" * 16, "status": "queued"}]}  # fmt: skip
    await store.commit(Commit("r1", 0, {"status": "running", "stages": {"s": stage}}))
    for attempt in (1, 2):
        envelope = {"messageId": f"msg_{attempt}", "messageType": "cache-lookup-request",
                    "contractVersion": 1, "correlationId": "r1", "producer": "test",
                    "tenant": "acme", "occurredAt": "2026-01-01T00:00:00.000Z", "runId": "r1",
                    "stage": "s", "attempt": attempt, "fence": f"f{attempt}" * 16,
                    "payload": {"modelId": "m1"}}  # fmt: skip
        await transport.publish("tiny", f"msg_{attempt}", json.dumps(envelope).encode())
    answered: list[tuple[int, str]] = []
    async with asyncio.timeout(30):
        async for delivery in transport.consume(OUTCOMES_QUEUE, 4):
            doc = json.loads(delivery.body)
            for member in doc["outcomes"] if doc["messageType"] == "batch" else [doc]:
                answered.append((member["attempt"], member["messageType"]))
            await transport.ack(delivery)
            if (2, "succeeded") in answered:
                break
    assert {a for a, _ in answered} == {2}, answered  # attempt 1 never even accepted
    async with asyncio.timeout(10):  # and its job was taken and acknowledged, not left
        while [w.message_id for w in await transport.waiting("tiny")]:  # type: ignore[attr-defined]
            await asyncio.sleep(0.05)
    await transport.close()
    await store.close()
