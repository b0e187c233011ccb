"""What a RabbitMQ consumer is made of: delivery counts read from headers, settling that
tolerates a vanished channel, dead-letter records, and the stream (one channel, one consumer,
``basic.qos(prefetch)``) behind :meth:`RabbitmqTransport.consume`.

A message delivered more often than the queue's limit (its consumers' connections died before they
settled it, and a delayed nack's copy had a count carried over) is dead-lettered before it is
handed out. See :mod:`accord.adapters.transports.rabbitmq` for the rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import TYPE_CHECKING, Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage
from aio_pika.exceptions import AMQPError, ChannelInvalidStateError

from accord.engine.ports import Delivery
from accord.errors import TransportError

if TYPE_CHECKING:
    from accord.adapters.transports.rabbitmq import RabbitmqTransport

__all__ = [
    "CARRIED",
    "ConsumerStream",
    "dead_letter_record",
    "delivery_count",
    "read_dead_letters",
    "settle",
]

CARRIED = "x-accord-deliveries"  # deliveries made before a delayed nack re-published the message
_receipts = itertools.count(1)


def _header_int(message: AbstractIncomingMessage, name: str) -> int:
    value = (message.headers or {}).get(name)
    return int(value) if isinstance(value, int | str) and str(value).isdigit() else 0


def delivery_count(message: AbstractIncomingMessage) -> int:
    return 1 + _header_int(message, "x-delivery-count") + _header_int(message, CARRIED)


def dead_letter_record(message: AbstractIncomingMessage, limit: int) -> dict[str, Any]:
    headers = message.headers or {}
    deaths: Any = headers.get("x-death") or [{}]
    reason = str(headers.get("x-accord-reason") or "")
    dead_at, count = _header_int(message, "x-accord-dead-at"), _header_int(message, CARRIED)
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


async def settle(step: Any) -> None:
    # the channel that held it is gone, so the broker has requeued it: superseded
    with contextlib.suppress(ChannelInvalidStateError, AMQPError, OSError):
        await step


class ConsumerStream:
    """A consumer on its own channel, bounded by ``basic.qos(prefetch)``."""

    def __init__(self, transport: RabbitmqTransport, queue: str, prefetch: int) -> None:
        self._t, self._queue, self._prefetch = transport, queue, prefetch
        self._inbox: asyncio.Queue[Delivery | None] = asyncio.Queue()
        self._channel: aio_pika.abc.AbstractChannel | None = None
        self._consumer: aio_pika.abc.AbstractQueue | None = None
        self._tag: str | None = None
        self._starting: asyncio.Future[None] | None = None
        self._closed = False

    def __aiter__(self) -> ConsumerStream:
        return self

    async def _start(self) -> None:
        t = self._t
        name = await t.declare(self._queue)
        assert t.connection is not None
        channel = await t.connection.channel()
        await channel.set_qos(prefetch_count=self._prefetch)
        # declared on this channel, so the robust channel re-declares and resubscribes it
        queue = await channel.declare_queue(name, durable=True, arguments=t.arguments(self._queue))
        self._tag = await queue.consume(self._on_message, no_ack=False)
        self._channel, self._consumer = channel, queue
        if self._closed:
            await channel.close()

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        t, count = self._t, delivery_count(message)
        limit = t.options.limit(self._queue)
        if self._closed:  # arrived after the consumer was cancelled: nobody will take it
            await settle(message.nack(requeue=True))
            return
        if count > limit:
            why = f"lease lapsed on delivery {limit} of {limit}"
            await t.dead_letter(self._queue, message, limit, why)
            return
        receipt = f"{next(_receipts)}"
        t._held[receipt] = message
        self._inbox.put_nowait(
            Delivery(self._queue, message.message_id or "", message.body, count, receipt)
        )

    async def __anext__(self) -> Delivery:
        if self._starting is None and not self._closed:
            self._starting = asyncio.ensure_future(self._start())
        if self._starting is not None and not self._starting.done():
            await asyncio.wait([self._starting])  # a timeout around us leaves the start running
        if self._starting is not None and self._starting.done():
            failed = self._starting.cancelled() or self._starting.exception() is not None
            if failed and not (self._closed or self._t._closed):
                self._starting = None  # the next call tries again
                raise TransportError(f"cannot consume {self._queue!r}", retryable=True)
        if self._closed:
            raise StopAsyncIteration
        delivery = await self._inbox.get()
        if delivery is None:
            raise StopAsyncIteration
        return delivery

    async def aclose(self) -> None:
        """Stop consuming. Deliveries not handed out go back to the queue; those handed out stay
        leased (their channel stays open) until settled or the transport closes."""
        if self._closed:
            return
        self._closed = True
        self._t._streams.discard(self)
        buffered = []
        while not self._inbox.empty():
            pending = self._inbox.get_nowait()
            if pending is not None:
                buffered.append(self._t._held.pop(pending.receipt))
        self._inbox.put_nowait(None)
        if self._starting is not None:
            with contextlib.suppress(Exception):
                await self._starting  # let a start in progress finish: its channel is closed below
        if self._channel is None:
            return
        if self._tag is not None and self._consumer is not None:
            await settle(self._consumer.cancel(self._tag))
        for message in buffered:
            await settle(message.nack(requeue=True))
        self._t._lingering.append(self._channel)
