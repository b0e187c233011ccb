"""The Transport contract, run over every transport adapter (see conftest.py).

In-process transports keep leases on the fake clock; only the consumer's polling uses real time,
so "nothing arrives" is checked over a short real wait (many poll intervals) with the clock held
still, and lease boundaries are checked to the millisecond. The brokers keep leases on their
server's clock: :class:`~tests.contract.conftest.Timeline` sleeps through the same spans for
them, and a crashed consumer is a handle closed without settling.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest

from accord.engine.ports import Delivery, Transport
from accord.errors import TransportError
from tests.contract.conftest import MAX_DELIVERIES, VISIBILITY_MS, Timeline

QUIET_S = 0.08  # sixteen poll intervals


@contextlib.asynccontextmanager
async def consumer(
    transport: Transport, queue: str = "q", prefetch: int = 1
) -> AsyncIterator[AsyncIterator[Delivery]]:
    stream = transport.consume(queue, prefetch)
    try:
        yield stream
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


async def take(stream: AsyncIterator[Delivery], n: int = 1) -> list[Delivery]:
    async with asyncio.timeout(5):
        return [await anext(stream) for _ in range(n)]


async def nothing_within(stream: AsyncIterator[Delivery], quiet_s: float = QUIET_S) -> bool:
    try:
        async with asyncio.timeout(quiet_s):
            await anext(stream)
    except TimeoutError:
        return True
    return False


async def test_publish_consume_ack(transport: Transport, timeline: Timeline) -> None:
    await transport.publish("q", "m1", b"one")
    await transport.publish("other", "m2", b"two")
    async with consumer(transport) as stream:
        (got,) = await take(stream)
        assert (got.queue, got.message_id, got.body, got.delivery_count) == ("q", "m1", b"one", 1)
        await transport.ack(got)
        await timeline.advance(VISIBILITY_MS * 2)
        assert await nothing_within(stream, timeline.quiet_s)  # acked: never redelivered


async def test_deliveries_come_in_publish_order(transport: Transport) -> None:
    for n in range(5):
        await transport.publish("q", f"m{n}", str(n).encode())
    async with consumer(transport, prefetch=5) as stream:
        assert [d.message_id for d in await take(stream, 5)] == [f"m{n}" for n in range(5)]


async def test_republishing_a_known_message_is_harmless(
    transport: Transport, timeline: Timeline
) -> None:
    await transport.publish("q", "m1", b"first")
    await transport.publish("q", "m1", b"second")
    if not timeline.dedups:
        # no deduplication: the republish is a second delivery of the same message id, which
        # deterministic ids and the engine's fencing make harmless; nothing beyond the two
        async with consumer(transport, prefetch=2) as stream:
            both = await take(stream, 2)
            assert [(d.message_id, d.body) for d in both] == [("m1", b"first"), ("m1", b"second")]
            for delivery in both:
                await transport.ack(delivery)
            assert await nothing_within(stream, timeline.quiet_s)
        return
    async with consumer(transport) as stream:
        (got,) = await take(stream)
        assert got.body == b"first"
        await transport.publish("q", "m1", b"while-leased")
        await transport.ack(got)
        await transport.publish("q", "m1", b"after-ack")  # still known: inside the dedup window
        assert await nothing_within(stream, timeline.quiet_s)
        await timeline.advance(timeline.dedup_ms + 1)
        await transport.publish("q", "m1", b"much-later")  # forgotten: a new message
        (again,) = await take(stream)
        assert (again.body, again.delivery_count) == (b"much-later", 1)


async def test_an_unacked_delivery_returns_after_the_visibility_timeout(
    transport_opener: Callable[[], Transport], timeline: Timeline
) -> None:
    holder = transport_opener()
    await holder.publish("q", "m1", b"x")
    if timeline.real:  # the holder's consumer dies; another process gets the job back
        (first,) = await take(holder.consume("q", 2))
        await timeline.lapse(holder)
        holder = transport_opener()
        async with consumer(holder, prefetch=2) as stream:
            (second,) = await take(stream)
    else:  # the lease lapses exactly at the visibility timeout
        async with consumer(holder, prefetch=2) as stream:
            (first,) = await take(stream)
            timeline.clock.advance(VISIBILITY_MS - 1)
            assert await nothing_within(stream)
            timeline.clock.advance(1)
            (second,) = await take(stream)
    assert (second.message_id, second.delivery_count) == ("m1", 2)
    assert second.receipt != first.receipt
    await holder.ack(first)  # superseded receipt: does nothing
    await timeline.lapse(holder)
    holder = transport_opener() if timeline.real else holder
    async with consumer(holder) as stream:
        (third,) = await take(stream)
        assert third.delivery_count == 3
        await holder.ack(third)


async def test_nack_with_delay_redelivers_later(transport: Transport, timeline: Timeline) -> None:
    await transport.publish("q", "m1", b"x")
    async with consumer(transport) as stream:
        (got,) = await take(stream)
        await transport.nack(got, delay_ms=800)
        assert await nothing_within(stream, timeline.quiet_s)
        await timeline.advance(800)
        (again,) = await take(stream)
        assert again.delivery_count == 2


async def test_delayed_publish(transport: Transport, timeline: Timeline) -> None:
    await transport.publish("q", "m1", b"x", delay_ms=800)
    async with consumer(transport) as stream:
        assert await nothing_within(stream, timeline.quiet_s)
        await timeline.advance(800)
        assert [d.message_id for d in await take(stream)] == ["m1"]


async def test_nacks_past_the_limit_dead_letter(transport: Transport, timeline: Timeline) -> None:
    began_ms = timeline.now_ms()
    await transport.publish("q", "poison", b"bad")
    await transport.publish("q", "fine", b"ok", delay_ms=1)
    async with consumer(transport) as stream:
        for attempt in range(1, MAX_DELIVERIES + 1):
            (got,) = await take(stream)
            assert (got.message_id, got.delivery_count) == ("poison", attempt)
            await transport.nack(got)
        await timeline.advance(1)
        (other,) = await take(stream)
        assert other.message_id == "fine"
        await transport.ack(other)
        assert await nothing_within(stream, timeline.quiet_s)
    dead = await transport.dead_letters("q")
    assert [(d.message_id, d.body, d.delivery_count) for d in dead] == [
        ("poison", b"bad", MAX_DELIVERIES)
    ]
    details = await transport.dead_letter_details("q")  # type: ignore[attr-defined]
    assert "nacked" in details[0]["reason"]
    # stamped on the transport's clock when the last nack dead-lettered it
    assert began_ms <= details[0]["dead_at_ms"] <= timeline.now_ms() - 1
    await transport.publish("q", "poison", b"again")  # a dead letter stays known
    if timeline.dedups:
        assert [d.body for d in await transport.dead_letters("q")] == [b"bad"]
    assert await transport.dead_letters("other") == []


async def test_a_crash_loop_past_the_limit_dead_letters(
    transport_opener: Callable[[], Transport], timeline: Timeline
) -> None:
    holder = transport_opener()
    await holder.publish("q", "crashy", b"x")
    for attempt in range(1, MAX_DELIVERIES + 1):
        stream = holder.consume("q")
        (got,) = await take(stream)
        assert got.delivery_count == attempt
        await timeline.lapse(holder)  # the consumer "crashed": its lease lapses
        if timeline.real:
            holder = transport_opener()
        else:
            await stream.aclose()  # type: ignore[attr-defined]
    async with consumer(holder) as stream:
        assert await nothing_within(stream, timeline.quiet_s)
    (dead,) = await holder.dead_letter_details("q")  # type: ignore[attr-defined]
    assert dead["delivery_count"] == MAX_DELIVERIES and "lapsed" in dead["reason"]


async def test_prefetch_bounds_unsettled_deliveries(transport: Transport) -> None:
    for n in range(5):
        await transport.publish("q", f"m{n}", b"x")
    async with consumer(transport, prefetch=2) as stream:
        held = await take(stream, 2)
        assert await nothing_within(stream)
        await transport.ack(held[0])
        (third,) = await take(stream)
        assert third.message_id == "m2"


async def test_concurrent_consumers_share_without_duplicates(
    transport_opener: Callable[[], Transport],
) -> None:
    handles = [transport_opener(), transport_opener()]
    ids = [f"m{n:03}" for n in range(60)]
    for message_id in ids:
        await handles[0].publish("q", message_id, message_id.encode())
    seen: list[str] = []

    async def work(n: int) -> None:
        handle = handles[n % 2]
        async with consumer(handle, prefetch=3) as stream:
            while len(seen) < len(ids):
                try:
                    async with asyncio.timeout(0.2):
                        delivery = await anext(stream)
                except TimeoutError:
                    continue
                seen.append(delivery.message_id)
                await handle.ack(delivery)

    async with asyncio.timeout(10):
        await asyncio.gather(*(work(n) for n in range(4)))
    assert sorted(seen) == ids


async def test_bad_arguments_are_refused(transport: Transport) -> None:
    with pytest.raises(TransportError):
        await transport.publish("q", "", b"x")
    with pytest.raises(ValueError, match="prefetch"):
        transport.consume("q", prefetch=0)


async def test_closing_the_transport_ends_its_streams(transport: Transport) -> None:
    stream = transport.consume("q")
    waiter = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.02)
    await transport.close()
    with pytest.raises(StopAsyncIteration):
        async with asyncio.timeout(2):
            await waiter


async def test_a_stream_survives_cancelled_waits(transport: Transport) -> None:
    async with consumer(transport) as stream:
        for _ in range(5):
            waiter = asyncio.ensure_future(anext(stream))
            await asyncio.sleep(0.002)
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
        await transport.publish("q", "m1", b"x")
        (got,) = await take(stream)
        assert (got.message_id, got.delivery_count) == ("m1", 1)


async def test_closing_a_stream_returns_what_it_never_handed_out(transport: Transport) -> None:
    for n in range(4):
        await transport.publish("q", f"m{n}", b"x")
    async with consumer(transport, prefetch=4) as stream:
        (first,) = await take(stream)  # one claim leased all four; three are still buffered
    async with consumer(transport, prefetch=4) as stream:
        rest = await take(stream, 3)
    assert [(d.message_id, d.delivery_count) for d in rest] == [("m1", 1), ("m2", 1), ("m3", 1)]
    assert first.message_id == "m0"


async def test_any_body_is_delivered_as_published_and_settles(
    transport: Transport, timeline: Timeline
) -> None:
    """A transport never reads a body: bytes no reader could decode (not UTF-8, 100,000 levels
    of JSON nesting, empty, text that looks like a transport's own framing) arrive unchanged,
    each under its own message id, and are settled like any other, never left leased."""
    bodies = {
        "binary": b"\xff\xfe\x00\x80 not UTF-8",
        "deep": b"[" * 100_000 + b"]" * 100_000,
        "empty": b"",
        "framing": b'{"message_id": "other", "body_b64": "%% not base64"}',
    }
    for message_id, body in bodies.items():
        await transport.publish("q", message_id, body)
    async with consumer(transport, prefetch=4) as stream:
        got = await take(stream, len(bodies))
        assert {d.message_id: d.body for d in got} == bodies
        assert [d.delivery_count for d in got] == [1] * len(bodies)
        for delivery in got:
            await transport.ack(delivery)
        await timeline.advance(VISIBILITY_MS * 2)
        assert await nothing_within(stream, timeline.quiet_s)
    assert await transport.dead_letters("q") == []
