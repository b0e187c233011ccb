"""What every queue-table transport shares: options, the consume loop, prefetch and wake-ups.

A subclass stores messages and implements four steps: ``_publish``, ``_claim`` (lease up to
``n`` ready messages, incrementing their delivery count and dead-lettering any whose count would
pass the queue's limit), ``_ack`` and ``_nack``. Rules common to all of them:

- A message is *known* from its first publish until its dedup window after ack ends (or forever
  once dead-lettered); publishing a known ``message_id`` again does nothing.
- A delivery is leased for ``visibility_ms``; if neither acked nor nacked by then it is delivered
  again. ``delivery_count`` never passes the queue's limit: the delivery that would is
  dead-lettered instead, with a reason, and :meth:`dead_letters` lists it.
- ``receipt`` is fresh per delivery; an ack or nack with a superseded receipt does nothing.

``consume`` never holds more than ``prefetch`` unsettled deliveries (buffered ones count). It polls
with an adaptive sleep (short after work, doubling to ``poll_ms`` when idle) and is woken at once
by a publish or nack made in the same process on the same database, whatever transport instance
made it.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass

from accord.adapters._store_rules import int_option
from accord.adapters.clock import SystemClock
from accord.engine.ports import Clock, Delivery
from accord.errors import TransportError

__all__ = ["QueueOptions", "QueueTransport"]

POLL_MIN_MS = 1


@dataclass(frozen=True, slots=True)
class QueueOptions:
    visibility_ms: int = 30_000
    max_deliveries: int = 5
    delivery_limits: Mapping[str, int] | None = None  # per-queue overrides
    dedup_ms: int = 600_000  # how long an acked message id stays known
    poll_ms: int = 50  # longest idle sleep between polls

    def __post_init__(self) -> None:
        for name in ("visibility_ms", "max_deliveries", "poll_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"queue option {name} must be >= 1, got {getattr(self, name)}")
        if self.dedup_ms < 0:
            raise ValueError(f"queue option dedup_ms must be >= 0, got {self.dedup_ms}")

    @classmethod
    def from_query(
        cls, query: Iterable[tuple[str, str]], limits: Mapping[str, int] | None = None
    ) -> QueueOptions:
        """Options from URL query pairs (unknown names are the caller's to refuse)."""
        opts, d = dict(query), cls()
        return cls(
            visibility_ms=int_option(opts, "visibility_ms", d.visibility_ms),
            max_deliveries=int_option(opts, "max_deliveries", d.max_deliveries),
            delivery_limits=limits,
            dedup_ms=int_option(opts, "dedup_ms", d.dedup_ms),
            poll_ms=int_option(opts, "poll_ms", d.poll_ms),
        )

    def limit(self, queue: str) -> int:
        return (self.delivery_limits or {}).get(queue, self.max_deliveries)


class _Consumer:
    __slots__ = ("__weakref__", "held", "loop", "wake")

    def __init__(self) -> None:
        self.held: dict[str, int] = {}  # receipt -> lease end (clock ms)
        self.wake = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None  # set on the first wait

    def poke(self) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if self.loop is None or running is self.loop:
            self.wake.set()
        elif not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.wake.set)


# (database identity, queue) -> consumers in this process; weak so abandoned loops vanish
_CONSUMERS: dict[tuple[str, str], weakref.WeakSet[_Consumer]] = {}


class QueueTransport:
    """Base of the memory and embedded SQLite transports (see the module docstring)."""

    def __init__(self, clock: Clock | None, options: QueueOptions, wake_key: str) -> None:
        self.clock: Clock = clock or SystemClock()
        self.options = options
        self._wake_key = wake_key
        self._holders: dict[str, _Consumer] = {}
        self._mine: weakref.WeakSet[_Consumer] = weakref.WeakSet()
        self._closed = False

    async def _publish(self, queue: str, message_id: str, body: bytes, avail_at: int) -> None:
        raise NotImplementedError

    async def _claim(self, queue: str, n: int, now: int) -> list[Delivery]:
        raise NotImplementedError

    async def _ack(self, delivery: Delivery, now: int) -> None:
        raise NotImplementedError

    async def _nack(self, delivery: Delivery, now: int, delay_ms: int) -> None:
        raise NotImplementedError

    async def _unclaim(self, deliveries: list[Delivery]) -> None:
        """Undo a claim never handed out: ready at the head of the queue, count restored."""
        raise NotImplementedError

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("transport is closed", retryable=False)

    async def publish(self, queue: str, message_id: str, body: bytes, delay_ms: int = 0) -> None:
        self._check_open()
        if not queue or not message_id:
            raise TransportError("publish: queue and message_id must be non-empty", retryable=False)
        await self._publish(queue, message_id, bytes(body), self.clock.now_ms() + max(delay_ms, 0))
        self._wake(queue)

    async def ack(self, delivery: Delivery) -> None:
        self._check_open()
        await self._ack(delivery, self.clock.now_ms())
        self._release(delivery)

    async def nack(self, delivery: Delivery, delay_ms: int = 0) -> None:
        self._check_open()
        await self._nack(delivery, self.clock.now_ms(), max(delay_ms, 0))
        self._release(delivery)
        self._wake(delivery.queue)

    def consume(self, queue: str, prefetch: int = 1) -> AsyncIterator[Delivery]:
        if prefetch < 1:
            raise ValueError(f"consume({queue!r}): prefetch must be >= 1, got {prefetch}")
        return _Stream(self, queue, prefetch)

    def _release(self, delivery: Delivery) -> None:
        holder = self._holders.pop(delivery.receipt, None)
        if holder is not None:
            holder.held.pop(delivery.receipt, None)
            holder.poke()

    def _wake(self, queue: str) -> None:
        for consumer in list(_CONSUMERS.get((self._wake_key, queue), ())):
            consumer.poke()

    async def close(self) -> None:
        self._closed = True
        for consumer in list(self._mine):
            consumer.poke()


class _Stream:
    """The iterator ``consume`` returns. Not an async generator on purpose: cancelling a pending
    ``__anext__`` (a timeout around it, say) leaves the stream usable, and a claim interrupted
    that way is finished in the background and its deliveries handed out by the next call."""

    def __init__(self, transport: QueueTransport, queue: str, prefetch: int) -> None:
        self._t, self._queue, self._prefetch = transport, queue, prefetch
        self._me = _Consumer()
        self._key = (transport._wake_key, queue)
        self._buffer: deque[Delivery] = deque()
        self._claiming: asyncio.Future[list[Delivery]] | None = None
        self._idle_ms = POLL_MIN_MS
        self._closed = False
        _CONSUMERS.setdefault(self._key, weakref.WeakSet()).add(self._me)
        transport._mine.add(self._me)

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> Delivery:
        t, me = self._t, self._me
        while True:
            if self._buffer:
                return self._buffer.popleft()
            if self._closed or t._closed:
                await self.aclose()
                raise StopAsyncIteration
            if self._claiming is None:
                me.wake.clear()  # before the claim, so a publish racing it is not missed
                now = t.clock.now_ms()
                for receipt in [r for r, until in me.held.items() if until <= now]:
                    del me.held[receipt]
                    t._holders.pop(receipt, None)
                room = self._prefetch - len(me.held)
                if room > 0:
                    self._claiming = asyncio.ensure_future(t._claim(self._queue, room, now))
            if self._claiming is not None:
                batch = await self._finish_claim(self._claiming)
                if batch:
                    self._take(batch)
                    continue
            me.loop = me.loop or asyncio.get_running_loop()
            try:
                async with asyncio.timeout(self._idle_ms / 1000):
                    await me.wake.wait()
            except TimeoutError:
                self._idle_ms = min(self._idle_ms * 2, t.options.poll_ms)

    async def _finish_claim(self, claiming: asyncio.Future[list[Delivery]]) -> list[Delivery]:
        try:
            batch = await asyncio.shield(claiming)
        except asyncio.CancelledError:
            if claiming.done() and not claiming.cancelled() and claiming.exception() is None:
                self._claiming = None  # finished as we were cancelled: hand it out next time
                self._take(claiming.result())
            raise  # still running: the next call awaits the same claim
        except BaseException as exc:
            self._claiming = None  # failed: the next call claims afresh
            if self._t._closed and isinstance(exc, Exception):
                return []  # the transport closed under the claim: the stream just ends
            raise
        self._claiming = None
        return batch

    def _take(self, batch: list[Delivery]) -> None:
        self._idle_ms = POLL_MIN_MS
        until = self._t.clock.now_ms() + self._t.options.visibility_ms
        for delivery in batch:
            self._me.held[delivery.receipt] = until
            self._t._holders[delivery.receipt] = self._me
        self._buffer.extend(batch)

    async def aclose(self) -> None:
        """Stop consuming. Deliveries already handed out stay leased until settled or lapsed;
        ones claimed but never handed out go straight back, as if never delivered."""
        if self._closed:
            return
        self._closed = True
        if self._claiming is not None:
            with contextlib.suppress(Exception):
                self._take(await self._claiming)
            self._claiming = None
        unsent, self._buffer = list(self._buffer), deque()
        for delivery in unsent:
            self._me.held.pop(delivery.receipt, None)
        for receipt in self._me.held:
            self._t._holders.pop(receipt, None)
        if unsent and not self._t._closed:
            await self._t._unclaim(unsent)
            self._t._wake(self._queue)
        consumers = _CONSUMERS.get(self._key)
        if consumers is not None:
            consumers.discard(self._me)
