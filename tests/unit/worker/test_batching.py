"""Outcome batching (accord.worker.batching): a group commit of outcome publishes.

The transport is the real in-memory queue; a gate held around its publish stands for a broker's
confirm that has not come back yet, which is when later outcomes gather into one batch.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.adapters import open_transport
from accord.adapters.transports._base import QueueOptions
from accord.adapters.transports.memory import MemoryTransport
from accord.engine.runtime.intake import encode_batch, parse_delivery, parse_outcome
from accord.errors import TransportError
from accord.worker.batching import OutcomeBatcher, batching_pays

Q = "accord.outcomes"


class Gated(MemoryTransport):
    """The in-memory queue, whose publishes wait for ``gate`` while it is clear (confirm pending)
    and fail with ``fail`` when it is set."""

    def __init__(self) -> None:
        super().__init__(None, QueueOptions(poll_ms=5))
        self.gate = asyncio.Event()
        self.gate.set()
        self.sent: list[tuple[str, bytes]] = []
        self.fail: Exception | None = None

    async def publish(self, queue: str, message_id: str, body: bytes, delay_ms: int = 0) -> None:
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        await super().publish(queue, message_id, body, delay_ms)
        self.sent.append((message_id, body))


def _outcome(i: int, size: int = 0) -> tuple[str, bytes]:
    doc = {
        "messageId": f"job-{i}:accepted",
        "messageType": "accepted",
        "runId": f"run_{i}",
        "stage": "render",
        "attempt": 1,
        "fence": "f" * 32,
        "payload": {"pad": "x" * size},
    }
    return str(doc["messageId"]), json.dumps(doc).encode()


def _carried(sent: list[tuple[str, bytes]]) -> list[list[str]]:
    """The outcome ids each sent message carried, in order."""
    out = []
    for _, body in sent:
        batch, members = parse_delivery(body)
        if not batch:
            out.append([parse_outcome(body)[0].message_id])
        else:
            out.append([doc["messageId"] for doc, _ in members])
    return out


Task = asyncio.Task[None]


async def _behind_one(
    t: Gated, batcher: OutcomeBatcher, outcomes: list[tuple[str, bytes]]
) -> tuple[Task, list[Task]]:
    """``job-0`` published with its confirm held back, then ``outcomes`` published behind it."""
    t.gate.clear()
    first = asyncio.create_task(batcher.publish(*_outcome(0)))
    await asyncio.sleep(0)
    later = [asyncio.create_task(batcher.publish(*o)) for o in outcomes]
    await asyncio.sleep(0)
    return first, later


async def _until(condition: Any) -> None:
    async with asyncio.timeout(2):
        while not condition():
            await asyncio.sleep(0)


async def test_an_outcome_alone_goes_out_unchanged() -> None:
    t = Gated()
    batcher = OutcomeBatcher(t, Q)
    mid, body = _outcome(1)
    await batcher.publish(mid, body)
    assert t.sent == [(mid, body)]
    assert (batcher.messages, batcher.outcomes) == (1, 1)
    await t.close()


async def test_outcomes_made_while_one_is_in_flight_leave_as_one_batch() -> None:
    t = Gated()
    batcher = OutcomeBatcher(t, Q)
    first, later = await _behind_one(t, batcher, [_outcome(i) for i in range(1, 6)])
    await asyncio.sleep(0.01)
    assert not any(task.done() for task in [first, *later])  # nobody returns before its confirm
    t.gate.set()
    await asyncio.gather(first, *later)
    assert _carried(t.sent) == [["job-0:accepted"], [f"job-{i}:accepted" for i in range(1, 6)]]
    assert (batcher.messages, batcher.outcomes) == (2, 6)
    batch_id = t.sent[1][0]
    assert batch_id == encode_batch([_outcome(i) for i in range(1, 6)])[0]
    assert batch_id.startswith("batch-") and ":" not in batch_id
    await t.close()


async def test_a_batch_is_bounded_by_members_and_bytes() -> None:
    t = Gated()
    batcher = OutcomeBatcher(t, Q, max_members=2, max_bytes=600)
    sizes = [0, 0, 0, 900, 0]  # the fourth is larger than max_bytes: it goes alone
    first, later = await _behind_one(t, batcher, [_outcome(i + 1, s) for i, s in enumerate(sizes)])
    t.gate.set()
    await asyncio.gather(first, *later)
    assert _carried(t.sent) == [
        ["job-0:accepted"],
        ["job-1:accepted", "job-2:accepted"],
        ["job-3:accepted"],
        ["job-4:accepted"],
        ["job-5:accepted"],
    ]
    await t.close()


async def test_a_failed_publish_fails_every_outcome_it_carried_and_the_next_goes_on() -> None:
    t = Gated()
    batcher = OutcomeBatcher(t, Q)
    first, later = await _behind_one(t, batcher, [_outcome(i) for i in (1, 2, 3)])
    t.fail = TransportError("no confirm", retryable=True)
    t.gate.set()
    results = await asyncio.gather(first, *later, return_exceptions=True)
    assert all(isinstance(r, TransportError) and r.retryable for r in results)
    t.fail = None
    await batcher.publish(*_outcome(9))
    assert _carried(t.sent) == [["job-9:accepted"]]
    await t.close()


async def test_a_cancelled_caller_drops_its_waiting_outcome() -> None:
    t = Gated()
    batcher = OutcomeBatcher(t, Q)
    first, (gone, kept) = await _behind_one(t, batcher, [_outcome(1), _outcome(2)])
    gone.cancel()
    t.gate.set()
    await asyncio.gather(first, kept)
    assert _carried(t.sent) == [["job-0:accepted"], ["job-2:accepted"]]
    await t.close()


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_members"):
        OutcomeBatcher(MemoryTransport(), Q, max_members=0)


@settings(max_examples=40, deadline=None)
@given(
    plan=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 300)), min_size=1, max_size=40
    ),  # (loop turns to wait before publishing, payload size)
    max_members=st.integers(1, 8),
    confirm_turns=st.integers(0, 3),
)
def test_every_outcome_leaves_exactly_once_in_the_order_it_was_published(
    plan: list[tuple[int, int]], max_members: int, confirm_turns: int
) -> None:
    async def scenario() -> None:
        class Slow(Gated):
            async def publish(
                self, queue: str, message_id: str, body: bytes, delay_ms: int = 0
            ) -> None:
                for _ in range(confirm_turns):
                    await asyncio.sleep(0)
                await super().publish(queue, message_id, body, delay_ms)

        t = Slow()
        batcher = OutcomeBatcher(t, Q, max_members=max_members, max_bytes=1500)
        started: list[str] = []

        async def one(i: int, turns: int, size: int) -> None:
            for _ in range(turns):
                await asyncio.sleep(0)
            mid, body = _outcome(i, size)
            started.append(mid)
            await batcher.publish(mid, body)
            # returning means the message carrying it is confirmed (sent)
            assert any(mid in ids for ids in _carried(t.sent))

        await asyncio.gather(*(one(i, turns, size) for i, (turns, size) in enumerate(plan)))
        carried = _carried(t.sent)
        assert [mid for ids in carried for mid in ids] == started  # once each, in order
        assert all(len(ids) <= max_members for ids in carried)
        assert batcher.outcomes == len(plan) and batcher.messages == len(carried)
        await t.close()

    asyncio.run(scenario())


async def test_a_queue_in_a_database_gets_every_outcome_alone(tmp_path: Path) -> None:
    """The embedded queue (a JointQueue): each outcome is a row, settled by its own commit."""
    embedded = open_transport(f"sqlite:///{tmp_path / 'q.db'}")
    assert not batching_pays(embedded) and batching_pays(MemoryTransport())
    batcher = OutcomeBatcher(embedded, Q)
    try:
        await asyncio.gather(*(batcher.publish(*_outcome(i)) for i in range(6)))
        assert (batcher.messages, batcher.outcomes) == (6, 6)
        got = []
        async for delivery in embedded.consume(Q, 10):
            got.append(delivery.message_id)
            await embedded.ack(delivery)
            if len(got) == 6:
                break
        assert sorted(got) == sorted(f"job-{i}:accepted" for i in range(6))
    finally:
        await embedded.close()


@pytest.mark.parametrize("turns", [0, 3])  # cancelled before its send began, or during it
async def test_a_batch_cancelled_cancels_its_callers(turns: int) -> None:
    t = Gated()
    batcher = OutcomeBatcher(t, Q)
    first, later = await _behind_one(t, batcher, [_outcome(1), _outcome(2)])
    first.cancel()  # the lone publish is cancelled: the waiting two go out as a batch
    await _until(lambda: len(batcher._tasks) == 1)
    for _ in range(turns):
        await asyncio.sleep(0)
    for task in list(batcher._tasks):
        task.cancel()  # ... and that batch is cancelled (the loop closing)
    results = await asyncio.gather(first, *later, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
    t.gate.set()
    await batcher.publish(*_outcome(9))  # the batcher is usable again
    assert _carried(t.sent) == [["job-9:accepted"]]
    await t.close()


class Routed(Gated):
    """The gated queue, also logging each publish's destination: ``entered`` as a publish
    reaches the transport (before the gate), ``routed`` once it is sent."""

    def __init__(self) -> None:
        super().__init__()
        self.entered: list[str] = []
        self.routed: list[tuple[str, bytes]] = []

    async def publish(self, queue: str, message_id: str, body: bytes, delay_ms: int = 0) -> None:
        self.entered.append(queue)
        await super().publish(queue, message_id, body, delay_ms)
        self.routed.append((queue, body))

    def carried(self, queue: str) -> list[list[str]]:
        return _carried([("", body) for q, body in self.routed if q == queue])


async def test_outcomes_for_different_queues_never_share_a_batch() -> None:
    """Each destination (a job's replyTo, else the batcher's queue) is its own group commit: an
    outcome for another queue does not wait behind this queue's send, nor join its batch."""
    t = Routed()
    batcher = OutcomeBatcher(t, Q)
    s1 = "accord.outcomes.s1"
    t.gate.clear()
    first = asyncio.create_task(batcher.publish(*_outcome(0)))
    other = asyncio.create_task(batcher.publish(*_outcome(1), s1))
    await _until(lambda: t.entered == [Q, s1])  # both in flight at once, neither behind the other
    later = [asyncio.create_task(batcher.publish(*_outcome(i))) for i in (2, 3)]
    later += [asyncio.create_task(batcher.publish(*_outcome(i), s1)) for i in (4, 5)]
    later += [asyncio.create_task(batcher.publish(*_outcome(6), Q))]  # Q named: the same lane
    await asyncio.sleep(0.01)
    assert not any(task.done() for task in [first, other, *later])
    t.gate.set()
    await asyncio.gather(first, other, *later)
    assert t.carried(Q) == [
        ["job-0:accepted"],
        ["job-2:accepted", "job-3:accepted", "job-6:accepted"],
    ]
    assert t.carried(s1) == [["job-1:accepted"], ["job-4:accepted", "job-5:accepted"]]
    assert {q for q, _ in t.routed} == {Q, s1}
    assert (batcher.messages, batcher.outcomes) == (4, 7)
    assert batcher._lanes == {}  # idle destinations are not kept
    await t.close()
