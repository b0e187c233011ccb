"""What a RabbitMQ consumer is made of: delivery counts read from headers, settling that
tolerates a vanished channel, dead-letter records, and the stream (one channel, one consumer,
``basic.qos(prefetch)``) behind :meth:`RabbitmqTransport.consume`.

The stream consumes through the channel's AMQP client (``aiormq``) directly: the broker's frames
become a :class:`~accord.engine.ports.Delivery` in the consumer callback, with no intermediate
message object, in the channel reader's own step (the client would run a callback as a task of its
own, one loop pass later), and land in a buffer; the oldest reader waiting on the stream (several
may) is woken at once. The robust channel re-declares the queue and restores ``basic.qos`` after a
reconnect; the stream then subscribes again with the same consumer tag. A broker-side cancel (the
queue was deleted) makes it declare the queue and subscribe again.

A message delivered more often than the queue's limit (its consumers' connections died before they
settled it, and a delayed nack's copy had a count carried over) is dead-lettered before it is
handed out. See :mod:`accord.adapters.transports.rabbitmq` for the rules.

A stream uses its transport only through :class:`MessageSource`: the connection, options and
queue declarations, the transport's register of unsettled deliveries (which its ``ack`` and
``nack`` settle), dead-lettering, republishing a copy, and keeping a closed stream's channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections import deque
from collections.abc import Awaitable, Coroutine, Mapping
from typing import Any, Protocol

import aio_pika
import aiormq
from aio_pika.abc import AbstractIncomingMessage
from aio_pika.exceptions import AMQPError, ChannelInvalidStateError

from accord.adapters.transports._base import UNREADABLE_BODY_BYTES, BrokerStream, QueueOptions
from accord.engine.ports import Delivery
from accord.errors import TransportError

__all__ = [
    "CARRIED",
    "Acks",
    "ConsumerStream",
    "Held",
    "MessageSource",
    "dead_letter_record",
    "delivery_count",
    "read_dead_letters",
    "settle",
]

CARRIED = "x-accord-deliveries"  # deliveries made before a delayed nack re-published the message
NO_ID = "accord: message has no message_id"  # nothing could name, dedup or quarantine it
_receipts = itertools.count(1)
RESUBSCRIBE_S = 1.0  # pause between attempts to consume again from a queue the broker lost


async def _done() -> None:
    return None


class Acks:
    """The settlements of one channel, sent in as few frames as the broker allows, in order.

    ``basic.ack(tag, multiple=True)`` settles every unsettled delivery up to ``tag`` on its
    channel, and a quorum queue settles them in one log entry: acking one by one costs the
    broker about twice the CPU per message. So an ack is noted here and sent at the end of the
    loop pass, as one multiple ack up to the last delivery of the oldest run of acked ones.
    Deliveries acked behind one still being worked on wait for it, at most :data:`ACK_HOLD_S`,
    then go one by one. A delivery settled any other way (requeued) leaves the run first. Every
    frame goes through one writer, in the order decided, so a multiple ack never overtakes a
    settlement of a delivery below it (the broker would close the channel on a tag settled
    twice). An ack is fire-and-forget in AMQP either way; one noted but not yet written when its
    channel died is redelivered, as it would be had the frame been lost.
    """

    __slots__ = (
        "__weakref__",
        "_done",
        "_held_back",
        "_loop",
        "_outstanding",
        "_pending",
        "_scheduled",
        "_writer",
        "channel",
    )  # fmt: skip

    def __init__(self, channel: aiormq.abc.AbstractChannel) -> None:
        self.channel = channel
        self._outstanding: deque[int] = deque()  # delivered, not settled, in delivery order
        self._done: set[int] = set()  # acked by the transport, frame not decided yet
        self._scheduled = False
        self._held_back: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()
        # frames to write, in order: (tag, multiple ack, requeue instead, written)
        self._pending: deque[tuple[int, bool, bool, asyncio.Future[None] | None]] = deque()
        self._writer: asyncio.Task[None] | None = None

    def delivered(self, tag: int) -> None:
        self._outstanding.append(tag)

    def ack(self, tag: int) -> None:
        self._done.add(tag)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def requeue(self, tag: int) -> Awaitable[None]:
        """Send ``basic.nack(requeue)`` for ``tag`` alone; done when the frame is written."""
        self._alone(tag)
        written: asyncio.Future[None] = self._loop.create_future()
        self._write(tag, multiple=False, requeue=True, written=written)
        return written

    def _alone(self, tag: int) -> None:
        self._done.discard(tag)
        with contextlib.suppress(ValueError):
            self._outstanding.remove(tag)

    def flush(self) -> None:
        self._scheduled = False
        outstanding, done, last = self._outstanding, self._done, 0
        while outstanding and outstanding[0] in done:
            last = outstanding.popleft()
            done.discard(last)
        if last:
            self._write(last, multiple=True)
        if done and self._held_back is None:
            self._held_back = self._loop.call_later(ACK_HOLD_S, self._release)

    def _release(self) -> None:
        """Acks still waiting behind an unsettled delivery go one by one."""
        self._held_back = None
        self.flush()
        for tag in sorted(self._done):
            self._alone(tag)
            self._write(tag, multiple=False)

    async def drain(self) -> None:
        """Write every noted ack now (before the channel closes) and wait until written."""
        if self._held_back is not None:
            self._held_back.cancel()
        self._release()
        if self._writer is not None:
            await asyncio.wait([self._writer])

    def _write(
        self,
        tag: int,
        *,
        multiple: bool,
        requeue: bool = False,
        written: asyncio.Future[None] | None = None,
    ) -> None:
        self._pending.append((tag, multiple, requeue, written))
        if self._writer is None:
            self._writer = asyncio.ensure_future(self._writes())

    async def _writes(self) -> None:
        channel, pending = self.channel, self._pending
        try:
            while pending:
                tag, multiple, requeue, written = pending.popleft()
                if not channel.is_closed:
                    if requeue:
                        step = channel.basic_nack(tag, requeue=True, wait=False)
                    else:
                        step = channel.basic_ack(tag, multiple=multiple, wait=False)
                    await settle(step)
                if written is not None and not written.done():
                    written.set_result(None)
        finally:
            self._writer = None
            for *_, written in pending:  # only when cancelled: the channel is going away
                if written is not None and not written.done():
                    written.set_result(None)


ACK_HOLD_S = 0.01


class Held:
    """An unsettled delivery: the channel it came on and its delivery tag there."""

    __slots__ = ("acks", "channel", "tag")

    def __init__(self, channel: aiormq.abc.AbstractChannel, tag: int, acks: Acks) -> None:
        self.channel, self.tag, self.acks = channel, tag, acks
        acks.delivered(tag)

    def ack(self) -> Awaitable[None]:
        self.acks.ack(self.tag)
        return _done()

    def requeue(self) -> Awaitable[None]:
        return self.acks.requeue(self.tag)


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | str) and str(value).isdigit() else 0


def delivery_count(headers: Mapping[str, Any] | None) -> int:
    if not headers:
        return 1
    return 1 + _int(headers.get("x-delivery-count")) + _int(headers.get(CARRIED))


def dead_letter_record(message: AbstractIncomingMessage, limit: int) -> dict[str, Any]:
    headers = message.headers or {}
    deaths: Any = headers.get("x-death") or [{}]
    reason = str(headers.get("x-accord-reason") or "")
    dead_at, count = _int(headers.get("x-accord-dead-at")), _int(headers.get(CARRIED))
    if not reason:  # dead-lettered by the broker: consumers crashed before they could settle
        reason = f"lease lapsed past the delivery limit ({deaths[0].get('reason', 'unknown')})"
        stamp = deaths[0].get("time")
        dead_at = int(stamp.timestamp() * 1000) if stamp is not None else 0
        count = limit
    return {
        "message_id": message.message_id or "",
        "body": message.body,
        "delivery_count": count,
        "reason": reason,
        "dead_at_ms": dead_at,
    }


async def read_dead_letters(
    connection: aio_pika.abc.AbstractConnection, dlq_name: str, limit: int
) -> list[dict[str, Any]]:
    """Every record in ``dlq_name``, oldest first, taken on a private channel that is then closed
    unacknowledged, so all of them stay in the queue."""
    channel = await connection.channel()
    try:
        dlq = await channel.get_queue(dlq_name, ensure=False)
        out = []
        while (message := await dlq.get(no_ack=False, fail=False)) is not None:
            out.append(dead_letter_record(message, limit))
    finally:
        await channel.close()
    return out


async def settle(step: Awaitable[Any]) -> None:
    # the channel that held it is gone, so the broker has requeued it: superseded
    with contextlib.suppress(ChannelInvalidStateError, AMQPError, OSError):
        await step


class MessageSource(Protocol):
    """What a :class:`ConsumerStream` uses of its transport (``RabbitmqTransport``)."""

    options: QueueOptions
    connection: aio_pika.abc.AbstractRobustConnection | None

    @property
    def closed(self) -> bool: ...

    async def declare(self, queue: str) -> str:
        """Declare ``queue`` (once): its name on the broker."""
        ...

    def forget(self, queue: str) -> None:
        """Declare ``queue`` again on next use."""
        ...

    def arguments(self, queue: str) -> dict[str, Any]:
        """The declaration arguments of ``queue``."""
        ...

    def hold(self, receipt: str, held: Held) -> None:
        """Register an unsettled delivery under ``receipt``, for ack and nack to settle."""
        ...

    def held(self, receipt: str) -> Held | None:
        """The unsettled delivery registered under ``receipt``, if still there."""
        ...

    def release(self, receipt: str) -> Held | None:
        """Unregister ``receipt`` without settling it: what was registered, if anything."""
        ...

    def track_acks(self, acks: Acks) -> None:
        """Have the transport's close write out the acks noted on ``acks`` first."""
        ...

    async def dead_letter(
        self,
        queue: str,
        message_id: str,
        body: bytes,
        held: Held,
        reason: str,
        *,
        count: int | None = None,
    ) -> None:
        """Quarantine a delivery in ``queue.dead``, then settle the original (``count``: its
        delivery count, when not the queue's limit)."""
        ...

    async def republish(
        self, queue: str, message_id: str, body: bytes, headers: dict[str, Any] | None
    ) -> None:
        """A confirmed publish of a copy to ``queue``, with ``headers``."""
        ...

    def stream_closed(self, stream: ConsumerStream) -> None:
        """``stream`` closed: the transport's close need not close it."""
        ...

    def linger(self, channel: aio_pika.abc.AbstractChannel) -> None:
        """Keep a closed stream's channel open (its handed-out deliveries settle on it) until
        the transport closes."""
        ...


class ConsumerStream(BrokerStream):
    """A consumer on its own channel, bounded by ``basic.qos(prefetch)``."""

    def __init__(self, transport: MessageSource, queue: str, prefetch: int) -> None:
        self._t, self._queue, self._prefetch = transport, queue, prefetch
        self._limit = transport.options.limit(queue)
        self._buffer: deque[Delivery] = deque()  # received, not handed out yet
        self._waiters: deque[asyncio.Future[None]] = deque()  # readers waiting, oldest first
        self._channel: aio_pika.abc.AbstractRobustChannel | None = None
        self._name = ""
        self._tag = f"accord.{uuid.uuid4().hex}"
        self._starting: asyncio.Future[None] | None = None
        self._retrying: asyncio.Future[None] | None = None
        self._acks: Acks | None = None  # of the channel deliveries come on now
        self._closed = False

    def __aiter__(self) -> ConsumerStream:
        return self

    async def _start(self) -> None:
        t = self._t
        self._name = await t.declare(self._queue)
        assert t.connection is not None
        channel: Any = await t.connection.channel()
        await channel.set_qos(prefetch_count=self._prefetch)
        # declared on this channel, so the robust channel re-declares it after a reconnect
        await channel.declare_queue(self._name, durable=True, arguments=t.arguments(self._queue))
        self._channel = channel
        if self._closed:
            await channel.close()
            return
        await self._subscribe(await channel.get_underlay_channel())
        channel.reopen_callbacks.add(self._resubscribe)

    async def _subscribe(self, underlay: aiormq.abc.AbstractChannel) -> None:
        consumers = getattr(underlay, "consumers", None)
        if isinstance(consumers, dict) and self._tag in consumers:
            return  # already consuming on this channel
        underlay.on_consumer_cancel_callbacks.add(self._on_cancel)
        await underlay.basic_consume(self._name, self._on_deliver_async, consumer_tag=self._tag)
        # aiormq runs a consumer callback as a task of its own; this one does its work when
        # called, in the channel reader's step, so the waiting reader wakes one loop pass sooner
        if isinstance(consumers, dict) and self._tag in consumers:
            consumers[self._tag] = self._on_deliver

    async def _resubscribe(self, channel: Any) -> None:
        """After the robust channel reopened (on a new connection): consume again."""
        if not self._closed:
            await self._subscribe(await channel.get_underlay_channel())

    def _on_cancel(self, frame: aiormq.spec.Basic.Cancel) -> None:
        """The broker cancelled the consumer (its queue was deleted): declare it again and
        consume again, until that works or the stream is closed."""
        if frame.consumer_tag == self._tag and not self._closed and self._retrying is None:
            self._retrying = asyncio.ensure_future(self._consume_again())

    async def _consume_again(self) -> None:
        t = self._t
        try:
            while not self._closed and self._channel is not None:
                try:
                    t.forget(self._queue)
                    await t.declare(self._queue)
                    channel = self._channel
                    arguments = t.arguments(self._queue)
                    await channel.declare_queue(self._name, durable=True, arguments=arguments)
                    await self._subscribe(await channel.get_underlay_channel())
                    return
                except (TransportError, AMQPError, ChannelInvalidStateError, OSError):
                    await asyncio.sleep(RESUBSCRIBE_S)
        finally:
            self._retrying = None

    async def _on_deliver_async(self, message: aiormq.abc.DeliveredMessage) -> None:
        await self._on_deliver(message)

    def _on_deliver(self, message: aiormq.abc.DeliveredMessage) -> Coroutine[Any, Any, None]:
        """Buffer the delivery and wake the reader now; the coroutine returned does what is left
        (nothing, except for a delivery to dead-letter or to give back)."""
        frame, props = message.delivery, message.header.properties
        tag: int = frame.delivery_tag  # type: ignore[union-attr,assignment]
        acks = self._acks
        if acks is None or acks.channel is not message.channel:  # first, or after a reconnect
            acks = self._acks = Acks(message.channel)
            self._t.track_acks(acks)
        held = Held(message.channel, tag, acks)
        count = delivery_count(props.headers)
        message_id = props.message_id or ""
        if self._closed:  # arrived after the consumer was cancelled: nobody will take it
            return self._give_back(
                [(Delivery(self._queue, message_id, message.body, count, ""), held)]
            )
        if count > self._limit:
            why = f"lease lapsed on delivery {self._limit} of {self._limit}"
            return self._t.dead_letter(self._queue, message_id, message.body, held, why)
        if not message_id:  # not one of ours, and unsettleable by name: dead-letter it at once
            kept = message.body[:UNREADABLE_BODY_BYTES]
            return self._t.dead_letter(self._queue, "", kept, held, NO_ID, count=count)
        receipt = str(next(_receipts))
        self._t.hold(receipt, held)
        self._buffer.append(Delivery(self._queue, message_id, message.body, count, receipt))
        if self._waiters:
            self._wake()
        return _done()

    def _wake(self) -> None:
        """Wake the oldest reader still waiting."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def __anext__(self) -> Delivery:
        await self._started(self._t, self._queue)
        t, buffer = self._t, self._buffer
        while not self._closed:
            while buffer:
                delivery = buffer.popleft()
                lease = t.held(delivery.receipt)
                if lease is not None and not lease.channel.is_closed:
                    return delivery
                t.release(delivery.receipt)  # its channel is gone: the broker requeued it
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled() and buffer:
                    self._wake()  # woken, then cancelled: the next reader takes the delivery
                raise
        raise StopAsyncIteration

    async def _give_back(self, returning: list[tuple[Delivery, Held]]) -> None:
        """Return deliveries that were never handed out without counting them: the broker counts
        every requeue as a delivery, so each goes back as a confirmed copy carrying its count (at
        the tail of the queue), then the original is acknowledged. A copy that cannot be
        published leaves its original to a plain requeue."""
        t = self._t

        async def one(delivery: Delivery, held: Held) -> None:
            carried = delivery.delivery_count - 1
            try:
                headers = {CARRIED: carried} if carried > 0 else None
                await t.republish(self._queue, delivery.message_id, delivery.body, headers)
            except TransportError:
                await settle(held.requeue())
            else:
                await settle(held.ack())

        await asyncio.gather(*(one(d, h) for d, h in returning))

    async def aclose(self) -> None:
        """Stop consuming. Deliveries not handed out go back to the queue uncounted; those handed
        out stay leased (their channel stays open) until settled or the transport closes."""
        if self._closed:
            return
        self._closed = True
        self._t.stream_closed(self)
        if self._retrying is not None:
            self._retrying.cancel()
        returning = []
        for delivery in self._buffer:
            held = self._t.release(delivery.receipt)
            if held is not None and not held.channel.is_closed:
                returning.append((delivery, held))
        self._buffer.clear()
        while self._waiters:
            self._wake()
        if self._starting is not None:
            with contextlib.suppress(Exception):
                await self._starting  # let a start in progress finish: its channel is closed below
        channel = self._channel
        if channel is None or channel.is_closed:
            return
        channel.reopen_callbacks.discard(self._resubscribe)
        with contextlib.suppress(ChannelInvalidStateError, AMQPError, OSError):
            await (await channel.get_underlay_channel()).basic_cancel(self._tag)
        await self._give_back(returning)
        self._t.linger(channel)
