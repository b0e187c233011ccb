"""The real clock: wall time in integer milliseconds, real sleeps.

Leases, visibility timeouts and deadlines are all expressed in the same epoch milliseconds, so a
store and a transport sharing one :class:`~accord.engine.ports.Clock` agree on what "lapsed"
means. Tests substitute :class:`accord.testing.clock.FakeClock`.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["SystemClock"]


class SystemClock:
    """:class:`~accord.engine.ports.Clock` over ``time.time_ns`` and ``asyncio.sleep``."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    async def sleep(self, ms: int) -> None:
        await asyncio.sleep(max(ms, 0) / 1000)
