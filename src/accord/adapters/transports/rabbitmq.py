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
  lost or done. Publishes share one confirm-mode channel per transport, many in flight at once,
  each awaiting its own confirm. The common one (default exchange, no headers, one body frame) is
  framed here (:func:`publish_frames`, byte for byte the client's framing) and entered in the AMQP
  client's (``aiormq``) own confirm and return bookkeeping, as its ``basic_publish`` does; a
  channel without that bookkeeping, and every other publish, goes through ``basic_publish``.
- **No dedup.** RabbitMQ does not deduplicate: publishing a message id twice makes two deliveries
  carrying the same ``message_id``. The engine's deterministic ids and fencing make the second one a
  no-op (a matching duplicate is acknowledged without re-releasing anything).
- **Leases** are RabbitMQ's manual acks, bounded by ``basic.qos(prefetch)``: a delivery stays with
  its consumer until settled or until the consumer's connection goes away, when the broker
  requeues it (``visibility_ms`` does not apply: the lease is the connection's life). The
  connection is *robust*: it reconnects and resubscribes; settling a delivery from before the
  reconnect does nothing (the broker has already requeued it), and such a delivery still buffered
  is never handed out. A queue deleted under a consumer is declared again and consumed again.
- **Closing a stream** gives back the deliveries it never handed out. The broker would count a
  requeue as a delivery, so each goes back as a confirmed copy carrying its count (at the tail of
  the queue) before the original is acknowledged; a copy that cannot be published leaves the
  original to a plain requeue.
- **delivery_count** is 1 + the broker's ``x-delivery-count`` + the count a delayed nack (or a
  given-back copy) carried over in the ``x-accord-deliveries`` header. A nack at the limit, or a
  delivery that would pass it, is dead-lettered explicitly with ``x-accord-reason`` and
  ``x-accord-dead-at`` headers; the broker's delivery limit catches consumers that crash before
  they can.
"""

from __future__ import annotations

import asyncio
import struct
import uuid
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import aiormq
from aio_pika.abc import AbstractRobustConnection
from aiormq.abc import ChannelFrame
from aiormq.exceptions import (
    AMQPError,
    ChannelInvalidStateError,
    ChannelNotFoundEntity,
    DeliveryError,
    PublishError,
)
from pamqp.commands import Basic

from accord.adapters._store_rules import int_option, prefix_option
from accord.adapters.clock import SystemClock
from accord.adapters.transports._base import (
    QueueOptions,
    TransportBase,
    broker_options,
    check_prefetch,
)
from accord.adapters.transports._rabbitmq_consume import (
    CARRIED,
    Acks,
    ConsumerStream,
    Held,
    dead_letter_record,
    delivery_count,
    read_dead_letters,
    settle,
)
from accord.engine.ports import Clock, DeadLetter, Delivery, Waiting
from accord.errors import TransportError

__all__ = ["DEAD_EXCHANGE", "RabbitmqTransport", "publish_frames"]

DEAD_EXCHANGE = "accord.dead"
_OWN_OPTS = frozenset({"confirm_ms", "prefix"})
_DELAY_IDLE_MS = 60_000
RECONNECT_S = 1.0  # pause between reconnection attempts of the robust connection

_FRAME = struct.Struct(">BHI")  # frame type, channel, payload size
_CONTENT = struct.Struct(">HHQH")  # class (basic), weight, body size, property flags
_PUBLISH = b"\x00\x3c\x00\x28\x00\x00"  # basic.publish, ticket 0
_ID_PERSISTENT = 0x1000 | 0x0080  # property flags: delivery-mode, message-id
_END = b"\xce"


def publish_frames(channel: int, key: str, message_id: str, body: bytes) -> bytes | None:
    """``basic.publish`` to the default exchange, ``mandatory``, of a persistent message whose one
    other property is ``message_id``: its method, content header and body frames, byte for byte
    what the AMQP client would send; None when a name does not fit a short string."""
    rk, mid = key.encode(), message_id.encode()
    if len(rk) > 255 or len(mid) > 255:
        return None
    method = b"".join((_PUBLISH, b"\x00", bytes((len(rk),)), rk, b"\x01"))
    header = b"".join(
        (_CONTENT.pack(60, 0, len(body), _ID_PERSISTENT), b"\x02", bytes((len(mid),)), mid)
    )
    parts = [_FRAME.pack(1, channel, len(method)), method, _END]
    parts += [_FRAME.pack(2, channel, len(header)), header, _END]
    if body:
        parts += [_FRAME.pack(3, channel, len(body)), body, _END]
    return b"".join(parts)


def _frames_itself(channel: aiormq.Channel) -> bool:
    """Whether ``channel`` keeps its confirm bookkeeping where :meth:`_publish_framed` expects."""
    return (
        channel.publisher_confirms
        and isinstance(getattr(channel, "delivery_tag", None), int)
        and isinstance(getattr(channel, "confirmations", None), dict)
        and isinstance(getattr(channel, "message_id_delivery_tag", None), dict)
        and isinstance(getattr(channel, "write_queue", None), asyncio.Queue)
    )


async def _publish_framed(channel: aiormq.Channel, frames: bytes, message_id: str) -> None:
    """A confirmed publish of ready-made frames, kept exactly as the client's ``basic_publish``
    keeps its own: under the channel lock, the next delivery tag, a confirm future the channel
    fails when it closes, and the message id a ``basic.return`` is matched by."""
    async with channel.lock:  # frames leave in delivery-tag order
        channel.delivery_tag += 1
        tag = channel.delivery_tag
        confirmation = channel.create_future()
        channel.confirmations[tag] = confirmation
        channel.message_id_delivery_tag[message_id] = tag
        frame = ChannelFrame(payload=frames, should_close=False)
        try:
            channel.write_queue.put_nowait(frame)
        except asyncio.QueueFull:
            try:
                await channel.write_queue.put(frame)
            except BaseException:  # never sent: the broker did not see this tag
                channel.delivery_tag -= 1
                channel.confirmations.pop(tag, None)
                if channel.message_id_delivery_tag.get(message_id) == tag:
                    del channel.message_id_delivery_tag[message_id]
                confirmation.cancel()
                raise
    try:
        await confirmation  # a nack or a return raises
    finally:
        if channel.message_id_delivery_tag.get(message_id) == tag:
            del channel.message_id_delivery_tag[message_id]


_REDRIVE_PASSES, _REDRIVE_PAUSE_S = 5, 0.2  # redrive_dead: looks again for a record just given back


class RabbitmqTransport(TransportBase):
    """:class:`~accord.engine.ports.Transport` over RabbitMQ (see the module docstring); to its
    streams, a :class:`~accord.adapters.transports._rabbitmq_consume.MessageSource`."""

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
        self._publisher: aio_pika.abc.AbstractRobustChannel | None = None
        self._underlay: aiormq.Channel | None = None  # the publisher's AMQP channel
        self._framed = False  # whether publishes to the default exchange are framed here
        self.declared: set[str] = set()  # broker queue names this transport has declared
        self._names: dict[str, str] = {}  # queue -> broker name, once it is fully declared
        self._held: dict[str, Held] = {}  # receipt -> unsettled delivery
        self._acks: weakref.WeakSet[Acks] = weakref.WeakSet()  # of its streams' channels
        self._streams: set[ConsumerStream] = set()
        self._lingering: list[aio_pika.abc.AbstractChannel] = []  # closed streams' channels
        self._lock = asyncio.Lock()
        self._closed = False

    @classmethod
    def from_url(
        cls, url: str, clock: Clock | None = None, limits: Mapping[str, int] | None = None
    ) -> RabbitmqTransport:
        parts = urlsplit(url)
        options, own = broker_options(parts.query, _OWN_OPTS, limits)
        bare = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
        return cls(
            bare,
            options,
            confirm_ms=int_option(own, "confirm_ms", 5000),
            prefix=prefix_option(own, "", empty=True),
            clock=clock,
        )

    async def _channel(self) -> aiormq.Channel:
        """The publisher's confirm-mode channel (opening the connection on first use); a channel
        lost with its connection is a retryable error until the robust connection reopens it."""
        underlay = self._underlay
        if underlay is None:
            async with self._lock:
                if self._underlay is None:
                    await self._connect()
            assert self._underlay is not None
            underlay = self._underlay
        if underlay.is_closed:
            raise ChannelInvalidStateError("the publisher channel is closed (reconnecting)")
        return underlay

    async def _connect(self) -> None:
        try:
            self.connection = await aio_pika.connect_robust(
                self.url,
                reconnect_interval=RECONNECT_S,
                client_properties={"connection_name": self.connection_name},
            )
            publisher: Any = await self.connection.channel(
                publisher_confirms=True, on_return_raises=True
            )
            self._publisher = publisher
            await self._reopened(publisher)
            publisher.reopen_callbacks.add(self._reopened)
        except (AMQPError, OSError) as exc:
            raise TransportError(f"cannot reach RabbitMQ: {exc}", retryable=True) from exc

    async def _reopened(self, channel: Any) -> None:
        underlay = cast(aiormq.Channel, await channel.get_underlay_channel())
        self._framed = _frames_itself(underlay)
        self._underlay = underlay

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
        name = self._names.get(queue)
        if name is not None:
            return name
        name = self.prefix + queue
        await self._channel()
        assert self._publisher is not None
        channel = self._publisher
        dead = await channel.declare_exchange(DEAD_EXCHANGE, "direct", durable=True)
        dlq = await channel.declare_queue(
            f"{name}.dead", durable=True, arguments={"x-queue-type": "quorum"}
        )
        self.declared.add(f"{name}.dead")
        await dlq.bind(dead, routing_key=name)
        await channel.declare_queue(name, durable=True, arguments=self.arguments(queue))
        self.declared.add(name)
        self._names[queue] = name
        return name

    def forget(self, queue: str) -> None:
        """Declare ``queue`` (and its delay queues) again on next use."""
        name = self.prefix + queue
        self._names.pop(queue, None)
        self.declared -= {n for n in self.declared if n == name or n.startswith(name + ".")}

    async def _delay_queue(self, name: str, delay_ms: int) -> str:
        delayed = f"{name}.delay.{delay_ms}"
        if delayed not in self.declared:
            await self._channel()
            assert self._publisher is not None
            await self._publisher.declare_queue(
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
        self._check_publish(queue, message_id)
        await self._send(queue, message_id, bytes(body), None, delay_ms=delay_ms)

    async def republish(
        self, queue: str, message_id: str, body: bytes, headers: dict[str, Any] | None
    ) -> None:
        """A confirmed publish of a copy (a delivery given back) to ``queue``, with ``headers``;
        unlike :meth:`publish`, also while the transport closes."""
        await self._send(queue, message_id, body, headers)

    async def _send(
        self,
        queue: str,
        message_id: str,
        body: bytes,
        headers: dict[str, Any] | None,
        *,
        delay_ms: int = 0,
        exchange: str = "",
    ) -> None:
        try:
            name = self._names.get(queue) or await self.declare(queue)
            key = name if exchange or delay_ms <= 0 else await self._delay_queue(name, delay_ms)
            channel = self._underlay
            if channel is None or channel.is_closed:
                channel = await self._channel()
            timeout = self.confirm_ms / 1000
            framed = None  # the common publish is framed here; the client frames the rest
            simple = not exchange and headers is None and len(body) < channel.max_content_size
            if simple and self._framed:
                framed = publish_frames(channel.number, key, message_id, body)
            if framed is not None:
                async with asyncio.timeout(timeout):
                    await _publish_framed(channel, framed, message_id)
                return
            properties = Basic.Properties(message_id=message_id, delivery_mode=2, headers=headers)
            # wait=False: no drain future; the broker's confirm (or return) is what is awaited
            await channel.basic_publish(
                body,
                exchange=exchange,
                routing_key=key,
                properties=properties,
                mandatory=True,
                timeout=timeout,
                wait=False,
            )
        except PublishError as exc:  # returned: re-declare on the next try (deleted meanwhile?)
            self.forget(queue)
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
        check_prefetch(queue, prefetch)
        self._check_open()
        stream = ConsumerStream(self, queue, prefetch)
        self._streams.add(stream)
        return stream

    # -- what its streams use (MessageSource) -------------------------------------------------

    def hold(self, receipt: str, held: Held) -> None:
        self._held[receipt] = held

    def held(self, receipt: str) -> Held | None:
        return self._held.get(receipt)

    def release(self, receipt: str) -> Held | None:
        return self._held.pop(receipt, None)

    def track_acks(self, acks: Acks) -> None:
        self._acks.add(acks)

    def stream_closed(self, stream: ConsumerStream) -> None:
        self._streams.discard(stream)

    def linger(self, channel: aio_pika.abc.AbstractChannel) -> None:
        self._lingering.append(channel)

    # -- settling ---------------------------------------------------------------------------

    async def ack(self, delivery: Delivery) -> None:
        held = self._held.pop(delivery.receipt, None)
        if held is not None:
            await settle(held.ack())

    async def nack(self, delivery: Delivery, delay_ms: int = 0) -> None:
        held = self._held.pop(delivery.receipt, None)
        if held is None:
            return
        limit = self.options.limit(delivery.queue)
        if delivery.delivery_count >= limit:
            why = f"nacked on delivery {delivery.delivery_count} of {limit}"
            await self.dead_letter(
                delivery.queue, delivery.message_id, delivery.body, held, why,
                count=delivery.delivery_count,
            )  # fmt: skip
        elif delay_ms > 0:  # a copy through the delay queue carries the count over
            carried = {CARRIED: delivery.delivery_count}
            await self._send(
                delivery.queue, delivery.message_id, delivery.body, carried, delay_ms=delay_ms
            )
            await settle(held.ack())
        else:
            await settle(held.requeue())

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
        """Quarantine a delivery in ``queue.dead`` (confirmed), then settle the original."""
        headers = {
            CARRIED: self.options.limit(queue) if count is None else count,
            "x-accord-reason": reason,
            "x-accord-dead-at": self.clock.now_ms(),
        }
        await self._send(queue, message_id, body, headers, exchange=DEAD_EXCHANGE)
        await settle(held.ack())

    async def dead_letter_details(self, queue: str) -> list[dict[str, Any]]:
        """What ``queue.dead`` holds, oldest first; read by taking every message on a private
        channel and closing it unacknowledged, so all of them stay there."""
        name = await self.declare(queue)
        assert self.connection is not None
        return await read_dead_letters(self.connection, f"{name}.dead", self.options.limit(queue))

    # -- operating on what was refused (QueueAdmin) --------------------------------------------

    async def queue_names(self) -> None:
        """AMQP cannot list a vhost's queues: the caller names them."""
        return None

    async def _existing(self, name: str) -> aio_pika.abc.AbstractQueue | None:
        """The broker queue ``name`` on a private channel (closed with it), or None when there
        is no such queue: looking never declares one."""
        await self._channel()
        assert self.connection is not None
        channel = await self.connection.channel()
        try:
            found = await channel.declare_queue(name, passive=True)
        except ChannelNotFoundEntity:
            return None  # the broker closed the channel
        except BaseException:
            await channel.close()
            raise
        if name.startswith(self.prefix):
            # it exists: publish to it as it is, whatever arguments it was declared with (an
            # operator's URL need not repeat the fleet's delivery limit)
            self._names.setdefault(name[len(self.prefix) :], name)
        return found

    async def _admin(self, name: str, what: str) -> aio_pika.abc.AbstractQueue | None:
        try:
            return await self._existing(name)
        except (AMQPError, OSError) as exc:
            raise TransportError(f"cannot {what}: {exc}", retryable=True) from exc

    async def _rotate(
        self, queue: str, drop: set[str], limit: int
    ) -> tuple[list[Waiting], list[str]]:
        """Read ``queue`` in place: each message is taken and either dropped (its id is in
        ``drop``) or published again as a confirmed copy before the original is acknowledged.
        A quorum queue counts a message taken and returned as a delivery, and past its limit
        dead-letters it, so merely looking must not return messages; a copy starts afresh."""
        name = self.prefix + queue
        found = await self._admin(name, f"read queue {queue!r}")
        if found is None:
            return [], []
        seen: list[Waiting] = []
        dropped: list[str] = []
        count = found.declaration_result.message_count or 0
        try:
            for _ in range(min(count, limit)):
                message = await found.get(no_ack=False, fail=False)
                if message is None:
                    break
                message_id = message.message_id or ""
                if message_id in drop:
                    await message.ack()
                    dropped.append(message_id)
                    continue
                headers = {
                    k: v
                    for k, v in (message.headers or {}).items()
                    if k not in ("x-delivery-count", "x-death")
                }
                previous = delivery_count(message.headers) - 1
                seen.append(Waiting(queue, message_id, message.body, previous, 0))
                await self._send(queue, message_id, message.body, headers or None)
                await message.ack()
        except (AMQPError, OSError) as exc:
            raise TransportError(f"reading queue {queue!r} failed: {exc}", retryable=True) from exc
        finally:
            await found.channel.close()
        return seen, dropped

    async def waiting(self, queue: str, limit: int = 1000) -> list[Waiting]:
        """What waits on ``queue``, oldest first, each message cycled through a fresh copy (see
        :meth:`_rotate`); the broker does not say when one was published (0)."""
        return (await self._rotate(queue, set(), max(limit, 0)))[0]

    async def remove(self, queue: str, message_ids: Sequence[str]) -> list[str]:
        dropped = (await self._rotate(queue, set(message_ids), 1 << 30))[1]
        return list(dict.fromkeys(dropped))

    async def dead_letter_records(self, queue: str) -> list[DeadLetter]:
        """What ``queue.dead`` holds, without declaring anything when it does not exist."""
        name = f"{self.prefix}{queue}.dead"
        if await self._admin(name, f"read the dead letters of {queue!r}") is None:
            return []
        assert self.connection is not None
        try:
            found = await read_dead_letters(self.connection, name, self.options.limit(queue))
        except (AMQPError, OSError) as exc:
            raise TransportError(f"cannot read the dead letters of {queue!r}: {exc}",
                                 retryable=True) from exc  # fmt: skip
        return [
            DeadLetter(queue, d["message_id"], d["body"], d["delivery_count"], d["reason"],
                       d["dead_at_ms"])
            for d in found
        ]  # fmt: skip

    async def redrive_dead(self, queue: str, message_ids: Sequence[str]) -> list[str]:
        """Each matching record of ``queue.dead`` is published to ``queue`` as a new message
        (confirmed, so counted afresh) and only then acknowledged out of the dead letters; the
        others go back untouched when the private channel closes.

        A record another channel has just given back (a reader that listed the dead letters
        and closed) reaches the queue a moment after that channel closed, so a wanted record
        not found is looked for again, a few times, before it is said to have left."""
        wanted = set(message_ids)
        done: list[str] = []
        for attempt in range(_REDRIVE_PASSES):
            if attempt:
                await asyncio.sleep(_REDRIVE_PAUSE_S)
            found = await self._admin(f"{self.prefix}{queue}.dead", f"redrive {queue!r}")
            if found is None:
                return done
            if attempt == 0:
                target = await self._admin(self.prefix + queue, f"redrive {queue!r}")
                if target is not None:
                    await target.channel.close()
            done += await self._redrive_pass(queue, found, wanted - set(done))
            if wanted <= set(done):
                break
        return list(dict.fromkeys(done))

    async def _redrive_pass(
        self, queue: str, found: aio_pika.abc.AbstractQueue, wanted: set[str]
    ) -> list[str]:
        """One read of ``queue.dead`` through ``found``'s private channel, closed at the end."""
        done = []
        limit = self.options.limit(queue)
        try:
            while True:  # what this channel took stays unacked on it: get ends with None
                message = await found.get(no_ack=False, fail=False)
                if message is None:
                    break
                record = dead_letter_record(message, limit)
                if record["message_id"] not in wanted:
                    continue
                await self._send(queue, record["message_id"], message.body, None)
                await message.ack()
                done.append(record["message_id"])
        except (AMQPError, OSError) as exc:
            raise TransportError(f"redriving {queue!r} failed: {exc}", retryable=True) from exc
        finally:
            await found.channel.close()
        return done

    async def close(self) -> None:
        self._closed = True
        await asyncio.gather(*(s.aclose() for s in list(self._streams)))
        # noted acks go out before their channels close
        await asyncio.gather(*(acks.drain() for acks in list(self._acks)))
        self._held.clear()
        if self.connection is not None:
            await self.connection.close()  # unsettled deliveries return to their queues
