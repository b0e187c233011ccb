"""Schedule triggers over real stores: one decision per tick across engines, every policy, DST.

Two engines share one store (the embedded SQLite default, and Redis with BullMQ) and both run
every scheduler pass; each tick must leave exactly one fire record and at most one run.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from tests.integration._triggers_kit import MINUTE, OPENERS, T0, engines, plan, schedule

from accord.engine.runtime.schedules import Scheduler, due_ticks, next_ticks
from accord.testing import FakeClock
from accord.workflow.triggers import ScheduleTrigger

HALF = 30_000

BACKENDS = sorted(OPENERS)


def _ms(text: str, tz: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(tz)).timestamp() * 1000)


def _local(ms: int, tz: str) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).astimezone(ZoneInfo(tz)).strftime("%m-%d %H:%M%z")


@pytest.mark.parametrize("backend", BACKENDS)
async def test_two_engines_fire_each_tick_exactly_once_over_twenty_ticks(
    tmp_path: Path, backend: str
) -> None:
    clock = FakeClock(T0)
    p = plan(schedule(overlap="allow"))
    async with engines(OPENERS[backend](tmp_path), clock, p) as (a, b):
        sa, sb = Scheduler(a, [p.name]), Scheduler(b, [p.name])
        # first sight: the schedule starts now, and T0 is itself a tick
        assert sum(await asyncio.gather(sa.tick(), sb.tick())) == 1
        for _ in range(24):
            clock.advance(MINUTE)
            decided = await asyncio.gather(sa.tick(), sb.tick())
            assert sum(decided) == 1, decided
        fires = await sa.fires(p.name, "every-minute")
        assert [f["nominalMs"] for f in fires] == [T0 + MINUTE * i for i in range(25)]
        assert {f["decision"] for f in fires} == {"started"}
        assert {f["engine"] for f in fires} <= {"engine-0", "engine-1"}
        runs = {f["runId"] for f in fires}
        assert len(runs) == 25
        for rid in runs:
            state = await b.load(str(rid))
            assert state is not None and state.workflow == p.name
            assert dict(state.context) == {"modelId": "sched-1"}
        assert sa.fired + sb.fired == 25


async def test_two_engines_on_a_real_clock_fire_each_second_once(tmp_path: Path) -> None:
    from accord.adapters.clock import SystemClock

    clock = SystemClock()
    p = plan(schedule(cron="* * * * * *" if False else "* * * * *", overlap="allow"))
    # cron resolution is a minute; a real-clock run over minutes is too slow for the suite, so the
    # real clock drives first sight and a tick forced by moving the cursor one minute back.
    async with engines(OPENERS["embedded"](tmp_path), clock, p) as (a, b):
        sa, sb = Scheduler(a, [p.name], poll_ms=20), Scheduler(b, [p.name], poll_ms=20)
        await sa.tick()
        now = clock.now_ms()
        back = due_ticks(p.triggers[0], now - 3 * MINUTE, now)  # type: ignore[arg-type]
        await sa._set(p.name, "every-minute", cursor=back[0] - 1)
        sa.start()
        sb.start()
        deadline = time.monotonic() + 10
        while len(await sa.fires(p.name, "every-minute")) < len(back):
            assert time.monotonic() < deadline, "the real-clock schedule did not fire"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # more passes by both engines change nothing
        await sa.stop()
        await sb.stop()
        fires = await sa.fires(p.name, "every-minute")
        assert [f["nominalMs"] for f in fires] == back
        # catch_up none: ticks more than a minute late are missed, the latest is on time
        assert [f["decision"] for f in fires][-1] == "started"
        assert len({f["nominalMs"] for f in fires}) == len(fires)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_overlap_skip_records_the_skipped_tick(tmp_path: Path, backend: str) -> None:
    clock = FakeClock(T0 + HALF)  # mid-minute: first sight fires nothing
    p = plan(schedule(overlap="skip"))
    async with engines(OPENERS[backend](tmp_path), clock, p) as (a, b):
        sa, sb = Scheduler(a, [p.name]), Scheduler(b, [p.name])
        await sa.tick()
        for _ in range(3):
            clock.advance(MINUTE)
            await asyncio.gather(sa.tick(), sb.tick())
        fires = await sa.fires(p.name, "every-minute")
        assert [f["decision"] for f in fires] == ["started", "skipped", "skipped"]
        first = fires[0]["runId"]
        assert all(str(first) in str(f["reason"]) for f in fires[1:])
        await a.cancel(str(first), "done")
        clock.advance(MINUTE)
        await sb.tick()
        fires = await sa.fires(p.name, "every-minute")
        assert fires[-1]["decision"] == "started" and fires[-1]["runId"] != first


@pytest.mark.parametrize("backend", BACKENDS)
async def test_overlap_buffer_one_keeps_one_tick_and_starts_it_after(
    tmp_path: Path, backend: str
) -> None:
    clock = FakeClock(T0 + HALF)  # mid-minute: first sight fires nothing
    p = plan(schedule(overlap="buffer-one"))
    async with engines(OPENERS[backend](tmp_path), clock, p) as (a, b):
        sa, sb = Scheduler(a, [p.name]), Scheduler(b, [p.name])
        await sa.tick()
        for _ in range(3):
            clock.advance(MINUTE)
            await asyncio.gather(sa.tick(), sb.tick())
        fires = await sa.fires(p.name, "every-minute")
        assert [f["decision"] for f in fires] == ["started", "skipped", "buffered"]
        assert "replaced by the buffered tick" in str(fires[1]["reason"])
        state = await sa.state(p.name, "every-minute")
        assert state is not None and state["buffered"] == fires[2]["nominalMs"]
        await a.cancel(str(fires[0]["runId"]), "done")
        await asyncio.gather(sa.tick(), sb.tick())  # no new tick: the buffered one starts
        fires = await sa.fires(p.name, "every-minute")
        assert [f["decision"] for f in fires] == ["started", "skipped", "started"]
        started = await a.load(str(fires[2]["runId"]))
        assert started is not None and not started.terminal
        state = await sa.state(p.name, "every-minute")
        assert state is not None and state["buffered"] is None


@pytest.mark.parametrize("backend", BACKENDS)
async def test_overlap_cancel_previous_cancels_then_starts(tmp_path: Path, backend: str) -> None:
    clock = FakeClock(T0 + HALF)  # mid-minute: first sight fires nothing
    p = plan(schedule(overlap="cancel-previous"))
    async with engines(OPENERS[backend](tmp_path), clock, p) as (a, b):
        sa, sb = Scheduler(a, [p.name]), Scheduler(b, [p.name])
        await sa.tick()
        for _ in range(2):
            clock.advance(MINUTE)
            await asyncio.gather(sa.tick(), sb.tick())
        fires = await sa.fires(p.name, "every-minute")
        assert [f["decision"] for f in fires] == ["started", "started"]
        first = await a.load(str(fires[0]["runId"]))
        second = await a.load(str(fires[1]["runId"]))  # two ticks after first sight
        assert first is not None and first.status in ("cancelled", "finalising")
        assert second is not None and second.status == "running"
        assert str(fires[0]["runId"]) in str(fires[1]["reason"])


@pytest.mark.parametrize("backend", BACKENDS)
async def test_overlap_allow_runs_side_by_side(tmp_path: Path, backend: str) -> None:
    clock = FakeClock(T0 + HALF)  # mid-minute: first sight fires nothing
    p = plan(schedule(overlap="allow"))
    async with engines(OPENERS[backend](tmp_path), clock, p) as (a, _b):
        sa = Scheduler(a, [p.name])
        await sa.tick()
        for _ in range(3):
            clock.advance(MINUTE)
            await sa.tick()
        fires = await sa.fires(p.name, "every-minute")
        states = [await a.load(str(f["runId"])) for f in fires]
        assert len(states) == 3 and all(s is not None and s.status == "running" for s in states)


@pytest.mark.parametrize(
    ("catch_up", "limit", "expected"),
    [
        ("none", None, ["skipped"] * 10),
        ("latest", None, ["skipped"] * 9 + ["started"]),
        ("all", 3, ["skipped"] * 7 + ["started"] * 3),
    ],
)
@pytest.mark.parametrize("backend", BACKENDS)
async def test_catch_up_after_every_engine_was_down(
    tmp_path: Path, backend: str, catch_up: str, limit: int | None, expected: list[str]
) -> None:
    clock = FakeClock(T0 + HALF)  # mid-minute: first sight fires nothing
    p = plan(schedule(overlap="allow", catch_up=catch_up, limit=limit))
    async with engines(OPENERS[backend](tmp_path), clock, p) as (a, b):
        sa = Scheduler(a, [p.name], misfire_ms=10_000)
        sb = Scheduler(b, [p.name], misfire_ms=10_000)
        await sa.tick()
        clock.advance(10 * MINUTE)  # ten ticks, the latest 30 s late: all missed
        decided = await asyncio.gather(sa.tick(), sb.tick())
        assert sum(decided) == 10
        fires = await sa.fires(p.name, "every-minute")
        assert [f["decision"] for f in fires] == expected
        assert all("missed" in str(f["reason"]) for f in fires if f["decision"] == "skipped")
        assert sum(1 for f in fires if f["runId"]) == expected.count("started")


@pytest.mark.parametrize("backend", BACKENDS)
async def test_catch_up_none_still_fires_the_tick_that_is_on_time(
    tmp_path: Path, backend: str
) -> None:
    clock = FakeClock(T0 + HALF)  # mid-minute: first sight fires nothing
    p = plan(schedule(overlap="allow", catch_up="none"))
    async with engines(OPENERS[backend](tmp_path), clock, p) as (a, _b):
        sa = Scheduler(a, [p.name])
        await sa.tick()
        clock.advance(5 * MINUTE + 1_000)  # five ticks: the last is 31 s late, on time
        await sa.tick()
        fires = await sa.fires(p.name, "every-minute")
        assert [f["decision"] for f in fires] == ["skipped"] * 4 + ["started"]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_pause_fires_nothing_and_resume_does_not_catch_up(
    tmp_path: Path, backend: str
) -> None:
    clock = FakeClock(T0 + HALF)  # mid-minute: first sight fires nothing
    p = plan(schedule(overlap="allow", catch_up="all", limit=100))
    async with engines(OPENERS[backend](tmp_path), clock, p) as (a, b):
        sa, sb = Scheduler(a, [p.name]), Scheduler(b, [p.name])
        await sa.tick()
        await sb.pause(p.name, "every-minute")
        for _ in range(5):
            clock.advance(MINUTE)
            assert sum(await asyncio.gather(sa.tick(), sb.tick())) == 0
        assert await sa.fires(p.name, "every-minute") == []
        state = await sa.resume(p.name, "every-minute")
        assert state is not None and state["paused"] is False
        clock.advance(MINUTE)
        assert sum(await asyncio.gather(sa.tick(), sb.tick())) == 1
        fires = await sa.fires(p.name, "every-minute")
        assert [f["nominalMs"] for f in fires] == [T0 + 6 * MINUTE]


def test_next_ticks_across_the_spring_forward_gap() -> None:
    t = ScheduleTrigger("nightly", "30 2 * * *", "Europe/Berlin")
    got = next_ticks(t, _ms("2026-03-27T12:00:00", "Europe/Berlin"), 4)
    # 02:30 does not exist on 29 March: it fires at 03:00 CEST, once
    assert [_local(ms, "Europe/Berlin") for ms in got] == [
        "03-28 02:30+0100",
        "03-29 03:00+0200",
        "03-30 02:30+0200",
        "03-31 02:30+0200",
    ]


def test_next_ticks_in_the_fall_back_hour_fire_once_for_a_daily_time() -> None:
    t = ScheduleTrigger("nightly", "30 2 * * *", "Europe/Berlin")
    got = next_ticks(t, _ms("2026-10-24T12:00:00", "Europe/Berlin"), 3)
    assert [_local(ms, "Europe/Berlin") for ms in got] == [
        "10-25 02:30+0200",
        "10-26 02:30+0100",
        "10-27 02:30+0100",
    ]
    assert got[1] - got[0] == 25 * 3_600_000  # the day of the change is 25 hours long


def test_an_interval_schedule_fires_in_both_copies_of_the_repeated_hour() -> None:
    t = ScheduleTrigger("half-hourly", "*/30 * * * *", "Europe/Berlin")
    start = _ms("2026-10-25T01:50:00", "Europe/Berlin")
    got = next_ticks(t, start, 5)
    assert [b - a for a, b in itertools.pairwise(got)] == [30 * MINUTE] * 4
    assert [_local(ms, "Europe/Berlin") for ms in got] == [
        "10-25 02:00+0200",
        "10-25 02:30+0200",
        "10-25 02:00+0100",
        "10-25 02:30+0100",
        "10-25 03:00+0100",
    ]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_dst_day_two_engines_fire_the_nightly_tick_once(tmp_path: Path, backend: str) -> None:
    tz = "Europe/Berlin"
    start = _ms("2026-10-24T23:00:00", tz)
    clock = FakeClock(start)
    p = plan(schedule(name="nightly", cron="30 2 * * *", tz=tz, overlap="allow"))
    async with engines(OPENERS[backend](tmp_path), clock, p) as (a, b):
        sa, sb = Scheduler(a, [p.name]), Scheduler(b, [p.name])
        await sa.tick()
        for _ in range(8 * 6):  # eight hours in ten-minute passes, across the fall-back hour
            clock.advance(10 * MINUTE)
            await asyncio.gather(sa.tick(), sb.tick())
        fires = await sa.fires(p.name, "nightly")
        assert [_local(int(str(f["nominalMs"])), tz) for f in fires] == ["10-25 02:30+0200"]
        assert [f["decision"] for f in fires] == ["started"]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_tick_claimed_by_an_engine_that_died_is_taken_over(
    tmp_path: Path, backend: str
) -> None:
    clock = FakeClock(T0 + HALF)
    p = plan(schedule(overlap="allow"))
    async with engines(OPENERS[backend](tmp_path), clock, p) as (a, b):
        sa, sb = Scheduler(a, [p.name]), Scheduler(b, [p.name], claim_lease_ms=10_000)
        await sa.tick()
        clock.advance(MINUTE)
        tick = T0 + MINUTE
        # engine a claims the tick and dies before deciding it
        assert await sa._claim(p, p.triggers[0], tick, clock.now_ms(), decision="claimed",  # type: ignore[arg-type]
                               run_id=None, reason="")  # fmt: skip
        assert await sb.tick() == 0  # the claim is fresh: b leaves it, and its cursor waits
        state = await sb.state(p.name, "every-minute")
        assert state is not None and int(str(state["cursor"])) < tick
        clock.advance(11_000)  # past the claim lease
        assert await sb.tick() == 1
        [fire] = await sb.fires(p.name, "every-minute")
        assert fire["decision"] == "started" and fire["engine"] == "engine-1"
        assert fire["takenOverFrom"] == "engine-0"
        run = await b.load(str(fire["runId"]))
        assert run is not None and run.status == "running"
