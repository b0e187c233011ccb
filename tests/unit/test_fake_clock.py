"""The controllable clock of ``accord.testing`` and the real one it stands in for."""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.adapters.clock import SystemClock
from accord.testing.clock import FakeClock


def test_time_moves_only_forward_and_only_when_advanced() -> None:
    clock = FakeClock(start_ms=1_000)
    assert clock.now_ms() == 1_000
    assert clock.advance(250) == 1_250 == clock.now_ms()
    with pytest.raises(ValueError, match="ms must be >= 0"):
        clock.advance(-1)
    assert clock.now_ms() == 1_250


@settings(max_examples=60, deadline=None)
@given(
    sleeps=st.lists(st.integers(min_value=0, max_value=500), min_size=1, max_size=8),
    steps=st.lists(st.integers(min_value=0, max_value=200), min_size=1, max_size=12),
)
def test_each_sleeper_wakes_exactly_when_its_time_has_passed(
    sleeps: list[int], steps: list[int]
) -> None:
    async def scenario() -> None:
        clock = FakeClock(start_ms=0)
        woke: dict[int, int] = {}

        async def sleeper(index: int, ms: int) -> None:
            await clock.sleep(ms)
            woke[index] = clock.now_ms()

        tasks = [asyncio.create_task(sleeper(i, ms)) for i, ms in enumerate(sleeps)]
        await asyncio.sleep(0)
        elapsed = 0
        for step in steps:
            clock.advance(step)
            elapsed += step
            for _ in range(3):
                await asyncio.sleep(0)
            for i, ms in enumerate(sleeps):
                assert (i in woke) == (ms <= elapsed), (i, ms, elapsed)
        assert clock.sleepers == sum(1 for ms in sleeps if ms > elapsed)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(scenario())


async def test_system_clock_reads_wall_time_and_really_sleeps() -> None:
    clock = SystemClock()
    before = time.time() * 1000
    assert abs(clock.now_ms() - before) < 1_000
    started = time.monotonic()
    await clock.sleep(20)
    assert time.monotonic() - started >= 0.019
