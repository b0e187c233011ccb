"""Outcome batching: a worker's outcomes that are ready at once leave as one message.

Every broker message costs the broker a write (on a quorum queue, a Raft log entry), a confirm, a
delivery and an acknowledgement, and costs the worker and the engine their share of each. Under
load a worker often has several outcomes to send at the same moment (one job's ``succeeded``,
another's ``accepted``, a third's heartbeat). :class:`OutcomeBatcher` is a group commit for
them:

- a publish made while none is in flight goes out at once, alone and unchanged: one run at a time
  costs no extra latency, and the message is byte for byte what it would have been;
- publishes made while one is in flight wait for it, then leave together as one batch message
  (:func:`accord.engine.runtime.wire.encode_batch`), up to ``max_members`` outcomes and
  ``max_bytes`` of them; an outcome larger than ``max_bytes`` always goes alone;
- every caller returns only once the message carrying its outcome is confirmed by the transport
  (so a worker still publishes ``accepted`` and waits for it before its handler starts), and a
  publish that fails fails every outcome it carried, each caller getting the transport's error.

Outcomes go to the queue each publish names (a job's ``replyTo``: the queue of the engine that
owns the run's shard), else to the batcher's own queue. Each destination is batched apart: the
group commit above holds per queue, and outcomes for different queues never share a message (a
batch is read by whoever reads its queue, and every member must reach its own run's owner).

The engine takes a batch's members one by one, exactly as if each had come alone
(:mod:`accord.engine.runtime.intake`). A caller cancelled while its outcome waits drops it from the
next batch; one already sent stays sent (outcomes are idempotent at the engine).

Batching is left off on a queue that lives in a database the engine's store can share (a
:class:`~accord.engine.ports.JointQueue`, the embedded queue): there a message is a row written
in a group commit, not a broker round trip, and an outcome that comes alone is acknowledged by
the very commit of its event, which a batch would give up (the batch is acknowledged apart).
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from dataclasses import dataclass, field

from accord.engine.ports import JointQueue, Transport
from accord.engine.runtime.wire import encode_batch

__all__ = ["OutcomeBatcher", "batching_pays"]

MAX_MEMBERS = 32
MAX_BYTES = 256 * 1024


def batching_pays(transport: Transport) -> bool:
    """Whether outcomes sent over ``transport`` are worth batching (not on a joint queue)."""
    return not isinstance(transport, JointQueue)


Member = tuple[str, bytes, "asyncio.Future[None]"]  # message id, body, its caller's waiter


@dataclass(slots=True)
class _Group:
    members: list[Member] = field(default_factory=list)
    started: bool = False  # its send began (a task cancelled before it runs never does)


@dataclass(slots=True)
class _Lane:
    """The group commit of one destination queue."""

    queue: str
    waiting: deque[Member] = field(default_factory=deque)
    busy: bool = False  # a message to this queue is in flight


class OutcomeBatcher:
    """Group commit of outcome publishes, per destination queue (``queue`` unless a publish
    names another; see the module docstring); with ``batch`` false (by default, on a transport
    where :func:`batching_pays` is false) every outcome goes out alone at once."""

    def __init__(
        self,
        transport: Transport,
        queue: str,
        *,
        max_members: int = MAX_MEMBERS,
        max_bytes: int = MAX_BYTES,
        batch: bool | None = None,
    ) -> None:
        if max_members < 1 or max_bytes < 1:
            raise ValueError("max_members and max_bytes must be >= 1")
        self.transport, self.queue = transport, queue
        self.batch = batching_pays(transport) if batch is None else batch
        self.max_members, self.max_bytes = max_members, max_bytes
        # one lane per destination with outcomes waiting or in flight; an idle lane is dropped,
        # so replyTo queues seen once do not accumulate
        self._lanes: dict[str, _Lane] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.messages = 0  # messages confirmed
        self.outcomes = 0  # outcomes they carried

    async def publish(self, message_id: str, body: bytes, queue: str | None = None) -> None:
        """Send one outcome to ``queue`` (``None``: the batcher's own); returns once the message
        carrying it is confirmed."""
        target = queue or self.queue
        if not self.batch:
            await self.transport.publish(target, message_id, body)
            self.messages += 1
            self.outcomes += 1
            return
        lane = self._lanes.get(target)
        if lane is not None and lane.busy:  # wait for its send in flight, then go together
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            lane.waiting.append((message_id, body, waiter))
            await waiter
            return
        if lane is None:
            lane = self._lanes[target] = _Lane(target)
        lane.busy = True  # alone, now, in the caller's own task
        try:
            await self.transport.publish(target, message_id, body)
            self.messages += 1
            self.outcomes += 1
        finally:
            self._next(lane)

    def _next(self, lane: _Lane) -> None:
        """After a send to ``lane``'s queue: the outcomes that waited for it go next, as one
        message; a lane with nothing left is dropped."""
        group = self._take(lane)
        if not group.members:
            lane.busy = False
            if not lane.waiting and self._lanes.get(lane.queue) is lane:
                del self._lanes[lane.queue]
            return
        task = asyncio.get_running_loop().create_task(self._send(lane, group))
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._ended, lane, group))

    def _ended(self, lane: _Lane, group: _Group, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not group.started:  # cancelled before it ran: nobody sends these, nor what waits
            for _, _, waiter in group.members:
                waiter.cancel()
            self._next(lane)

    def _take(self, lane: _Lane) -> _Group:
        group, size = _Group(), 0
        while lane.waiting and len(group.members) < self.max_members:
            _, body, waiter = lane.waiting[0]
            if waiter.done():  # its caller was cancelled: nobody waits for it
                lane.waiting.popleft()
                continue
            if group.members and size + len(body) > self.max_bytes:
                break
            group.members.append(lane.waiting.popleft())
            size += len(body)
        return group

    async def _send(self, lane: _Lane, group: _Group) -> None:
        group.started = True
        members = group.members
        try:
            if len(members) == 1:
                message_id, body, _ = members[0]
            else:
                message_id, body = encode_batch([(m, b) for m, b, _ in members])
            await self.transport.publish(lane.queue, message_id, body)
        except BaseException as exc:
            for _, _, waiter in members:
                if waiter.done():
                    continue
                if isinstance(exc, asyncio.CancelledError):  # the loop is closing
                    waiter.cancel()
                else:
                    waiter.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            self.messages += 1
            self.outcomes += len(members)
            for _, _, waiter in members:
                if not waiter.done():
                    waiter.set_result(None)
        finally:
            self._next(lane)
