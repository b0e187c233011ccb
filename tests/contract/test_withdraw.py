"""The Withdraw contract, over every transport that offers it (see conftest.py).

The engine withdraws the job of an attempt it fenced: a job nobody holds (waiting, or delayed)
is taken back and never delivered; a job a consumer holds stays with it, and so does one already
settled or dead-lettered; an unknown id changes nothing. RabbitMQ cannot take a message back from
the middle of a queue, and says so by not offering the capability.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from accord.engine.ports import Delivery, Transport, Withdraw
from tests.contract.conftest import MAX_DELIVERIES, Timeline


def withdrawing(transport: Transport) -> Withdraw | None:
    """The transport as a :class:`Withdraw`; ``None`` for RabbitMQ, the one that cannot."""
    if isinstance(transport, Withdraw):
        return transport
    assert type(transport).__name__ == "RabbitmqTransport"
    return None


async def delivered_anyway(transport: Transport) -> None:
    """Where nothing can be withdrawn, a superseded job is still delivered (the worker's check
    before acceptance is what stops it, tests/integration/test_superseded_jobs.py)."""
    await transport.publish("jobs", "m1", b"one")
    stream = transport.consume("jobs", 1)
    try:
        (got,) = await take(stream)
        assert (got.message_id, got.body) == ("m1", b"one")
        await transport.ack(got)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


async def take(stream: AsyncIterator[Delivery], n: int = 1) -> list[Delivery]:
    async with asyncio.timeout(5):
        return [await anext(stream) for _ in range(n)]


async def nothing_from(stream: AsyncIterator[Delivery], timeline: Timeline) -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(stream), timeline.quiet_s)


async def test_a_waiting_or_delayed_job_is_withdrawn_and_never_delivered(
    transport: Transport, timeline: Timeline
) -> None:
    ops = withdrawing(transport)
    if ops is None:
        await delivered_anyway(transport)
        return
    await transport.publish("jobs", "m1", b"one")
    await transport.publish("jobs", "m2", b"two")
    await transport.publish("jobs", "m3", b"three", delay_ms=200)
    assert await ops.withdraw("jobs", "m1") is True
    assert await ops.withdraw("jobs", "m3") is True  # delayed: taken back before it is due
    assert await ops.withdraw("jobs", "m1") is False  # already gone
    assert await ops.withdraw("jobs", "unknown") is False
    assert await ops.withdraw("elsewhere", "m2") is False  # ids are per queue
    stream = transport.consume("jobs", 4)
    try:
        (got,) = await take(stream)
        assert (got.message_id, got.body) == ("m2", b"two")
        await transport.ack(got)
        await timeline.advance(300)  # past the delay: m3 is not coming either
        await nothing_from(stream, timeline)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    assert await transport.dead_letters("jobs") == []


async def test_a_withdrawn_id_published_again_is_never_run_twice(
    transport: Transport, timeline: Timeline
) -> None:
    """A late republish of a withdrawn job (an outbox entry handed over again) is dropped within
    the dedup window, as a republish of a settled job is: the queue tables keep the row settled,
    BullMQ a tombstone at the job's key."""
    ops = withdrawing(transport)
    if ops is None:
        await delivered_anyway(transport)
        return
    await transport.publish("jobs", "m1", b"one")
    assert await ops.withdraw("jobs", "m1") is True
    await transport.publish("jobs", "m1", b"one")
    await transport.publish("jobs", "m1", b"one")
    stream = transport.consume("jobs", 4)
    try:
        seen = []
        while True:
            try:
                got = await asyncio.wait_for(anext(stream), timeline.quiet_s)
            except TimeoutError:
                break
            seen.append(got.message_id)
            await transport.ack(got)
        assert seen == [], seen
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


async def test_a_held_settled_or_dead_job_is_left_alone(
    transport_opener: Callable[[], Transport], timeline: Timeline
) -> None:
    transport = transport_opener()
    ops = withdrawing(transport)
    if ops is None:
        await delivered_anyway(transport)
        return
    for n in range(3):
        await transport.publish("jobs", f"m{n}", f"body {n}".encode())
    stream = transport.consume("jobs", 3)
    try:
        held = {d.message_id: d for d in await take(stream, 3)}
        assert await ops.withdraw("jobs", "m0") is False  # a consumer holds it
        await transport.ack(held["m1"])
        assert await ops.withdraw("jobs", "m1") is False  # settled
        for _ in range(MAX_DELIVERIES - 1):  # m2 to its delivery limit: a dead letter
            await transport.nack(held.pop("m2"))
            (again,) = await take(stream)
            held["m2"] = again
        await transport.nack(held["m2"])
        assert [d.message_id for d in await transport.dead_letters("jobs")] == ["m2"]
        assert await ops.withdraw("jobs", "m2") is False
        assert [d.message_id for d in await transport.dead_letters("jobs")] == ["m2"]
        await transport.ack(held["m0"])  # the holder still settles it
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    other = transport_opener()
    assert await withdrawing(other).withdraw("jobs", "m0") is False
