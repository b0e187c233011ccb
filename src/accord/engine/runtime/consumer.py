"""What the engine's queue consumers share: outcome intake (:mod:`.intake`) and run requests
(:mod:`.requests`).

A consumer takes up to ``prefetch`` deliveries from its queue at once, so one delivery's commit
overlaps the next one's decoding (the engine's per-run locks keep one run's events in arrival
order). Each is processed inside the store hold (:mod:`.holding`): a retryable store error is
ridden out in place; anything else leaves the delivery unacknowledged and nacks it for a
redelivery. :meth:`QueueConsumer.wait_idle` returns once nothing taken is still in hand, which is
how a graceful stop lets the deliveries in hand finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from accord.engine.ports import Delivery, Transport
from accord.engine.runtime.holding import Hold

__all__ = ["QueueConsumer"]

log = logging.getLogger("accord.engine.runtime.consumer")

NACK_DELAY_MS = 100  # a delivery that failed comes back after this long


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

    async def process(self, delivery: Delivery) -> Any:
        raise NotImplementedError

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def run(self, stop: Callable[[], bool], prefetch: int | None = None) -> None:
        """Consume until ``stop()``, up to ``prefetch`` (default :attr:`prefetch`) at once."""
        limit = prefetch or self.prefetch
        slots = asyncio.Semaphore(limit)
        spawn = asyncio.get_running_loop().create_task
        async for delivery in self._transport.consume(self.queue, limit):
            await slots.acquire()
            self._busy += 1
            self._idle.clear()
            spawn(self._guarded(delivery, slots))
            if stop():
                break

    async def _guarded(self, delivery: Delivery, slots: asyncio.Semaphore) -> None:
        what = f"{self.what} %s"
        try:
            await self._hold.run(lambda: self.process(delivery), what, delivery.message_id)
        except Exception:  # not acknowledged: the transport redelivers it
            log.exception(f"{what} not processed", delivery.message_id)
            with contextlib.suppress(Exception):
                await self._transport.nack(delivery, NACK_DELAY_MS)
        finally:
            slots.release()
            self._busy -= 1
            if self._busy == 0:
                self._idle.set()
