"""The RabbitMQ transport on the real broker: what is RabbitMQ's own (the shared Transport
contract runs over it in tests/contract).

Each test gets its own queue-name prefix and deletes every queue it declared. Here: connections
closed by the server (with deliveries held and with publishes in flight), a queue deleted under
its consumer, consumers crashing past the delivery limit, readers sharing one stream, the
transport's own framing of a publish, and duplicates (RabbitMQ does not deduplicate: a republish
is a second delivery carrying the same message id, which the engine's deterministic ids and
fencing make harmless).
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from aiormq.abc import ChannelFrame
from pamqp.body import ContentBody
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from accord.adapters import open_transport
from accord.adapters.transports.rabbitmq import RabbitmqTransport, publish_frames
from accord.errors import TransportError
from accord.testing.clock import FakeClock

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # tests/integration is no package: reach tests.* from the root
    sys.path.insert(0, ROOT)
from tests.contract import test_transport as contract  # noqa: E402
from tests.services import ensure_rabbitmq  # noqa: E402

BROKER = "amqp://guest:guest@127.0.0.1:5672/"
Opener = Callable[..., RabbitmqTransport]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def opener(clock: FakeClock) -> AsyncIterator[Opener]:
    ensure_rabbitmq()
    prefix = f"t{uuid.uuid4().hex[:10]}."
    opened: list[RabbitmqTransport] = []

    def make(opts: str = "max_deliveries=3", **kwargs: Any) -> RabbitmqTransport:
        handle = open_transport(f"{BROKER}?prefix={prefix}&{opts}", clock=clock, **kwargs)
        assert isinstance(handle, RabbitmqTransport)
        opened.append(handle)
        return handle

    yield make
    for handle in opened:
        await handle.close()
    connection = await aio_pika.connect(BROKER)
    async with connection:
        channel = await connection.channel()
        for name in sorted({n for h in opened for n in h.declared}):
            await channel.queue_delete(name)


async def test_a_republish_is_a_duplicate_delivery_with_the_same_message_id(
    opener: Opener,
) -> None:
    transport = opener()
    await transport.publish("q", "run-1/stage-2/attempt-1", b"job")
    await transport.publish("q", "run-1/stage-2/attempt-1", b"job")
    async with contract.consumer(transport, prefetch=2) as stream:
        first, second = await contract.take(stream, 2)
        assert first.message_id == second.message_id == "run-1/stage-2/attempt-1"
        assert first.receipt != second.receipt
        await transport.ack(first)
        await transport.ack(second)
        assert await contract.nothing_within(stream)


async def test_a_requeued_delivery_comes_back_with_a_higher_count(opener: Opener) -> None:
    transport = opener()
    await transport.publish("q", "m1", b"x")
    async with contract.consumer(transport) as stream:
        (first,) = await contract.take(stream)
        await transport.nack(first)
        (again,) = await contract.take(stream)
        assert (again.message_id, again.body, again.delivery_count) == ("m1", b"x", 2)
        await transport.nack(again, delay_ms=50)  # through the delay queue: the count carries over
        (third,) = await contract.take(stream)
        assert third.delivery_count == 3
        await transport.ack(third)


async def test_nacks_past_the_limit_quarantine_in_the_dead_letter_queue(
    opener: Opener, clock: FakeClock
) -> None:
    transport = opener()
    await transport.publish("q", "poison", b"bad")
    async with contract.consumer(transport) as stream:
        for attempt in (1, 2, 3):
            (got,) = await contract.take(stream)
            assert got.delivery_count == attempt
            await transport.nack(got)
        assert await contract.nothing_within(stream)
    for _ in range(2):  # reading the dead letters leaves them where they are
        (dead,) = await transport.dead_letter_details("q")
        assert (dead["message_id"], dead["body"], dead["delivery_count"]) == ("poison", b"bad", 3)
        assert "nacked" in dead["reason"] and dead["dead_at_ms"] == clock.now_ms()
    assert await transport.dead_letters("other") == []


async def test_consumers_crashing_past_the_limit_are_dead_lettered_by_the_broker(
    opener: Opener,
) -> None:
    await opener(delivery_limits={"q": 2}).publish("q", "crashy", b"x")
    for attempt in (1, 2):
        crashing = opener(delivery_limits={"q": 2})
        stream = crashing.consume("q")
        (got,) = await contract.take(stream)
        assert got.delivery_count == attempt
        await crashing.close()  # connection gone, unsettled: the broker requeues it
    survivor = opener(delivery_limits={"q": 2})
    async with contract.consumer(survivor) as stream:
        assert await contract.nothing_within(stream)
    (dead,) = await survivor.dead_letter_details("q")
    assert (dead["message_id"], dead["delivery_count"]) == ("crashy", 2)
    assert "lapsed" in dead["reason"] and dead["dead_at_ms"] > 0


def _close_from_the_server(connection_name: str) -> None:
    listing = subprocess.run(
        ["rabbitmqctl", "list_connections", "-q", "--no-table-headers", "pid", "client_properties"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    pids = [line.split("\t")[0] for line in listing.splitlines() if connection_name in line]
    assert len(pids) == 1, listing
    subprocess.run(
        ["rabbitmqctl", "close_connection", pids[0], "test: connection cut"],
        capture_output=True, check=True, timeout=60,
    )  # fmt: skip


async def test_a_lost_connection_redelivers_unacked_messages_after_reconnecting(
    opener: Opener,
) -> None:
    transport = opener()
    await transport.publish("q", "in-flight", b"x")
    async with contract.consumer(transport) as stream:
        (held,) = await contract.take(stream)
        await asyncio.to_thread(_close_from_the_server, transport.connection_name)
        async with asyncio.timeout(20):
            again = await anext(stream)  # the robust connection reconnects and resubscribes
        assert (again.message_id, again.delivery_count) == ("in-flight", 2)
        await transport.ack(held)  # its channel is gone: settles nothing, raises nothing
        await transport.ack(again)
        for _ in range(
            100
        ):  # publishing works again once the channel is back, as the outbox retries
            try:
                await transport.publish("q", "after", b"y")
                break
            except TransportError as exc:
                assert exc.retryable
                await asyncio.sleep(0.1)
        (after,) = await contract.take(stream)
        assert after.message_id == "after"
        await transport.ack(after)
        assert await contract.nothing_within(stream)


async def test_a_confirmed_publish_is_on_the_broker_when_publish_returns(opener: Opener) -> None:
    transport = opener()
    await transport.publish("q", "m1", b"x")
    connection = await aio_pika.connect(BROKER)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(f"{transport.prefix}q", passive=True)
        assert queue.declaration_result.message_count == 1


async def test_an_unroutable_publish_is_returned_and_raises(opener: Opener) -> None:
    transport = opener()
    await transport.publish("q", "m1", b"x")
    connection = await aio_pika.connect(BROKER)
    async with connection:  # the queue vanishes behind the transport's back
        await (await connection.channel()).queue_delete(f"{transport.prefix}q")
    with pytest.raises(TransportError, match="unroutable") as refused:
        await transport.publish("q", "m2", b"y")
    assert refused.value.retryable  # the outbox keeps the entry; the next try re-declares
    await transport.publish("q", "m2", b"y")
    async with contract.consumer(transport) as stream:
        (got,) = await contract.take(stream)
        assert got.message_id == "m2"
        await transport.ack(got)


async def test_an_unreachable_broker_is_a_retryable_error() -> None:
    transport = open_transport("amqp://guest:guest@127.0.0.1:1/")
    with pytest.raises(TransportError) as failed:
        await transport.publish("q", "m1", b"x")
    assert failed.value.retryable
    await transport.close()


async def test_delays_are_precise_to_well_under_a_second(opener: Opener) -> None:
    transport = opener()
    late: list[float] = []
    async with contract.consumer(transport) as stream:
        for n, delay_ms in enumerate((150, 300, 450)):
            started = time.perf_counter()
            await transport.publish("q", f"d{n}", b"x", delay_ms=delay_ms)
            (got,) = await contract.take(stream)
            late.append((time.perf_counter() - started) * 1000 - delay_ms)
            assert late[-1] >= -5
            await transport.ack(got)
    assert max(late) < 500, f"delivered {late} ms after the delay"


async def test_a_delivery_can_be_settled_after_its_stream_closed(opener: Opener) -> None:
    transport = opener()
    await transport.publish("q", "m1", b"x")
    await transport.publish("q", "m2", b"y")
    stream = transport.consume("q", prefetch=2)
    (held,) = await contract.take(stream)
    await stream.aclose()  # type: ignore[attr-defined]  # m2, buffered, goes back to the queue
    async with contract.consumer(transport) as again:
        (other,) = await contract.take(again)
        assert other.message_id == "m2"
        await transport.ack(other)
        await transport.nack(held)  # still leased on the closed stream's channel: requeued
        (back,) = await contract.take(again)
        assert (back.message_id, back.delivery_count) == ("m1", 2)
        await transport.ack(back)
        assert await contract.nothing_within(again)


async def test_a_consumer_whose_queue_was_deleted_consumes_again_once_it_is_back(
    opener: Opener,
) -> None:
    transport = opener()
    await transport.publish("q", "m1", b"x")
    async with contract.consumer(transport) as stream:
        (got,) = await contract.take(stream)
        await transport.ack(got)
        connection = await aio_pika.connect(BROKER)
        async with connection:  # the broker cancels the consumer
            await (await connection.channel()).queue_delete(f"{transport.prefix}q")
        for _ in range(100):  # the first publish is returned; the outbox tries again
            try:
                await transport.publish("q", "m2", b"y")
                break
            except TransportError as exc:
                assert exc.retryable
                await asyncio.sleep(0.1)
        (again,) = await contract.take(stream)
        assert (again.message_id, again.delivery_count) == ("m2", 1)
        await transport.ack(again)


async def test_readers_sharing_one_stream_each_get_deliveries(opener: Opener) -> None:
    transport = opener()
    ids = [f"m{n:02}" for n in range(24)]
    seen: list[str] = []
    async with contract.consumer(transport, prefetch=8) as stream:

        async def reader() -> None:  # eight of these wait on the stream at once
            for _ in range(3):
                delivery = await anext(stream)
                seen.append(delivery.message_id)
                await transport.ack(delivery)

        readers = asyncio.gather(*(reader() for _ in range(8)))
        for message_id in ids:
            await transport.publish("q", message_id, b"x")
        async with asyncio.timeout(10):
            await readers
        assert sorted(seen) == ids
        assert await contract.nothing_within(stream)


async def test_publishes_in_flight_when_the_connection_is_cut_are_confirmed_or_retryable(
    opener: Opener,
) -> None:
    transport = opener()
    await transport.publish("q", "first", b"x")  # connected and declared
    confirmed: set[str] = set()
    retried: list[str] = []

    async def publisher(n: int) -> None:  # publishes until one of its publishes meets the cut
        for i in itertools.count():
            message_id = f"p{n}-{i}"
            try:
                await transport.publish("q", message_id, b"x")
            except TransportError as exc:
                assert exc.retryable  # indeterminate: the outbox publishes it again
                retried.append(message_id)
                return
            confirmed.add(message_id)

    async with asyncio.timeout(30):  # none hangs past the confirm timeout
        publishing = asyncio.gather(*(publisher(n) for n in range(8)))
        await asyncio.sleep(0.05)
        await asyncio.to_thread(_close_from_the_server, transport.connection_name)
        await publishing
    assert len(retried) == 8
    for _ in range(100):  # until the robust connection is back
        try:
            await transport.publish("q", "after", b"y")
            break
        except TransportError as exc:
            assert exc.retryable
            await asyncio.sleep(0.1)
    async with contract.consumer(transport, prefetch=50) as stream:
        arrived: set[str] = set()
        async with asyncio.timeout(20):  # every confirmed publish is on the broker
            while not confirmed <= arrived:
                delivery = await anext(stream)
                arrived.add(delivery.message_id)
                await transport.ack(delivery)


@pytest.mark.parametrize(
    ("key", "message_id", "body"),
    [
        ("accord.outcomes", "run-1/render/attempt-1/succeeded", b'{"ok":true}'),
        ("t1.q.delay.250", "r\u00e9sum\u00e9/\u4e2d/1", bytes(range(256)) * 40),
        ("q", "m", b""),
    ],
)
def test_a_publish_framed_by_the_transport_is_what_the_client_would_send(
    key: str, message_id: str, body: bytes
) -> None:
    properties = Basic.Properties(message_id=message_id, delivery_mode=2)
    frames: list[Basic.Publish | ContentHeader | ContentBody] = [
        Basic.Publish(exchange="", routing_key=key, mandatory=True),
        ContentHeader(properties=properties, body_size=len(body)),
    ]
    frames += [ContentBody(body)] if body else []
    expected = ChannelFrame.marshall(channel_number=7, frames=frames).payload
    assert publish_frames(7, key, message_id, body) == expected
    assert publish_frames(7, "q" * 256, message_id, body) is None  # left to the client
