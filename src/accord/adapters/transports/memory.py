"""The in-process queue: the embedded transport's semantics over dicts, for tests and scenarios.

Messages live in one dict per queue, in publish order; a claim scans for ready rows, which is
fine at test sizes. Nothing survives the process. Semantics (dedup window, leases, delivery
limit, dead letters, superseded receipts) are those of :mod:`accord.adapters.transports._base`,
checked by the same contract suite as the SQLite queue.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from accord.adapters.transports._base import QueueOptions, QueueTransport
from accord.engine.ports import Clock, Delivery, Waiting

__all__ = ["MemoryTransport"]

READY, ACKED, DEAD = 0, 1, 2
PURGE_EVERY_MS = 1000  # acked ids past their dedup window are dropped at most this often


@dataclass(slots=True)
class _Message:
    body: bytes
    avail_at: int
    published_at: int
    order: int
    state: int = READY
    deliveries: int = 0
    receipt: str | None = None
    settled_at: int = 0
    reason: str = ""


class MemoryTransport(QueueTransport):
    """:class:`~accord.engine.ports.Transport` in process memory (see the module docstring)."""

    def __init__(
        self,
        clock: Clock | None = None,
        options: QueueOptions | None = None,
        delivery_limits: Mapping[str, int] | None = None,
    ) -> None:
        if delivery_limits is not None:
            base = options or QueueOptions()
            options = QueueOptions(
                base.visibility_ms,
                base.max_deliveries,
                delivery_limits,
                base.dedup_ms,
                base.poll_ms,
            )
        super().__init__(clock, options or QueueOptions(), f"memory:{id(self)}")
        self._queues: dict[str, dict[str, _Message]] = {}
        # the READY messages of each queue, so a claim never walks the acked ones kept for dedup
        self._ready: dict[str, dict[str, _Message]] = {}
        self._purged_at = 0
        self._order = itertools.count()

    async def _publish(self, queue: str, message_id: str, body: bytes, avail_at: int) -> None:
        messages = self._queues.setdefault(queue, {})
        known = messages.get(message_id)
        cutoff = self.clock.now_ms() - self.options.dedup_ms
        if known is None or (known.state == ACKED and known.settled_at < cutoff):
            message = _Message(body, avail_at, self.clock.now_ms(), next(self._order))
            messages[message_id] = message
            self._ready.setdefault(queue, {})[message_id] = message

    async def _claim(self, queue: str, n: int, now: int) -> list[Delivery]:
        messages = self._ready.get(queue, {})
        if now - self._purged_at >= PURGE_EVERY_MS:
            self._purged_at = now
            for each in self._queues.values():
                self._purge(each, now - self.options.dedup_ms)
        limit = self.options.limit(queue)
        ready = sorted(
            ((m.avail_at, m.order, mid) for mid, m in messages.items() if m.avail_at <= now)
        )
        live: list[Delivery] = []
        for _, _, message_id in ready:
            if len(live) == n:
                break
            message = messages[message_id]
            if message.deliveries >= limit:
                self._dead(message, now, f"lease lapsed on delivery {limit} of {limit}")
                del messages[message_id]
                continue
            message.deliveries += 1
            message.avail_at = now + self.options.visibility_ms
            message.receipt = f"{secrets.token_hex(8)}.{message.deliveries}"
            live.append(
                Delivery(queue, message_id, message.body, message.deliveries, message.receipt)
            )
        return live

    def _held(self, delivery: Delivery) -> _Message | None:
        message = self._queues.get(delivery.queue, {}).get(delivery.message_id)
        if message is None or message.state != READY or message.receipt != delivery.receipt:
            return None  # superseded receipt: redelivered or settled since
        return message

    async def _ack(self, delivery: Delivery, now: int) -> None:
        message = self._held(delivery)
        if message is None:
            return
        self._ready[delivery.queue].pop(delivery.message_id, None)
        if self.options.dedup_ms:
            message.state, message.settled_at, message.body = ACKED, now, b""
            message.receipt = None
        else:
            del self._queues[delivery.queue][delivery.message_id]

    async def _nack(self, delivery: Delivery, now: int, delay_ms: int) -> None:
        message = self._held(delivery)
        if message is None:
            return
        limit = self.options.limit(delivery.queue)
        if message.deliveries >= limit:
            self._dead(message, now, f"nacked on delivery {message.deliveries} of {limit}")
            self._ready[delivery.queue].pop(delivery.message_id, None)
        else:
            message.avail_at, message.receipt = now + delay_ms, None

    async def _unclaim(self, deliveries: list[Delivery]) -> None:
        for delivery in deliveries:
            message = self._held(delivery)
            if message is not None:
                message.avail_at, message.receipt = 0, None
                message.deliveries -= 1

    @staticmethod
    def _dead(message: _Message, now: int, reason: str) -> None:
        message.state, message.settled_at, message.reason, message.receipt = DEAD, now, reason, None

    @staticmethod
    def _purge(messages: dict[str, _Message], before: int) -> None:
        for message_id in [
            k for k, m in messages.items() if m.state == ACKED and m.settled_at < before
        ]:
            del messages[message_id]

    async def dead_letter_details(self, queue: str) -> list[dict[str, Any]]:
        """Dead letters with metadata, oldest first (see ``EmbeddedTransport``)."""
        dead = sorted(
            ((m.settled_at, m.order, mid, m) for mid, m in self._queues.get(queue, {}).items()
             if m.state == DEAD)
        )  # fmt: skip
        return [
            {"message_id": mid, "body": m.body, "delivery_count": m.deliveries,
             "reason": m.reason, "published_at_ms": m.published_at, "dead_at_ms": m.settled_at}
            for _, _, mid, m in dead
        ]  # fmt: skip

    # -- operating on what was refused (QueueAdmin) --------------------------------------------

    async def queue_names(self) -> list[str]:
        """Queues with a message waiting or a dead letter."""
        return sorted(
            q
            for q, ms in self._queues.items()
            if any(m.state in (READY, DEAD) for m in ms.values())
        )

    async def waiting(self, queue: str, limit: int = 1000) -> list[Waiting]:
        ready = sorted(
            (m.published_at, m.order, mid, m) for mid, m in self._ready.get(queue, {}).items()
        )
        return [
            Waiting(queue, mid, m.body, m.deliveries, m.published_at)
            for _, _, mid, m in ready[: max(limit, 0)]
        ]

    async def remove(self, queue: str, message_ids: Sequence[str]) -> list[str]:
        done = []
        for message_id in dict.fromkeys(message_ids):
            if self._ready.get(queue, {}).pop(message_id, None) is not None:
                del self._queues[queue][message_id]
                done.append(message_id)
        return done

    async def withdraw(self, queue: str, message_id: str) -> bool:
        """Settle a message nobody holds as if acknowledged, unread: its id stays known for the
        dedup window, so a late republish of the fenced job is dropped too (:class:`Withdraw`)."""
        message = self._ready.get(queue, {}).get(message_id)
        now = self.clock.now_ms()
        if message is None or (message.receipt is not None and message.avail_at > now):
            return False  # unknown, settled, or leased to a consumer
        self._ready[queue].pop(message_id)
        message.receipt = None
        if self.options.dedup_ms:
            message.state, message.settled_at, message.body = ACKED, now, b""
        else:
            del self._queues[queue][message_id]
        return True

    async def redrive_dead(self, queue: str, message_ids: Sequence[str]) -> list[str]:
        now, done = self.clock.now_ms(), []
        for message_id in dict.fromkeys(message_ids):
            message = self._queues.get(queue, {}).get(message_id)
            if message is None or message.state != DEAD:
                continue
            message.state, message.deliveries, message.avail_at = READY, 0, now
            message.reason, message.settled_at, message.receipt = "", 0, None
            self._ready.setdefault(queue, {})[message_id] = message
            done.append(message_id)
        self._wake(queue)
        return done
