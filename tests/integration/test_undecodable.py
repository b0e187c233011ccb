"""Deliveries nobody can read, on the real transports: nothing wedges on them.

A delivery that cannot be read is quarantined with its reason at once (on its first delivery)
and acknowledged: by the transport when it cannot even make a delivery of it (a BullMQ job whose
data is not accord's job data, a RabbitMQ message with no message id: a dead letter with the
reason), by its reader otherwise (intake or the worker runtime: a record on
``<queue>.quarantine``). Deeply nested JSON (100,000 levels) is refused before decoding, on
outcomes, jobs and control messages alike; the engine keeps serving runs behind 1,000 such
deliveries, and a worker still takes cancellations after a control message it cannot read.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aio_pika
import aiormq
import msgpack  # type: ignore[import-untyped]
import pytest
import redis
from aiormq.abc import ChannelFrame
from engine_shell_support import ACTIONS, worker_fleet
from hypothesis import given
from hypothesis import strategies as st
from pamqp.body import ContentBody
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from accord.adapters import open_engine, open_transport
from accord.adapters.clock import SystemClock
from accord.adapters.transports._base import TransportBase
from accord.adapters.transports.bullmq import BullmqTransport, job_id_for
from accord.adapters.transports.rabbitmq import RabbitmqTransport
from accord.engine.machine.events import Event
from accord.engine.machine.state import RunState
from accord.engine.ports import Delivery, Transport
from accord.engine.runtime.intake import OUTCOMES_QUEUE, Intake
from accord.engine.runtime.orchestrator import EngineOptions
from accord.engine.runtime.outbox import control_queue
from accord.engine.runtime.wire import (
    MAX_JSON_DEPTH,
    UndecodableJson,
    decode_json,
    read_quarantine,
)
from accord.testing.plans import model_ingest_shape
from accord.worker import Context, Worker
from accord.worker.runtime import Runtime

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # tests/integration is no package: reach tests.* from the root
    sys.path.insert(0, ROOT)
from tests.contract import test_transport as contract  # noqa: E402
from tests.services import REDIS_DB, ensure_rabbitmq, ensure_redis, held_open  # noqa: E402

DEEP = b"[" * 100_000 + b"]" * 100_000  # RecursionError for a decoder that does not bound depth
BODY_BOUND = 65_536  # what a quarantine or dead-letter record keeps of a body, at most
AMQP = "amqp://guest:guest@127.0.0.1:5672/"
OPTS = "visibility_ms=1000&max_deliveries=3&dedup_ms=60000&stalled_ms=300"


@pytest.fixture
def prefix() -> Any:
    ensure_redis()
    name = f"tu-{uuid.uuid4().hex[:10]}"
    yield name
    client = held_open(redis.Redis(port=6379, db=REDIS_DB))
    keys = list(client.scan_iter(match=f"{name}:*", count=1000))
    if keys:
        client.delete(*keys)


def bullmq_url(prefix: str, opts: str = OPTS) -> str:
    return f"bullmq://127.0.0.1:6379/{REDIS_DB}?prefix={prefix}&{opts}"


def url_of(kind: str, tmp_path: Path, prefix: str) -> str:
    if kind == "bullmq":
        return bullmq_url(prefix)
    if kind == "rabbitmq":
        ensure_rabbitmq()
        return f"{AMQP}?prefix={prefix}.&max_deliveries=3"
    if kind == "memory":
        return "memory://?visibility_ms=1000&poll_ms=5"
    return f"sqlite:///{tmp_path / 'queue.db'}?synchronous=NORMAL&visibility_ms=1000&poll_ms=5"


EVERY = ["memory", "embedded", "bullmq", "rabbitmq"]


@pytest.fixture
async def opener(tmp_path: Path) -> AsyncIterator[Callable[[str], Transport]]:
    opened: list[Transport] = []

    def make(url: str) -> Transport:
        handle = open_transport(url)
        opened.append(handle)
        return handle

    yield make
    for handle in opened:
        await handle.close()
    declared = sorted({n for h in opened if isinstance(h, RabbitmqTransport) for n in h.declared})
    if declared:
        connection = await aio_pika.connect(AMQP)
        async with connection:
            channel = await connection.channel()
            for name in declared:
                await channel.queue_delete(name)


async def drain(transport: Transport, queue: str) -> list[Delivery]:
    """Everything ``queue`` holds now, acknowledged."""
    out: list[Delivery] = []
    async with contract.consumer(transport, queue, prefetch=64) as stream:
        while True:
            try:
                async with asyncio.timeout(0.5):
                    delivery = await anext(stream)
            except TimeoutError:
                return out
            out.append(delivery)
            await transport.ack(delivery)


async def nobody(event: Event, *_: Any) -> bool | None:
    raise AssertionError(f"no event should reach the engine, got {event!r}")


# -- the BullMQ transport: job data it cannot read ---------------------------------------------


async def test_bullmq_jobs_whose_data_cannot_be_read_are_dead_lettered_at_once(
    prefix: str, opener: Callable[[str], Transport]
) -> None:
    transport = opener(bullmq_url(prefix))
    assert isinstance(transport, BullmqTransport)
    queue = transport.queue("q")
    # through the Python bullmq client, as another producer might add them
    await queue.add("x", {"message_id": "bad-b64", "body_b64": "%% not base64"}, {"jobId": "j1"})
    await queue.add("x", [1, 2, 3], {"jobId": "j-list"})
    await queue.add("x", {"message_id": "bad-body", "body": {"a": 1}}, {"jobId": "j3"})
    await queue.add("x", {"message_id": 7, "body": "x"}, {"jobId": "j-mid"})
    await queue.add("x", {"note": "no body at all"}, {"jobId": "j-empty"})
    # and with raw Redis commands: data no JSON decoder takes
    client = held_open(redis.Redis(port=6379, db=REDIS_DB))
    raw = {
        "raw-utf8": b"\xff\xfe{",
        "raw-msgpack": msgpack.packb({"body": b"\x00\xff"}),
        "raw-deep": DEEP,
        "raw-text": b"{not json",
    }
    for name, data in raw.items():
        await transport.publish("q", name, b"x")
        client.hset(f"{prefix}:q:{job_id_for(name)}", "data", data)
    await transport.publish("q", "fine", b"ok")
    async with contract.consumer(transport, prefetch=2) as stream:
        (got,) = await contract.take(stream)
        assert (got.message_id, got.body) == ("fine", b"ok")
        await transport.ack(got)
        assert await contract.nothing_within(stream, 0.5)
    counts = await queue.getJobCounts("active", "wait", "delayed", "failed")
    assert counts == {"active": 0, "wait": 0, "delayed": 0, "failed": 9}
    dead = await transport.dead_letter_details("q")
    ids = [d["message_id"] for d in dead]
    assert sorted(ids) == sorted(["bad-b64", "j-list", "bad-body", "j-mid", "j-empty", *raw])
    for record in dead:
        assert record["reason"].startswith("accord: job data"), record
        assert record["delivery_count"] == 1, record  # at once, not after retries
        assert len(record["body"]) <= BODY_BOUND
    by_id = {d["message_id"]: d for d in dead}
    assert "not UTF-8" in by_id["raw-utf8"]["reason"]
    assert by_id["raw-utf8"]["body"] == b"\xff\xfe{"  # the raw bytes, as they were
    assert "nested deeper" in by_id["raw-deep"]["reason"]
    assert by_id["raw-deep"]["body"] == DEEP[:BODY_BOUND]
    assert "base64" in by_id["bad-b64"]["reason"]


async def publish_without_id(channel: aiormq.abc.AbstractChannel, key: str, body: bytes) -> None:
    """A persistent message with no message id, as AMQP clients other than aiormq (which adds a
    random one to every publish) may send: written as raw frames."""
    frames: list[Basic.Publish | ContentHeader | ContentBody] = [
        Basic.Publish(exchange="", routing_key=key),
        ContentHeader(properties=Basic.Properties(delivery_mode=2), body_size=len(body)),
    ]
    frames += [ContentBody(body[i : i + 65_536]) for i in range(0, len(body), 65_536)]
    frame = ChannelFrame.marshall(channel_number=channel.number, frames=frames)
    await channel.write_queue.put(frame)  # type: ignore[attr-defined]


async def test_a_bullmq_job_with_options_nobody_can_read_is_still_delivered(
    prefix: str, opener: Callable[[str], Transport]
) -> None:
    """Its options are BullMQ's bookkeeping, not its message: read as absent."""
    transport = opener(bullmq_url(prefix))
    await transport.publish("q", "odd-opts", b"body")
    client = held_open(redis.Redis(port=6379, db=REDIS_DB))
    client.hset(f"{prefix}:q:{job_id_for('odd-opts')}", "opts", DEEP)
    async with contract.consumer(transport) as stream:
        (got,) = await contract.take(stream)
        assert (got.message_id, got.body, got.delivery_count) == ("odd-opts", b"body", 1)
        await transport.ack(got)
    assert isinstance(transport, BullmqTransport)
    counts = await transport.queue("q").getJobCounts("active", "wait", "failed")
    assert counts == {"active": 0, "wait": 0, "failed": 0}


# -- the RabbitMQ transport: a message the consumer cannot use -----------------------------------


async def test_rabbitmq_messages_without_an_id_or_unreadable_are_quarantined_at_once() -> None:
    ensure_rabbitmq()
    name = f"tu{uuid.uuid4().hex[:10]}."
    transport = open_transport(f"{AMQP}?prefix={name}&max_deliveries=3")
    assert isinstance(transport, RabbitmqTransport)
    connection = await aio_pika.connect(AMQP)
    try:
        broker_queue = await transport.declare(OUTCOMES_QUEUE)
        channel = await connection.channel()
        bare = await connection.channel(publisher_confirms=False)  # no confirm to account for
        underlay = await bare.get_underlay_channel()
        for body in (b"\xff\xfe not UTF-8", DEEP):  # no message id: nothing could name them
            await publish_without_id(underlay, broker_queue, body)
        for mid, body in (("utf", b"\xff\xfe"), ("deep", DEEP), ("text", b"{not json")):
            message = aio_pika.Message(body, message_id=mid)
            await channel.default_exchange.publish(message, broker_queue)
        intake = Intake(transport, nobody)
        stop, dead = asyncio.Event(), list[dict[str, Any]]()
        task = asyncio.get_running_loop().create_task(intake.run(stop.is_set))
        try:
            async with asyncio.timeout(10):
                while len(intake.quarantined) < 3 or len(dead) < 2:
                    await asyncio.sleep(0.05)
                    dead = await transport.dead_letter_details(OUTCOMES_QUEUE)
        finally:
            stop.set()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        reasons = {q["message_id"]: q["reason"] for q in intake.quarantined}
        assert set(reasons) == {"utf", "deep", "text"}
        assert "nested deeper" in reasons["deep"]
        assert [d["reason"] for d in dead] == ["accord: message has no message_id"] * 2
        assert [d["delivery_count"] for d in dead] == [1, 1]
        assert sorted(d["body"] for d in dead) == sorted([b"\xff\xfe not UTF-8", DEEP[:BODY_BOUND]])
        records = await drain(transport, f"{OUTCOMES_QUEUE}.quarantine")
        assert sorted(read_quarantine(r.body)["message_id"] for r in records) == sorted(reasons)
        assert await drain(transport, OUTCOMES_QUEUE) == []  # none left behind
    finally:
        await connection.close()
        await transport.close()
        cleanup = await aio_pika.connect(AMQP)
        async with cleanup:
            channel = await cleanup.channel()
            for declared in sorted(transport.declared):
                await channel.queue_delete(declared)


# -- deeply nested JSON: refused on the first delivery, at intake and at a worker ----------------


@pytest.mark.parametrize("kind", EVERY)
async def test_a_deeply_nested_outcome_is_quarantined_on_its_first_delivery(
    kind: str, tmp_path: Path, prefix: str, opener: Callable[[str], Transport]
) -> None:
    transport = opener(url_of(kind, tmp_path, prefix))
    await transport.publish(OUTCOMES_QUEUE, "deep-outcome", DEEP)
    intake = Intake(transport, nobody)
    async with contract.consumer(transport, OUTCOMES_QUEUE) as stream:
        (delivery,) = await contract.take(stream)
        assert delivery.delivery_count == 1
        assert await intake.process(delivery) == [None]
        assert await contract.nothing_within(stream, 1.5)  # acknowledged: never redelivered
    (record,) = intake.quarantined
    assert record["message_id"] == "deep-outcome"
    assert "nested deeper" in record["reason"]
    (kept,) = await drain(transport, f"{OUTCOMES_QUEUE}.quarantine")
    assert len(read_quarantine(kept.body)["body"]) <= BODY_BOUND
    assert await transport.dead_letters(OUTCOMES_QUEUE) == []


@pytest.mark.parametrize("kind", EVERY)
async def test_a_deeply_nested_job_is_quarantined_by_the_worker_on_its_first_delivery(
    kind: str, tmp_path: Path, prefix: str, opener: Callable[[str], Transport]
) -> None:
    transport = opener(url_of(kind, tmp_path, prefix))
    ran: list[str] = []

    async def handler(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        ran.append(ctx.run_id)
        return {}

    worker = Worker("deep")
    worker.bind("deep.job@1", handler, queue="jobs")
    await transport.publish("jobs", "deep-job", DEEP)
    runtime = Runtime(worker, transport, drain_s=1)
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(runtime.run(stop))
    try:
        async with asyncio.timeout(10):
            while runtime.stats["quarantined"] < 1:
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        await task
    (kept,) = await drain(transport, "jobs.quarantine")
    record = read_quarantine(kept.body)
    assert (record["message_id"], record["queue"]) == ("deep-job", "jobs")
    assert "nested deeper" in record["reason"]
    assert ran == []
    assert await drain(transport, "jobs") == []  # acknowledged on its first delivery
    assert await transport.dead_letters("jobs") == []


# -- the control path survives any body ---------------------------------------------------------


@pytest.mark.parametrize("kind", EVERY)
async def test_a_cancellation_is_taken_after_control_messages_nobody_can_read(
    kind: str, tmp_path: Path, prefix: str, opener: Callable[[str], Transport]
) -> None:
    transport = opener(url_of(kind, tmp_path, prefix))
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def slow(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        started.set()
        for _ in range(1000):
            if ctx.cancelled:
                cancelled.set()
                ctx.raise_if_cancelled()
            await asyncio.sleep(0.01)
        raise AssertionError("never cancelled")

    worker = Worker("slow")
    worker.bind("slow.job@1", slow, queue="jobs")
    job = {"runId": "run-1", "stage": "s", "attempt": 1, "fence": "f-1", "payload": {}}
    runtime = Runtime(worker, transport, drain_s=2)
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(runtime.run(stop))
    try:
        await transport.publish("jobs", "job-1", json.dumps(job).encode())
        await asyncio.wait_for(started.wait(), 10)
        control = control_queue("jobs")
        for n, body in enumerate((DEEP, b"\xff\xfe", b"[1, 2]", b'{"fence": {"x": 1}}')):
            await transport.publish(control, f"garbage-{n}", body)
        async with asyncio.timeout(10):
            while runtime.stats["quarantined"] < 4:
                await asyncio.sleep(0.02)
        request = {
            "kind": "request-cancellation", "jobId": "job-1", "queue": "jobs", "stage": "s",
            "attempt": 1, "fence": "f-1", "reason": "deadline",
        }  # fmt: skip
        await transport.publish(control, "cancel-1", json.dumps(request).encode())
        await asyncio.wait_for(cancelled.wait(), 10)
    finally:
        stop.set()
        await task
    records = [read_quarantine(d.body) for d in await drain(transport, f"{control}.quarantine")]
    reasons = {r["message_id"]: r["reason"] for r in records}
    assert sorted(reasons) == [f"garbage-{n}" for n in range(4)]
    assert "bytes exceed the limit" in reasons["garbage-0"]  # 100,000 deep: refused undecoded
    assert "not JSON" in reasons["garbage-1"]
    assert "not a valid cancellation-requested@1 message" in reasons["garbage-2"]
    assert "fence: Input should be a valid string" in reasons["garbage-3"]


# -- the engine keeps serving runs behind 1,000 undecodable outcomes -----------------------------


def garbage(n: int) -> tuple[str, bytes]:
    """The ``n``-th undecodable outcome: not UTF-8, not JSON, not an object, not an outcome, or
    (now and then) nested 100,000 levels deep."""
    kinds: list[bytes] = [
        b"\xff\xfe\x00 not UTF-8 %d" % n,
        b"{not json %d" % n,
        b"[%d]" % n,
        b'{"messageType": "succeeded", "n": %d}' % n,
    ]
    return f"garbage-{n}", DEEP if n % 100 == 0 else kinds[n % len(kinds)]


@pytest.mark.parametrize("kind", ["embedded", "bullmq"])
async def test_intake_serves_runs_behind_1000_undecodable_outcomes(
    kind: str, tmp_path: Path, prefix: str, opener: Callable[[str], Transport]
) -> None:
    url = url_of(kind, tmp_path, prefix)
    injector = opener(url)
    unreadable_jobs = 0
    if isinstance(injector, BullmqTransport):  # and jobs whose very data cannot be read
        outcomes = injector.queue(OUTCOMES_QUEUE)
        for n in range(100):
            data = {"message_id": f"bad-data-{n}", "body_b64": "%% not base64"}
            await outcomes.add("x", data, {"jobId": f"bad-data-{n}"})
        unreadable_jobs = 100
    for n in range(1000 - unreadable_jobs):
        await injector.publish(OUTCOMES_QUEUE, *garbage(n))
    plan = model_ingest_shape(name="behind-garbage")
    store_url = f"sqlite:///{tmp_path / 'store.db'}?synchronous=NORMAL"
    options = EngineOptions(poll_ms=10)
    engine = open_engine(store_url, url, SystemClock(), options=options, actions=ACTIONS)
    began = time.monotonic()
    try:
        await engine.register_plan(plan)
        await engine.start()
        runs = [await engine.start_run(plan.name, {"modelId": f"m{i}"}) for i in range(5)]
        async with worker_fleet(opener(url)):
            deadline = time.monotonic() + 25
            pending = set(runs)
            while pending and time.monotonic() < deadline:
                for rid in list(pending):
                    stored = await engine.store.load(rid)
                    if stored is not None and RunState.from_json(stored.state).terminal:
                        pending.discard(rid)
                await asyncio.sleep(0.05)
            assert not pending, f"{len(pending)} run(s) not terminal behind the garbage"
        for rid in runs:
            stored = await engine.store.load(rid)
            assert stored is not None
            assert RunState.from_json(stored.state).status == "completed"
        async with asyncio.timeout(10):
            while len(engine.intake.quarantined) < 1000 - unreadable_jobs:
                await asyncio.sleep(0.05)
        quarantined = {q["message_id"] for q in engine.intake.quarantined}
        assert quarantined == {garbage(n)[0] for n in range(1000 - unreadable_jobs)}
        assert isinstance(injector, TransportBase)
        dead = await injector.dead_letter_details(OUTCOMES_QUEUE)
        assert {d["message_id"] for d in dead} == {f"bad-data-{n}" for n in range(unreadable_jobs)}
    finally:
        await engine.stop()
    records = await drain(injector, f"{OUTCOMES_QUEUE}.quarantine")
    assert len({r.message_id for r in records}) == len(records) == 1000 - unreadable_jobs
    if isinstance(injector, BullmqTransport):
        counts = await injector.queue(OUTCOMES_QUEUE).getJobCounts("active", "wait", "delayed")
        assert counts == {"active": 0, "wait": 0, "delayed": 0}
    assert await drain(injector, OUTCOMES_QUEUE) == []  # none left behind
    assert time.monotonic() - began < 30


# -- the bounded decoder every reader uses --------------------------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
)


@given(_JSON, st.text(alphabet='[]{}"\\', max_size=40))
def test_decode_json_reads_what_json_reads_and_brackets_in_strings_do_not_count(
    value: Any, noise: str
) -> None:
    doc = [value, noise * 20]  # brackets and escapes inside a string are no nesting
    body = json.dumps(doc).encode()
    assert decode_json(body) == json.loads(body)


def test_decode_json_refuses_depth_past_its_bound_before_decoding() -> None:
    at_bound = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert decode_json(at_bound) is not None
    for body in (b"[" + at_bound + b"]", DEEP, b'{"a":' * 100_000 + b"1" + b"}" * 100_000):
        with pytest.raises(UndecodableJson, match="nested deeper than 256 levels"):
            decode_json(body)
    with pytest.raises(UndecodableJson, match="bytes exceed the limit of 10"):
        decode_json(b"[" + b" " * 20 + b"]", max_bytes=10)
    with pytest.raises(UndecodableJson, match="not JSON"):
        decode_json(b"\xff\xfe")
