"""What the engine's queue consumers share: outcome intake (:mod:`.intake`) and run requests
(:mod:`.requests`).

A consumer takes up to ``prefetch`` deliveries from its queue at once, so one delivery's commit
overlaps the next one's decoding (the engine's per-run locks keep one run's events in arrival
order). Each is processed inside the store hold (:mod:`.holding`): a retryable store error is
ridden out in place; anything else leaves the delivery unacknowledged and nacks it for a
redelivery. :meth:`QueueConsumer.wait_idle` returns once nothing taken is still in hand, which is
how a graceful stop (:meth:`QueueConsumer.stop`) lets the deliveries in hand finish. A delivery
a consumer cannot take is quarantined with its reason (:meth:`QueueConsumer.quarantine`), never
dropped.

**Lanes.** Besides its own queue, a consumer can take further queues (:meth:`open_lane`), each
consumed by a task of its own into the same :meth:`process`, counters and quarantine records;
:meth:`close_lane` stops taking a lane's deliveries and returns once those in hand are done.
The engine's outcome intake has a lane per shard it owns (:mod:`.shards`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from accord.contracts.model import MessageContract
from accord.engine.ports import Delivery, Transport
from accord.engine.runtime.holding import Hold
from accord.engine.runtime.wire import quarantine_message, quarantine_queue, quarantine_record
from accord.errors import OwnershipLost

__all__ = ["GiveBack", "QueueConsumer"]

log = logging.getLogger("accord.engine.runtime.consumer")

NACK_DELAY_MS = 100  # a delivery that failed comes back after this long


class GiveBack(Exception):
    """A delivery this process must not take (its run's shard has another owner now): given
    back unacknowledged, for the consumer that should take it."""


async def _close_stream(stream: object) -> None:
    """Close a transport's delivery stream: what it claimed but never handed out goes straight
    back to the queue instead of waiting out its visibility timeout."""
    closing = getattr(stream, "aclose", None)
    if closing is not None:
        with contextlib.suppress(Exception):
            await asyncio.shield(closing())


@dataclass(eq=False, slots=True)
class _Lane:
    """One further queue a consumer reads: its task, whether it is closing, and its
    deliveries in hand (``idle`` is set when there are none)."""

    queue: str
    task: asyncio.Task[None] | None = None
    closing: bool = False
    busy: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()

    def taken(self) -> None:
        self.busy += 1
        self.idle.clear()

    def done(self) -> None:
        self.busy -= 1
        if self.busy == 0:
            self.idle.set()


class QueueConsumer:
    """Consume one queue, ``process`` each delivery; subclasses say what a delivery is."""

    what = "delivery"  # how a delivery is named in the log
    prefetch = 64  # deliveries in hand at once

    def __init__(self, transport: Transport, queue: str, hold: Hold | None = None) -> None:
        self._transport, self.queue = transport, queue
        self._hold = hold or Hold()
        self._busy = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.contracts: Sequence[MessageContract] = ()  # whose sensitive fields records mask
        self.quarantined: list[dict[str, Any]] = []
        self._task: asyncio.Task[None] | None = None
        self._stop = False
        self._lanes: dict[str, _Lane] = {}  # further queues consumed (open_lane)

    async def process(self, delivery: Delivery) -> Any:
        raise NotImplementedError

    async def wait_idle(self) -> None:
        await self._idle.wait()

    def start(self) -> None:
        """Consume in a task of its own until :meth:`stop`."""
        if self._task is None:
            self._stop = False
            self._task = asyncio.get_running_loop().create_task(self.run(lambda: self._stop))

    async def stop(self) -> None:
        """Take nothing new, let the deliveries in hand finish, then stop consuming."""
        if self._task is None:
            return
        self._stop = True
        await self._idle.wait()
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None

    @property
    def lanes(self) -> list[str]:
        return sorted(self._lanes)

    def open_lane(self, queue: str) -> None:
        """Consume ``queue`` too, in a task of its own, until :meth:`close_lane`."""
        if queue in self._lanes:
            return
        lane = _Lane(queue)
        lane.task = asyncio.get_running_loop().create_task(self._consume_lane(lane))
        self._lanes[queue] = lane

    async def close_lane(self, queue: str) -> None:
        """Take nothing more from ``queue``; return once its deliveries in hand are done."""
        lane = self._lanes.pop(queue, None)
        if lane is None:
            return
        lane.closing = True
        await lane.idle.wait()
        if lane.task is not None:
            lane.task.cancel()
            await asyncio.gather(lane.task, return_exceptions=True)

    async def close_lanes(self) -> None:
        await asyncio.gather(*(self.close_lane(q) for q in list(self._lanes)))

    async def _consume_lane(self, lane: _Lane) -> None:
        slots = asyncio.Semaphore(self.prefetch)
        spawn = asyncio.get_running_loop().create_task
        while not lane.closing:
            stream = self._transport.consume(lane.queue, self.prefetch)
            try:
                async for delivery in stream:
                    if lane.closing:  # closing: give it straight back for the next reader
                        await self._transport.nack(delivery, 0)
                        return
                    await slots.acquire()
                    lane.taken()
                    self._busy += 1  # _guarded counts it off, so wait_idle waits for lanes too
                    self._idle.clear()
                    spawn(self._in_lane(delivery, slots, lane))
            except asyncio.CancelledError:
                raise
            except Exception:  # the broker away: consume again after a pause
                log.exception("consuming %s failed; trying again", lane.queue)
                await asyncio.sleep(NACK_DELAY_MS / 1000)
            finally:
                await _close_stream(stream)

    async def _in_lane(self, delivery: Delivery, slots: asyncio.Semaphore, lane: _Lane) -> None:
        try:
            await self._guarded(delivery, slots)
        finally:
            lane.done()

    async def quarantine(self, delivery: Delivery, reason: str) -> None:
        """Keep ``delivery`` on ``<queue>.quarantine`` with ``reason`` (the fields
        :attr:`contracts` mark sensitive masked), then acknowledge it."""
        reason = reason[:4096]
        record = quarantine_record(
            delivery.queue, delivery.message_id, reason, delivery.body, self.contracts
        )
        qid, text = quarantine_message(record)
        log.warning("quarantined %s %s: %s", self.what, delivery.message_id, reason)
        await self._transport.publish(quarantine_queue(self.queue), qid, text)
        self.quarantined.append(record)
        await self._transport.ack(delivery)

    async def run(self, stop: Callable[[], bool], prefetch: int | None = None) -> None:
        """Consume until ``stop()``, up to ``prefetch`` (default :attr:`prefetch`) at once."""
        limit = prefetch or self.prefetch
        slots = asyncio.Semaphore(limit)
        spawn = asyncio.get_running_loop().create_task
        stream = self._transport.consume(self.queue, limit)
        try:
            async for delivery in stream:
                await slots.acquire()
                self._busy += 1
                self._idle.clear()
                spawn(self._guarded(delivery, slots))
                if stop():
                    break
        finally:
            await _close_stream(stream)

    async def _guarded(self, delivery: Delivery, slots: asyncio.Semaphore) -> None:
        what = f"{self.what} %s"
        try:
            await self._hold.run(lambda: self.process(delivery), what, delivery.message_id)
        except (OwnershipLost, GiveBack) as exc:  # the shard's new owner takes it from its queue
            log.info(f"{what} given back: %s", delivery.message_id, exc)
            with contextlib.suppress(Exception):
                await self._transport.nack(delivery, NACK_DELAY_MS)
        except Exception:  # not acknowledged: the transport redelivers it
            log.exception(f"{what} not processed", delivery.message_id)
            with contextlib.suppress(Exception):
                await self._transport.nack(delivery, NACK_DELAY_MS)
        finally:
            slots.release()
            self._busy -= 1
            if self._busy == 0:
                self._idle.set()
