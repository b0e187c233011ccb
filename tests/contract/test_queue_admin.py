"""The QueueAdmin contract, run over every transport adapter (see conftest.py).

What an operator does with what was refused: read a queue nobody consumes (a quarantine queue)
without taking anything from it, however often; remove messages from it by id; list dead
letters and put them back on their queue with a fresh delivery count, out of the dead letters
once and only once they are back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from accord.engine.ports import Delivery, QueueAdmin, Transport
from tests.contract.conftest import MAX_DELIVERIES, Timeline


def admin(transport: Transport) -> QueueAdmin:
    assert isinstance(transport, QueueAdmin), type(transport).__name__
    return transport


async def take(stream: AsyncIterator[Delivery], n: int = 1) -> list[Delivery]:
    async with asyncio.timeout(5):
        return [await anext(stream) for _ in range(n)]


async def test_reading_a_queue_takes_nothing_however_often(transport: Transport) -> None:
    await transport.publish("q.quarantine", "r1", b'{"reason":"one"}')
    await transport.publish("q.quarantine", "r2", b"\xff not even text")
    ops = admin(transport)
    for _ in range(MAX_DELIVERIES + 3):  # more looks than the delivery limit allows deliveries
        seen = await ops.waiting("q.quarantine")
        assert [(w.message_id, w.body) for w in seen] == [
            ("r1", b'{"reason":"one"}'),
            ("r2", b"\xff not even text"),
        ]
        assert all(w.delivery_count == 0 for w in seen)
    assert await ops.waiting("q.quarantine", limit=1) != []
    assert await ops.waiting("nothing-here") == []
    assert await ops.dead_letter_records("q.quarantine") == []  # looking dead-lettered nothing
    names = await ops.queue_names()
    assert names is None or "q.quarantine" in names
    stream = transport.consume("q.quarantine", 2)
    try:  # still there, never delivered before
        got = await take(stream, 2)
        assert sorted((d.message_id, d.delivery_count) for d in got) == [("r1", 1), ("r2", 1)]
        for delivery in got:
            await transport.ack(delivery)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


async def test_remove_takes_only_the_named_messages(transport: Transport) -> None:
    for n in range(3):
        await transport.publish("q.quarantine", f"r{n}", f"body {n}".encode())
    ops = admin(transport)
    assert await ops.remove("q.quarantine", ["r1", "unknown"]) == ["r1"]
    assert [w.message_id for w in await ops.waiting("q.quarantine")] == ["r0", "r2"]
    assert await ops.remove("q.quarantine", ["r1"]) == []  # already gone
    assert sorted(await ops.remove("q.quarantine", ["r0", "r2"])) == ["r0", "r2"]
    assert await ops.waiting("q.quarantine") == []
    assert await ops.remove("never-declared", ["x"]) == []


async def test_a_redriven_dead_letter_is_delivered_again_counted_afresh(
    transport: Transport, timeline: Timeline
) -> None:
    await transport.publish("q", "poison", b"bad")
    await transport.publish("q", "other", b"also bad")
    stream = transport.consume("q")
    try:
        for _ in range(2 * MAX_DELIVERIES):
            (got,) = await take(stream)
            await transport.nack(got)
        ops = admin(transport)
        dead = await ops.dead_letter_records("q")
        assert sorted((d.message_id, d.delivery_count) for d in dead) == [
            ("other", MAX_DELIVERIES),
            ("poison", MAX_DELIVERIES),
        ]
        assert all("nacked" in d.reason and d.dead_at_ms > 0 for d in dead)
        names = await ops.queue_names()
        assert names is None or "q" in names
        assert await ops.redrive_dead("q", ["poison", "unknown"]) == ["poison"]
        assert [d.message_id for d in await ops.dead_letter_records("q")] == ["other"]
        assert await ops.redrive_dead("q", ["poison"]) == []  # not a dead letter any more
        await timeline.advance(1)
        (again,) = await take(stream)
        assert (again.message_id, again.body, again.delivery_count) == ("poison", b"bad", 1)
        await transport.ack(again)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    assert [d.message_id for d in await admin(transport).dead_letter_records("q")] == ["other"]
    assert await admin(transport).dead_letter_records("never-declared") == []
