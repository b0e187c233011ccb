"""A job's ``replyTo`` (envelope@2) is where the Python worker runtime sends every outcome of it,
on real brokers (BullMQ on Redis, RabbitMQ): jobs naming different queues are answered each on
its own (accepted, heartbeats, progress, the final outcome, and a recorded one sent again), never
in a batch with another queue's outcomes; a job without one, and a job whose replyTo breaks
envelope@2, are answered on the outcome queue. The jobs are published straight to the worker's
queue, as the engine would write them, and the outcome queues are read raw."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest
import redis

from accord.adapters import open_transport
from accord.canonical import canonical_json
from accord.contracts.catalog import Catalog
from accord.contracts.sources import load_catalog
from accord.engine.ports import Delivery, Transport
from accord.engine.runtime.intake import OUTCOMES_QUEUE
from accord.worker import Context, TerminalError, Worker
from accord.worker.runtime import Runtime

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tests/integration is no package: reach tests.services from the root
    sys.path.insert(0, str(ROOT))
from tests.services import REDIS_DB, ensure_rabbitmq, ensure_redis  # noqa: E402

pytestmark = pytest.mark.timeout(60)

AMQP = "amqp://guest:guest@127.0.0.1:5672/"
CAPABILITY = "thumbnail.render@3"
S1, S2 = "accord.outcomes.s1", "accord.outcomes.s3:owner-b"  # the owners of two shards
DIGEST = "sha256:" + "ab" * 32


def envelope(run_id: str, reply_to: str | None) -> dict[str, Any]:
    """A job of ``thumbnail.render@3`` as the engine writes one, with ``replyTo`` when given."""
    doc: dict[str, Any] = {
        "messageId": f"msg_{run_id}", "messageType": "thumbnail-generation-request",
        "contractVersion": 2, "correlationId": run_id, "causationId": None,
        "producer": "accord-engine", "tenant": "acme", "occurredAt": "2026-01-01T00:00:00.000Z",
        "runId": run_id, "stage": "render", "attempt": 1, "fence": "f1" * 16,
        "idempotencyKey": f"idem_{run_id}", "payload": {"modelId": run_id},
    }  # fmt: skip
    if reply_to is not None:
        doc["replyTo"] = reply_to
    return doc


def thumbnail(model_id: str) -> dict[str, Any]:
    preview = {"previewType": "gallery", "objectKey": f"thumbs/{model_id}.png", "width": 64,
               "height": 64, "contentType": "image/png", "sizeBytes": 10,
               "digest": DIGEST}  # fmt: skip
    return {"modelId": model_id, "previews": [preview]}


class Broker:
    """One broker kind under a fresh name space, and its clean-up."""

    def __init__(self, kind: str) -> None:
        self.kind, self.tag = kind, uuid.uuid4().hex[:10]
        self.opened: list[Transport] = []
        if kind == "bullmq":
            ensure_redis()
            self.url = f"bullmq://127.0.0.1:6379/{REDIS_DB}?prefix=rt-{self.tag}"
        else:
            ensure_rabbitmq()
            self.url = f"{AMQP}?prefix=rt{self.tag}."

    def open(self) -> Transport:
        transport = open_transport(self.url)
        self.opened.append(transport)
        return transport

    async def cleanup(self) -> None:
        for transport in self.opened:
            with contextlib.suppress(Exception):
                await transport.close()
        if self.kind == "bullmq":
            client = redis.Redis(port=6379, db=REDIS_DB)
            keys = list(client.scan_iter(match=f"rt-{self.tag}:*", count=1000))
            if keys:
                client.delete(*keys)
            client.close()
        else:
            names = {n for t in self.opened for n in getattr(t, "declared", ())}
            connection = await aio_pika.connect(AMQP)
            async with connection:
                channel = await connection.channel()
                for name in sorted(names):
                    await channel.queue_delete(name)


class Outcomes:
    """Reads outcome queues raw: every outcome that arrives on each, batches taken apart, with
    the size of the message that carried it."""

    def __init__(self, transport: Transport, queues: list[str]) -> None:
        self.transport = transport
        self.got: dict[str, list[tuple[dict[str, Any], int]]] = {q: [] for q in queues}
        self._tasks = [asyncio.get_running_loop().create_task(self._read(q)) for q in queues]

    async def _read(self, queue: str) -> None:
        async for delivery in self.transport.consume(queue, 16):
            doc = json.loads(delivery.body)
            members = doc["outcomes"] if doc["messageType"] == "batch" else [doc]
            self.got[queue] += [(m, len(members)) for m in members]
            await self.transport.ack(delivery)

    def kinds(self, queue: str) -> list[str]:
        return [doc["messageType"] for doc, _ in self.got[queue]]

    def runs(self, queue: str) -> set[str]:
        return {doc["runId"] for doc, _ in self.got[queue]}

    async def wait(self, queue: str, kind: str, count: int = 1, timeout_s: float = 20) -> None:
        async with asyncio.timeout(timeout_s):
            while self.kinds(queue).count(kind) < count:
                await asyncio.sleep(0.02)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def serving(runtime: Runtime) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(runtime.run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(ROOT / "schemas" / "contracts")


@pytest.mark.parametrize("kind", ["bullmq", "rabbitmq"])
async def test_each_job_is_answered_on_its_own_reply_queue(kind: str, catalog: Catalog) -> None:
    broker = Broker(kind)
    queue = f"rendering{broker.tag}"

    async def handler(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        ctx.progress(50, "half way")
        await asyncio.sleep(0.3)  # several heartbeat periods: heartbeats go out meanwhile
        if payload["modelId"] == "run-s2":
            raise TerminalError("not a mesh", "unsupported-format")
        return thumbnail(payload["modelId"])

    worker = Worker("reply-to")
    worker.bind(CAPABILITY, handler, queue=queue)
    jobs = {
        "run-s1": envelope("run-s1", S1),
        "run-s2": envelope("run-s2", S2),
        "run-none": envelope("run-none", None),
        "run-bad": envelope("run-bad", "not a queue name"),  # breaks envelope@2's pattern
    }
    engine_side = broker.open()
    outcomes = Outcomes(engine_side, [OUTCOMES_QUEUE, S1, S2])
    runtime = Runtime(worker, broker.open(), catalog=catalog, heartbeat_ms=50, slots=4)
    try:
        async with serving(runtime):
            for doc in jobs.values():  # all at once: their answers are ready at the same time
                await engine_side.publish(queue, doc["messageId"], canonical_json(doc))
            await outcomes.wait(S1, "succeeded")
            await outcomes.wait(S2, "failed")
            await outcomes.wait(OUTCOMES_QUEUE, "succeeded")
            await outcomes.wait(OUTCOMES_QUEUE, "failed")
            # a late copy of a finished job: answered again from the record, on its replyTo
            copy = Delivery(queue, "copy", canonical_json(jobs["run-s1"]), 2, "r-copy")
            await runtime.serve(copy, runtime.queues[queue])
            if kind == "rabbitmq":  # no broker dedup: the re-sent answer arrives again
                await outcomes.wait(S1, "succeeded", 2)
                await outcomes.wait(S1, "accepted", 2)
            await asyncio.sleep(0.3)  # anything sent astray would have arrived by now
        assert runtime.stats["reannounced"] == 1 and runtime.stats["handler_runs"] == 3
        # each reply queue holds only its own job's outcomes, every kind of them
        assert outcomes.runs(S1) == {"run-s1"}
        assert outcomes.runs(S2) == {"run-s2"}
        assert outcomes.runs(OUTCOMES_QUEUE) == {"run-none", "run-bad"}
        for reply, final in ((S1, "succeeded"), (S2, "failed")):
            kinds = outcomes.kinds(reply)
            assert {"accepted", "progress", "heartbeat", final} <= set(kinds), (reply, kinds)
            assert kinds.index("accepted") < kinds.index("progress") < kinds.index(final)
        s2_failed = next(d for d, _ in outcomes.got[S2] if d["messageType"] == "failed")
        assert s2_failed["payload"]["code"] == "unsupported-format"
        # the job without replyTo: all its outcomes on the outcome queue
        none = [
            d["messageType"] for d, _ in outcomes.got[OUTCOMES_QUEUE] if d["runId"] == "run-none"
        ]
        assert {"accepted", "progress", "heartbeat", "succeeded"} <= set(none), none
        # a replyTo that breaks envelope@2 is refused, by field, and answered on the shared queue
        bad = [d for d, _ in outcomes.got[OUTCOMES_QUEUE] if d["runId"] == "run-bad"]
        assert [d["messageType"] for d in bad] == ["accepted", "failed"]
        assert bad[1]["payload"]["code"] == "invalid-envelope"
        assert bad[1]["payload"]["message"].startswith("replyTo: ")
        if kind == "rabbitmq":
            assert outcomes.kinds(S1).count("succeeded") == 2
    finally:
        await outcomes.close()
        await broker.cleanup()
