"""What the transports share: options, the checks before a publish, and (for the queue-table
transports) the consume loop, prefetch and wake-ups.

Every transport is a :class:`TransportBase`: once closed it refuses publishes (a non-retryable
:class:`~accord.errors.TransportError`), and a publish needs a queue and a message id; ``consume``
needs ``prefetch >= 1`` (:func:`check_prefetch`); ``dead_letters`` is ``dead_letter_details``
without the metadata. The broker transports read their URL options with :func:`broker_options`,
and their streams (BullMQ, RabbitMQ) are :class:`BrokerStream`: they start on the first read,
once however many readers wait.

A subclass stores messages and implements four steps: ``_publish``, ``_claim`` (lease up to
``n`` ready messages, incrementing their delivery count and dead-lettering any whose count would
pass the queue's limit), ``_ack`` and ``_nack``. Rules common to all of them:

- A message is *known* from its first publish until its dedup window after ack ends (or forever
  once dead-lettered); publishing a known ``message_id`` again does nothing.
- A delivery is leased for ``visibility_ms``; if neither acked nor nacked by then it is delivered
  again. ``delivery_count`` never passes the queue's limit: the delivery that would is
  dead-lettered instead, with a reason, and :meth:`dead_letters` lists it.
- ``receipt`` is fresh per delivery; an ack or nack with a superseded receipt does nothing.
- A transport never reads a body: any bytes published are delivered as they were. A message a
  broker transport cannot make a delivery of at all (BullMQ job data that is not accord's, a
  RabbitMQ message without a message id) is dead-lettered on its first delivery, with the reason
  and at most :data:`UNREADABLE_BODY_BYTES` of its raw bytes; a body its reader cannot read is the
  reader's to quarantine (:mod:`accord.engine.runtime.wire`).

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
from typing import Any, Protocol
from urllib.parse import parse_qsl

from accord.adapters._store_rules import int_option
from accord.adapters.clock import SystemClock
from accord.engine.ports import Clock, DeadLetter, Delivery
from accord.errors import TransportError

__all__ = [
    "BROKER_QUEUE_OPTS",
    "UNREADABLE_BODY_BYTES",
    "BrokerStream",
    "QueueOptions",
    "QueueTransport",
    "TransportBase",
    "broker_options",
    "check_prefetch",
]

POLL_MIN_MS = 1
# what a broker transport keeps of a message it cannot make a delivery of (dead-lettered at once)
UNREADABLE_BODY_BYTES = 65_536


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


# the queue options a broker transport's URL may carry (a broker does its own polling)
BROKER_QUEUE_OPTS = frozenset({"visibility_ms", "max_deliveries", "dedup_ms"})


def broker_options(
    query: str, own: frozenset[str], limits: Mapping[str, int] | None
) -> tuple[QueueOptions, dict[str, str]]:
    """A broker URL's query: its queue options and the transport's ``own`` options; any other
    name is refused (``ValueError``)."""
    pairs = parse_qsl(query)
    unknown = sorted({k for k, _ in pairs} - BROKER_QUEUE_OPTS - own)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown}")
    options = QueueOptions.from_query([p for p in pairs if p[0] in BROKER_QUEUE_OPTS], limits)
    return options, {k: v for k, v in pairs if k in own}


class TransportBase:
    """The open or closed state of a transport, the checks every publish makes, and
    ``dead_letters`` from ``dead_letter_details``."""

    _closed = False

    @property
    def closed(self) -> bool:
        """Whether the transport was closed (its streams end, publishes are refused)."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("transport is closed", retryable=False)

    def _check_publish(self, queue: str, message_id: str) -> None:
        self._check_open()
        if not queue or not message_id:
            raise TransportError("publish: queue and message_id must be non-empty", retryable=False)

    async def dead_letter_details(self, queue: str) -> list[dict[str, Any]]:
        """Dead letters of ``queue``, oldest first, each with ``message_id``, ``body``,
        ``delivery_count``, ``reason``, ``dead_at_ms`` (and what else the transport knows)."""
        raise NotImplementedError

    async def dead_letters(self, queue: str) -> list[Delivery]:
        return [
            Delivery(queue, d["message_id"], d["body"], d["delivery_count"], receipt="")
            for d in await self.dead_letter_details(queue)
        ]

    async def dead_letter_records(self, queue: str) -> list[DeadLetter]:
        """:meth:`dead_letter_details` as :class:`~accord.engine.ports.DeadLetter` records."""
        return [
            DeadLetter(
                queue, d["message_id"], d["body"], d["delivery_count"], d.get("reason") or "",
                d.get("dead_at_ms") or 0,
            )
            for d in await self.dead_letter_details(queue)
        ]  # fmt: skip


def check_prefetch(queue: str, prefetch: int) -> None:
    if prefetch < 1:
        raise ValueError(f"consume({queue!r}): prefetch must be >= 1, got {prefetch}")


START_TRIES = 4  # starts of a stream tried before a read fails
START_PAUSE_S = 0.5  # between those tries


class _Closable(Protocol):
    @property
    def closed(self) -> bool: ...


class BrokerStream:
    """Base of the BullMQ and RabbitMQ streams: ``_start`` (connect, subscribe) runs on the first
    read, once however many readers call; a timeout around a reader leaves it running, and a start
    that failed raises a retryable :class:`TransportError` to its readers, the next read trying
    again (unless the stream or its transport closed meanwhile: then the stream just ends)."""

    _starting: asyncio.Future[None] | None = None
    _closed = False

    async def _start(self) -> None:
        raise NotImplementedError

    async def _started(self, transport: _Closable, queue: str) -> None:
        """Wait for the stream's start (beginning it if need be) before a read. A start that
        fails is tried again :data:`START_TRIES` times in all, :data:`START_PAUSE_S` apart, before
        the read fails: a broker may refuse a first consume it would take a moment later (a
        RabbitMQ quorum queue consumed before its leader is up closes the connection, which
        the robust connection then reopens)."""
        for tries_left in range(START_TRIES - 1, -1, -1):
            if self._starting is None and not self._closed:  # one start, however many readers
                self._starting = asyncio.ensure_future(self._start())
            if self._starting is not None and not self._starting.done():
                await asyncio.wait([self._starting])  # a timeout around us leaves it running
            if self._starting is None or not self._starting.done():
                return
            failed = self._starting.cancelled() or self._starting.exception() is not None
            if not failed or self._closed or transport.closed:
                return
            self._starting = None  # the next call tries again
            if not tries_left:
                raise TransportError(f"cannot consume {queue!r}", retryable=True)
            await asyncio.sleep(START_PAUSE_S)


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


class QueueTransport(TransportBase):
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

    async def publish(self, queue: str, message_id: str, body: bytes, delay_ms: int = 0) -> None:
        self._check_publish(queue, message_id)
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
        check_prefetch(queue, prefetch)
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
