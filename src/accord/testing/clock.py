"""A controllable clock for scenarios and tests.

Time moves only when :meth:`FakeClock.advance` is called. ``sleep`` parks the caller until the
clock has been advanced past its wake-up time, so a timer service or a retry loop driven by this
clock runs exactly as far as the test lets it, and never waits on the wall clock.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools

__all__ = ["FakeClock"]

DEFAULT_START_MS = 1_700_000_000_000  # a fixed, realistic epoch instant keeps output stable


class FakeClock:
    """:class:`~accord.engine.ports.Clock` whose time is advanced by hand."""

    def __init__(self, start_ms: int = DEFAULT_START_MS) -> None:
        self._now = start_ms
        self._sleepers: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> int:
        """Move time forward by ``ms`` (never backwards), wake due sleepers, return the new now."""
        if ms < 0:
            raise ValueError(f"FakeClock.advance: ms must be >= 0, got {ms}")
        self._now += ms
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, waiter = heapq.heappop(self._sleepers)
            if not waiter.done():
                waiter.set_result(None)
        return self._now

    async def sleep(self, ms: int) -> None:
        if ms <= 0:
            await asyncio.sleep(0)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + ms, next(self._order), waiter))
        await waiter

    @property
    def sleepers(self) -> int:
        """How many callers are parked in :meth:`sleep` (lets a test wait until a loop idles)."""
        return sum(1 for _, _, w in self._sleepers if not w.done())
