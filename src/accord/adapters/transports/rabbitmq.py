"""The RabbitMQ transport: durable quorum queues, publisher confirms, explicit dead-lettering.

``amqp://user:pass@host:port/vhost?max_deliveries=5&confirm_ms=5000&prefix=`` (``amqps://`` for
TLS). ``prefix`` is prepended to every queue name on the broker, so several deployments (or tests)
can share a vhost; deliveries carry the name without it.

Topology, declared on first use of a queue ``q`` (idempotent; arguments are fixed at declaration):

- ``q`` — a quorum queue, ``x-delivery-limit = limit - 1`` (the broker counts returns, not
  deliveries) and dead-lettering *at-least-once* (``x-overflow = reject-publish``) into the direct
  exchange ``accord.dead`` with routing key ``q``.
- ``q.dead`` — the quorum dead-letter queue bound to it: poison messages wait there for an
  operator; nothing is dropped.
- ``q.delay.<ms>`` — one quorum queue per distinct delay, ``x-message-ttl = ms``, dead-lettering
  back into ``q`` when the TTL ends; it expires itself a minute after its last use. Delayed
  publishes and delayed nacks go through it, so delays are precise to the broker's expiry sweep.

Rules:

- **publish** waits for the broker's confirm with ``mandatory`` set. A returned (unroutable) or
  nacked message raises :class:`~accord.errors.TransportError`; a confirm that does not arrive in
  ``confirm_ms`` (or a connection lost meanwhile) is *indeterminate*: it raises with
  ``retryable=True`` so the outbox entry stays pending and is published again; it is never assumed
  lost or done.
- **No dedup.** RabbitMQ does not deduplicate: publishing a message id twice makes two deliveries
  carrying the same ``message_id``. The engine's deterministic ids and fencing make the second one a
  no-op (a matching duplicate is acknowledged without re-releasing anything).
- **Leases** are RabbitMQ's manual acks, bounded by ``basic.qos(prefetch)``: a delivery stays with
  its consumer until settled or until the consumer's connection goes away, when the broker
  requeues it. The connection is *robust*: it reconnects and resubscribes; settling a delivery from
  before the reconnect does nothing (the broker has already requeued it).
- **delivery_count** is 1 + the broker's ``x-delivery-count`` + the count a delayed nack carried
  over in the ``x-accord-deliveries`` header. A nack at the limit, or a delivery that would pass it,
  is dead-lettered explicitly with ``x-accord-reason`` and ``x-accord-dead-at`` headers; the
  broker's delivery limit catches consumers that crash before they can.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import aio_pika
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from aio_pika.exceptions import AMQPError, DeliveryError, PublishError
from aiormq.exceptions import ChannelInvalidStateError

from accord.adapters.clock import SystemClock
from accord.adapters.transports._base import QueueOptions
from accord.adapters.transports._rabbitmq_consume import (
    CARRIED,
    ConsumerStream,
    read_dead_letters,
    settle,
)
from accord.engine.ports import Clock, Delivery
from accord.errors import TransportError

__all__ = ["DEAD_EXCHANGE", "RabbitmqTransport"]

DEAD_EXCHANGE = "accord.dead"
_QUEUE_OPTS = frozenset({"visibility_ms", "max_deliveries", "dedup_ms"})
_DELAY_IDLE_MS = 60_000
RECONNECT_S = 1.0  # pause between reconnection attempts of the robust connection


class RabbitmqTransport:
    """:class:`~accord.engine.ports.Transport` over RabbitMQ (see the module docstring)."""

    def __init__(
        self,
        url: str,
        options: QueueOptions | None = None,
        *,
        confirm_ms: int = 5000,
        prefix: str = "",
        clock: Clock | None = None,
    ) -> None:
        self.url, self.confirm_ms, self.prefix = url, confirm_ms, prefix
        # shown by `rabbitmqctl list_connections client_properties`, so operators can find it
        self.connection_name = f"accord {prefix}{uuid.uuid4().hex[:12]}"
        self.options = options or QueueOptions()
        self.clock: Clock = clock or SystemClock()
        self.connection: AbstractRobustConnection | None = None
        self._publisher: aio_pika.abc.AbstractChannel | None = None
        self.declared: set[str] = set()  # broker queue names this transport has declared
        self._held: dict[str, AbstractIncomingMessage] = {}  # receipt -> unsettled message
        self._streams: set[ConsumerStream] = set()
        self._lingering: list[aio_pika.abc.AbstractChannel] = []  # closed streams' channels
        self._lock = asyncio.Lock()
        self._closed = False

    @classmethod
    def from_url(
        cls, url: str, clock: Clock | None = None, limits: Mapping[str, int] | None = None
    ) -> RabbitmqTransport:
        parts = urlsplit(url)
        pairs = parse_qsl(parts.query)
        unknown = sorted({k for k, _ in pairs} - _QUEUE_OPTS - {"confirm_ms", "prefix"})
        if unknown:
            raise ValueError(f"unknown option(s) {unknown}")
        options = QueueOptions.from_query([p for p in pairs if p[0] in _QUEUE_OPTS], limits)
        own = dict(pairs)
        bare = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
        return cls(
            bare,
            options,
            confirm_ms=int(own.get("confirm_ms", 5000)),
            prefix=own.get("prefix", ""),
            clock=clock,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("transport is closed", retryable=False)

    async def _channel(self) -> aio_pika.abc.AbstractChannel:
        async with self._lock:
            if self._publisher is None:
                try:
                    self.connection = await aio_pika.connect_robust(
                        self.url,
                        reconnect_interval=RECONNECT_S,
                        client_properties={"connection_name": self.connection_name},
                    )
                    self._publisher = await self.connection.channel(
                        publisher_confirms=True, on_return_raises=True
                    )
                except (AMQPError, OSError) as exc:
                    raise TransportError(f"cannot reach RabbitMQ: {exc}", retryable=True) from exc
            return self._publisher

    def arguments(self, queue: str) -> dict[str, Any]:
        """The declaration arguments of ``queue`` (fixed once it exists on the broker)."""
        return {
            "x-queue-type": "quorum",
            "x-delivery-limit": max(self.options.limit(queue) - 1, 0),
            "x-dead-letter-exchange": DEAD_EXCHANGE,
            "x-dead-letter-routing-key": self.prefix + queue,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        }

    async def declare(self, queue: str) -> str:
        """Declare ``queue``, its dead-letter queue and the dead-letter exchange (once each);
        return the queue's name on the broker."""
        name = self.prefix + queue
        if name in self.declared and f"{name}.dead" in self.declared:
            return name
        channel = await self._channel()
        dead = await channel.declare_exchange(DEAD_EXCHANGE, "direct", durable=True)
        dlq = await channel.declare_queue(
            f"{name}.dead", durable=True, arguments={"x-queue-type": "quorum"}
        )
        self.declared.add(f"{name}.dead")
        await dlq.bind(dead, routing_key=name)
        await channel.declare_queue(name, durable=True, arguments=self.arguments(queue))
        self.declared.add(name)
        return name

    async def _delay_queue(self, name: str, delay_ms: int) -> str:
        delayed = f"{name}.delay.{delay_ms}"
        if delayed not in self.declared:
            await (await self._channel()).declare_queue(
                delayed,
                durable=True,
                arguments={
                    "x-queue-type": "quorum",
                    "x-message-ttl": delay_ms,
                    "x-expires": delay_ms + _DELAY_IDLE_MS,
                    "x-dead-letter-exchange": "",
                    "x-dead-letter-routing-key": name,
                    "x-dead-letter-strategy": "at-least-once",
                    "x-overflow": "reject-publish",
                },
            )
            self.declared.add(delayed)
        return delayed

    async def publish(self, queue: str, message_id: str, body: bytes, delay_ms: int = 0) -> None:
        self._check_open()
        if not queue or not message_id:
            raise TransportError("publish: queue and message_id must be non-empty", retryable=False)
        await self._send(queue, message_id, bytes(body), {}, delay_ms=delay_ms)

    async def _send(
        self,
        queue: str,
        message_id: str,
        body: bytes,
        headers: dict[str, Any],
        *,
        delay_ms: int = 0,
        exchange: str = "",
    ) -> None:
        try:
            name = await self.declare(queue)
            key = name if exchange or delay_ms <= 0 else await self._delay_queue(name, delay_ms)
            channel = await self._channel()
            target = await channel.get_exchange(exchange) if exchange else channel.default_exchange
            message = aio_pika.Message(
                body,
                message_id=message_id,
                headers=headers,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            await target.publish(message, key, mandatory=True, timeout=self.confirm_ms / 1000)
        except PublishError as exc:  # returned: re-declare on the next try (deleted meanwhile?)
            name = self.prefix + queue
            self.declared -= {n for n in self.declared if n == name or n.startswith(name + ".")}
            raise TransportError(
                f"publish to {queue!r} was returned unroutable: {exc}", retryable=True
            ) from exc
        except DeliveryError as exc:
            raise TransportError(
                f"RabbitMQ refused a publish to {queue!r}: {exc}", retryable=True
            ) from exc
        except (TimeoutError, AMQPError, ChannelInvalidStateError, OSError) as exc:
            # a channel closed by a lost connection is reopened by the robust connection
            raise TransportError(
                f"publish to {queue!r} is indeterminate (no confirm): {exc!r}", retryable=True
            ) from exc

    def consume(self, queue: str, prefetch: int = 1) -> AsyncIterator[Delivery]:
        if prefetch < 1:
            raise ValueError(f"consume({queue!r}): prefetch must be >= 1, got {prefetch}")
        self._check_open()
        stream = ConsumerStream(self, queue, prefetch)
        self._streams.add(stream)
        return stream

    async def ack(self, delivery: Delivery) -> None:
        message = self._held.pop(delivery.receipt, None)
        if message is not None:
            await settle(message.ack())

    async def nack(self, delivery: Delivery, delay_ms: int = 0) -> None:
        message = self._held.pop(delivery.receipt, None)
        if message is None:
            return
        limit = self.options.limit(delivery.queue)
        if delivery.delivery_count >= limit:
            why = f"nacked on delivery {delivery.delivery_count} of {limit}"
            await self.dead_letter(delivery.queue, message, delivery.delivery_count, why)
        elif delay_ms > 0:  # a copy through the delay queue carries the count over
            carried = {CARRIED: delivery.delivery_count}
            await self._send(
                delivery.queue, delivery.message_id, delivery.body, carried, delay_ms=delay_ms
            )
            await settle(message.ack())
        else:
            await settle(message.nack(requeue=True))

    async def dead_letter(
        self, queue: str, message: AbstractIncomingMessage, count: int, reason: str
    ) -> None:
        """Quarantine ``message`` in ``queue.dead`` (confirmed), then settle the original."""
        headers = {
            CARRIED: count,
            "x-accord-reason": reason,
            "x-accord-dead-at": self.clock.now_ms(),
        }
        await self._send(
            queue, message.message_id or "", message.body, headers, exchange=DEAD_EXCHANGE
        )
        await settle(message.ack())

    async def dead_letters(self, queue: str) -> list[Delivery]:
        return [
            Delivery(queue, d["message_id"], d["body"], d["delivery_count"], receipt="")
            for d in await self.dead_letter_details(queue)
        ]

    async def dead_letter_details(self, queue: str) -> list[dict[str, Any]]:
        """What ``queue.dead`` holds, oldest first; read by taking every message on a private
        channel and closing it unacknowledged, so all of them stay there."""
        name = await self.declare(queue)
        assert self.connection is not None
        return await read_dead_letters(self.connection, f"{name}.dead", self.options.limit(queue))

    async def close(self) -> None:
        self._closed = True
        await asyncio.gather(*(s.aclose() for s in list(self._streams)))
        self._held.clear()
        if self.connection is not None:
            await self.connection.close()  # unsettled deliveries return to their queues
