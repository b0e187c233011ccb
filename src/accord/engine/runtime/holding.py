"""Holding on while the store is unavailable.

A commit that meets a retryable :class:`~accord.errors.StoreError` (Redis down or failing over, a
write its replicas did not acknowledge, SQLite locked past its busy timeout) says nothing about
the event it carried: the same event is committed again a moment later, or was committed and is
then recorded as a duplicate. :class:`Hold` makes such a call again in place, after 50 ms, then
twice as long each time up to 1 s, for up to ``hold_ms`` in all, and then lets the error
through. Every other error goes through at once.

Intake uses it so that a store outage does not spend an outcome's delivery budget (past the
queue's limit a good outcome would be dead-lettered as poison); the action executor, so that an
action's side effects are not repeated by the outbox sweep merely because its outcome's commit
met an outage.

Keep ``hold_ms`` below the transport's lease (``visibility_ms``, BullMQ's ``stalled_ms``; 30 s by
default; RabbitMQ's lease is the connection's life): past it the transport hands the delivery out
again meanwhile, which costs one delivery and loses nothing (the second pass is a duplicate).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from accord.errors import StoreError

__all__ = ["FIRST_PAUSE_MS", "HOLD_MS", "MAX_PAUSE_MS", "Hold"]

T = TypeVar("T")
HOLD_MS, FIRST_PAUSE_MS, MAX_PAUSE_MS = 10_000, 50, 1_000
log = logging.getLogger("accord.engine")


class Hold:
    """Retries a call in place while the store is unavailable; counts the passes made again."""

    def __init__(self, hold_ms: int = HOLD_MS) -> None:
        self.hold_ms = hold_ms
        self.held = 0  # passes made again because the store was unavailable

    async def run(self, call: Callable[[], Awaitable[T]], what: str, *args: object) -> T:
        """``await call()``, made again while it raises a retryable StoreError, for up to
        ``hold_ms``; ``what % args`` names the work in the one warning logged per hold (formatted
        only then: the call that succeeds, the common case, formats nothing)."""
        waited_ms, pause_ms = 0, FIRST_PAUSE_MS
        while True:
            try:
                return await call()
            except StoreError as exc:
                if not exc.retryable or waited_ms >= self.hold_ms:
                    raise
                if waited_ms == 0:
                    log.warning(what + " held, the store is unavailable: %s", *args, exc)
            await asyncio.sleep(pause_ms / 1000)
            self.held += 1
            waited_ms += pause_ms
            pause_ms = min(2 * pause_ms, MAX_PAUSE_MS)
