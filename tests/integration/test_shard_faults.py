"""Process-level faults of engines owning shards: a ``kill -9`` mid-soak and a partition.

The fleet of the scale-out soak (``scale_out_fleet.py``: two engine and four worker processes over
a Redis store of 4 shards, model-ingest runs, 10% seeded worker faults) runs with a shard lease of
:data:`LEASE_MS`, so an engine beats every :data:`BEAT_MS`. Ownership is read from the store
(``shard_leases()``), the engines' transitions from their logs (``took shard(s)``, ``lost
shard``) and counters (their last JSON line at a graceful stop).

- **kill -9**: once every run has started and a fifth have ended, the engine ``e1`` (which owns
  half the shards, as both do) is killed. The survivor must own every shard within the lease and
  one beat (the dead engine's lease and its liveness both last ``LEASE_MS`` from its last beat;
  the survivor notices at its next beat); the killed engine is then started again and takes its
  share back (a graceful handover, or, when the survivor's own beat was held up past its lease
  on a loaded machine, the leases it dropped itself). Every run completes once, I1–I7 and I12
  hold, and nothing is left on any queue.
- **partition**: ``e1`` is ``SIGSTOP``ped while runs of its shards are in flight, for longer than
  its lease, :data:`FREEZES` times; ``e0`` takes its shards and ends some of those runs while
  ``e1`` is frozen (a stopped process sends nothing). On ``SIGCONT`` ``e1`` either drops its
  shards itself (its beat runs first: ``not renewed``) or commits under its stale leases and is
  refused (``ownership_lost``, ``lost shard``): which comes first is a race, so the test logs
  both, and requires that no commit of a run of its lost shards went out *unfenced* between its
  waking and its taking its share back (the engine process logs each unfenced commit of an
  existing run, ``scale_out_proc.py``). Every run completes once, each history replays to its
  record (I12) with its versions growing by one (I3: no two commits at one version), nothing is
  left on any queue.

``ACCORD_SHARD_KILL_RUNS`` (400 in ``make test``, 1000 in ``make soak``; the RabbitMQ variant
takes at most 300 of them, the routing it checks being the same) and
``ACCORD_SHARD_PARTITION_RUNS`` (default 300) set the run counts; ``ACCORD_SOAK_KEEP=1`` leaves
the keys and queues in place after a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from scale_out_fleet import (
    ALL_QUEUES,
    REDIS,
    SHARDS,
    SLOTS,
    Fleet,
    keyspace,
    pending_messages,
    wait_settled,
    wait_terminal,
)
from test_scale_out import check_runs

from accord.adapters import open_store, open_transport
from accord.cli.workflow import compile_file
from accord.contracts.sources import load_catalog
from accord.engine.machine.state import RunState
from accord.engine.ports import Shards, Store, Transport, shard_of
from accord.workflow.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
KILL_RUNS = int(os.environ.get("ACCORD_SHARD_KILL_RUNS", "400"))
PARTITION_RUNS = int(os.environ.get("ACCORD_SHARD_PARTITION_RUNS", "300"))
LEASE_MS = 2000
BEAT_MS = LEASE_MS // 4  # ShardKeeper's default beat
SLACK_S = 0.75  # a beat's own round trips and this test's 20 ms polling, on a loaded machine
SEED = 6_2026
TOOK = re.compile(r"^(\d+\.\d+) accord\.engine\.shards INFO engine (\S+) took shard\(s\) \[(.*)\]")
LOST = re.compile(r"^(\d+\.\d+) accord\.engine\.shards WARNING (.*(lost shard|not renewed).*)$")
REFUSED = re.compile(r"^(\d+\.\d+) accord\.engine\.shards WARNING .*lost shard .*")
UNFENCED = re.compile(
    r"^(\d+\.\d+) scale_out\.commits WARNING unfenced commit of (\S+) \(shard (\d+)\)"
)
FREEZES = 3  # whether e1 commits before its own beat drops its shards on waking is a race


@pytest.fixture(scope="module")
def plan_json(tmp_path_factory: pytest.TempPathFactory) -> tuple[Plan, Path]:
    catalog = load_catalog(ROOT / "schemas" / "contracts")
    plan = compile_file(ROOT / "workflows" / "model-ingest.yaml", catalog).unwrap()
    path = tmp_path_factory.mktemp("plan") / "model-ingest.plan.json"
    path.write_text(json.dumps(plan.to_json()))
    return plan, path


def engine_args(
    urls: tuple[str, str], plan: Path, n: int, *, count: int, prefix: str, go: Path
) -> list[str]:
    return ["engine", *urls, str(plan), f"e{n}", str(count), prefix, str(go), str(LEASE_MS)]


def fleet_for(
    tmp: Path, urls: tuple[str, str], marks: str, plan: Path, *, runs: int, tag: str
) -> tuple[Fleet, list[str]]:
    """Two engines, each starting half of ``runs`` once ``tmp/go`` exists; four workers."""
    counts = [runs // 2 + (n < runs % 2) for n in range(2)]
    go = tmp / "go"
    fleet = Fleet(
        tmp,
        engine_args=[
            engine_args(urls, plan, n, count=c, prefix=f"{tag}{n}x", go=go)
            for n, c in enumerate(counts)
        ],
        worker_args=["worker", urls[1], REDIS, marks, str(SEED), str(tmp), str(SLOTS)],
    )
    return fleet, [f"run_{tag}{n}x{i:05d}" for n, c in enumerate(counts) for i in range(c)]


async def owners(store: Store) -> dict[int, tuple[str, int]]:
    """``shard → (owner, epoch)`` as the store holds the leases now."""
    assert isinstance(store, Shards), f"{type(store).__name__} keeps no shard leases"
    return {lease.shard: (lease.owner, lease.epoch) for lease in await store.shard_leases()}


async def wait_owners(
    store: Store, fleet: Fleet, check: Callable[[dict[str, set[int]]], bool], timeout_s: float
) -> float:
    """Poll the leases every 20 ms until ``check(owner → shards)``; the monotonic time it held."""
    deadline = time.monotonic() + timeout_s
    while True:
        fleet.supervise()
        by_owner: dict[str, set[int]] = {}
        for shard, (owner, _) in (await owners(store)).items():
            by_owner.setdefault(owner, set()).add(shard)
        if check(by_owner):
            return time.monotonic()
        assert time.monotonic() < deadline, f"shard owners {by_owner} after {timeout_s} s"
        await asyncio.sleep(0.02)


def split(by_owner: dict[str, set[int]]) -> bool:
    return {len(by_owner.get("e0", ())), len(by_owner.get("e1", ()))} == {SHARDS // 2}


def all_of(owner: str) -> Callable[[dict[str, set[int]]], bool]:
    return lambda by_owner: by_owner.get(owner, set()) == set(range(SHARDS))


async def states(store: Store, run_ids: list[str]) -> dict[str, RunState | None]:
    got = await asyncio.gather(*map(store.load, run_ids))
    pairs = zip(run_ids, got, strict=True)
    return {r: None if s is None else RunState.from_json(s.state) for r, s in pairs}


async def wait_progress(
    store: Store, run_ids: list[str], fleet: Fleet, ended: float, timeout_s: float = 120
) -> None:
    """Every run exists (both engines are past their starts) and ``ended`` of them are terminal."""
    deadline = time.monotonic() + timeout_s
    while True:
        fleet.supervise()
        now = await states(store, run_ids)
        done = sum(1 for s in now.values() if s is not None and s.terminal)
        if all(s is not None for s in now.values()) and done >= ended * len(run_ids):
            return
        assert time.monotonic() < deadline, f"{done} of {len(run_ids)} runs ended in {timeout_s} s"
        await asyncio.sleep(0.25)


def log_lines(
    path: Path, pattern: re.Pattern[str], since: float, until: float = float("inf")
) -> list[re.Match[str]]:
    """The lines of ``path`` matching ``pattern`` logged from ``since`` to ``until`` (wall)."""
    lines = (pattern.match(line) for line in path.read_text().splitlines())
    return [m for m in lines if m is not None and since <= float(m.group(1)) <= until]


def lapses(tmp: Path) -> dict[str, list[str]]:
    """Each engine's ``not renewed`` lines: beats held up past the lease (a loaded machine)."""
    return {
        log.stem: [m.group(2) for m in log_lines(log, LOST, 0) if "not renewed" in m.group(2)]
        for log in sorted(tmp.glob("engine*.stderr"))
    }


def took_at(path: Path, shards: set[int], since: float, wait_s: float = 5.0) -> float:
    """The wall time by which the engine logging to ``path`` had taken all of ``shards`` (the
    store may show the lease a moment before the engine's log line is written: read again for
    up to ``wait_s``)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = set(shards)
        for match in log_lines(path, TOOK, since):
            left -= {int(s) for s in match.group(3).split(",")}
            if not left:
                return float(match.group(1))
        if time.monotonic() > deadline:
            raise AssertionError(f"{path.name} never logged taking {sorted(left)} after {since}")
        time.sleep(0.1)


async def assert_drained(
    store: Store, transport: Transport, plan: Plan, run_ids: list[str]
) -> dict[str, int]:
    """The scale-out soak's end checks: I1, I12, I2–I6 per run, I7, every queue empty."""
    refused = await check_runs(store, plan, run_ids)
    assert await store.claim_outbox(1000, "drain-check", 0) == [], "I7: outbox not drained"
    for queue in ALL_QUEUES:
        assert await pending_messages(transport, queue) == 0, f"I1: {queue} not drained"
        assert await transport.dead_letters(queue) == [], f"dead letters on {queue}"
    return dict(refused)


def engine_reports(reports: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {str(r["owner"]): r for r in reports if "transitions" in r}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("broker", "backing"),
    [("bullmq", "redis"), ("rabbitmq", "redis"), ("bullmq", "redis-cluster")],
)
async def test_kill_9_of_an_engine_owning_shards_mid_soak(
    broker: str, backing: str, tmp_path: Path, plan_json: tuple[Plan, Path]
) -> None:
    plan, plan_path = plan_json
    async with keyspace(broker, backing) as (store_url, transport_url, marks):
        urls = (store_url, transport_url)
        runs = KILL_RUNS if broker == "bullmq" else min(KILL_RUNS, 300)  # RabbitMQ: the routing
        fleet, run_ids = fleet_for(tmp_path, urls, marks, plan_path, runs=runs, tag="kill")
        store, transport = open_store(store_url), open_transport(transport_url)
        try:
            fleet.start()
            await wait_owners(store, fleet, split, timeout_s=LEASE_MS / 1000 + 5)
            began = time.perf_counter()
            (tmp_path / "go").touch()
            await wait_progress(store, run_ids, fleet, ended=0.2)
            before = await owners(store)
            victim = {s for s, (owner, _) in before.items() if owner == "e1"}
            assert len(victim) == SHARDS // 2, f"e1 owns its share before the kill: {before}"
            killed_wall, killed_at = time.time(), time.monotonic()
            fleet.kill_engine(1)
            took = await wait_owners(store, fleet, all_of("e0"), LEASE_MS / 1000 + 10) - killed_at
            logged = took_at(tmp_path / "engine0.stderr", victim, killed_wall) - killed_wall
            after = await owners(store)
            assert all(after[s][1] > before[s][1] for s in victim), f"new epochs: {after}"
            at_kill = await states(store, run_ids)
            ended_at_kill = sum(1 for s in at_kill.values() if s is not None and s.terminal)
            # the killed engine comes back under its name: it rejoins and takes its share back
            restarted_at = time.monotonic()
            again = engine_args(urls, plan_path, 1, count=0, prefix="none", go=tmp_path / "go")
            fleet.restart_engine(1, again)
            rejoined = await wait_owners(store, fleet, split, LEASE_MS / 1000 + 10) - restarted_at
            await wait_terminal(store, run_ids, fleet, timeout_s=240)
            elapsed = time.perf_counter() - began
            await wait_settled(transport, fleet)
            reports = engine_reports(fleet.stop())
            refused = await assert_drained(store, transport, plan, run_ids)
        finally:
            fleet.kill()
            await transport.close()  # also after a failure: no connection left for GC to find
            await store.close()
    bound = (LEASE_MS + BEAT_MS) / 1000
    print(
        f"\nshard kill -9 {broker} on {backing}: {runs} runs in {elapsed:.1f} s; e1 killed "
        f"with {ended_at_kill} ended, owning {sorted(victim)}; e0 owned every shard {took:.2f} s "
        f"later (its log: {logged:.2f} s; lease + beat = {bound:.2f} s); the restarted e1 had "
        f"its share back {rejoined:.2f} s after its start; worker restarts {fleet.restarts}; "
        f"refused {refused}; leases lapsed under load {lapses(tmp_path)}; engines {reports}"
    )
    assert took <= bound + SLACK_S, f"takeover took {took:.2f} s, over lease + beat {bound} s"
    assert set(reports) == {"e0", "e1"}, f"both engines stopped gracefully: {reports}"
    assert reports["e0"]["shards_gained"] >= SHARDS, "e0 took the killed engine's shards"
    # e0 gives the restarted e1 its share by handing it over; on a loaded machine e0's beat can
    # be held up past its lease first, and then e0 drops its leases itself (logged ``not
    # renewed`` or ``lost shard(s)``) and e1 takes its share as free leases
    e0 = reports["e0"]
    moved = e0["shards_handed_over"] + e0["shards_lost_leases"]
    assert moved >= SHARDS // 2, f"e0 gave the restarted e1 its share: {e0}"
    if e0["shards_handed_over"] < SHARDS // 2:
        dropped = log_lines(tmp_path / "engine0.stderr", LOST, killed_wall)
        assert dropped, f"e0 let its share go by a lapse it logged: {e0}"


@dataclass
class Freeze:
    """One SIGSTOP of ``e1``: what it owned and had in flight, and when it stopped and woke."""

    stale: set[int]
    in_flight: list[str]
    stopped_wall: float
    took_s: float = 0.0
    moved: list[str] = field(default_factory=list)
    held_s: float = 0.0
    resumed_wall: float = 0.0
    rejoined_wall: float = 0.0


async def freeze(store: Store, fleet: Fleet, run_ids: list[str], *, wait_moved: bool) -> Freeze:
    """SIGSTOP ``e1`` past its lease, until ``e0`` owns every shard (and, with ``wait_moved``,
    until a few of ``e1``'s runs in flight have ended under ``e0``); SIGCONT; wait until the two
    have split the shards again."""
    stale = {s for s, (owner, _) in (await owners(store)).items() if owner == "e1"}
    assert len(stale) == SHARDS // 2, f"e1 owns its share before it stops: {stale}"
    now = await states(store, run_ids)
    in_flight = [
        r
        for r, s in now.items()
        if s is not None and not s.terminal and shard_of(r, SHARDS) in stale
    ]
    # the first stop must catch runs of e1's shards in flight (the ones that move to e0); the
    # later ones show the refusal and the rejoining, whatever is still running by then
    assert in_flight or not wait_moved, "runs of e1's shards are in flight when it stops"
    stopped_at = time.monotonic()
    done = Freeze(stale, in_flight, time.time())
    fleet.engines[1].send_signal(signal.SIGSTOP)
    # what e1 sent before it stopped lands within moments; from then on it sends nothing, so a
    # run of its shards that ends after this snapshot ended under e0
    await asyncio.sleep(0.2)
    now = await states(store, in_flight)
    done.in_flight = in_flight = [r for r, s in now.items() if s is not None and not s.terminal]
    done.took_s = await wait_owners(store, fleet, all_of("e0"), LEASE_MS / 1000 + 10) - stopped_at
    deadline = time.monotonic() + 30
    while wait_moved and time.monotonic() < deadline:
        now = await states(store, in_flight)
        done.moved = [r for r, s in now.items() if s is not None and s.terminal]
        if len(done.moved) >= min(5, len(in_flight)):
            break
        await asyncio.sleep(0.1)
    while time.monotonic() - stopped_at < (LEASE_MS + BEAT_MS) / 1000:
        await asyncio.sleep(0.05)
    done.held_s = time.monotonic() - stopped_at
    done.resumed_wall = time.time()
    fleet.engines[1].send_signal(signal.SIGCONT)
    await wait_owners(store, fleet, split, LEASE_MS / 1000 + 10)
    done.rejoined_wall = time.time()
    return done


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_partitioned_engine_commits_nothing_after_its_lease_and_its_runs_finish_elsewhere(
    tmp_path: Path, plan_json: tuple[Plan, Path]
) -> None:
    plan, plan_path = plan_json
    async with keyspace("bullmq") as (store_url, transport_url, marks):
        urls = (store_url, transport_url)
        fleet, run_ids = fleet_for(
            tmp_path, urls, marks, plan_path, runs=PARTITION_RUNS, tag="part"
        )
        store, transport = open_store(store_url), open_transport(transport_url)
        freezes: list[Freeze] = []
        try:
            fleet.start()
            await wait_owners(store, fleet, split, timeout_s=LEASE_MS / 1000 + 5)
            (tmp_path / "go").touch()
            await wait_progress(store, run_ids, fleet, ended=0.2)
            for n in range(FREEZES):
                freezes.append(await freeze(store, fleet, run_ids, wait_moved=n == 0))
            await wait_terminal(store, run_ids, fleet, timeout_s=240)
            await wait_settled(transport, fleet)
            reports = engine_reports(fleet.stop())
            refused = await assert_drained(store, transport, plan, run_ids)
        finally:
            fleet.kill()
            await transport.close()  # also after a failure: no connection left for GC to find
            await store.close()
    log, first = tmp_path / "engine1.stderr", freezes[0]
    noticed: list[list[str]] = []
    landed: list[str] = []
    for f in freezes:
        awake = (f.resumed_wall, f.rejoined_wall)
        noticed.append([m.group(2) for m in log_lines(log, LOST, *awake)])
        landed += [
            m.group(0) for m in log_lines(log, UNFENCED, *awake) if int(m.group(3)) in f.stale
        ]
    refusals = [m.group(0) for m in log_lines(log, REFUSED, 0)]
    e1 = reports["e1"]
    print(
        f"\nshard partition bullmq: {len(freezes)} SIGSTOPs of e1, each "
        + "; ".join(
            f"{f.held_s:.2f} s owning {sorted(f.stale)} with {len(f.in_flight)} runs in flight, "
            f"e0 owning every shard {f.took_s:.2f} s after the stop, e1 back "
            f"{f.rejoined_wall - f.resumed_wall:.2f} s after SIGCONT"
            for f in freezes
        )
        + f"; {len(first.moved)} of e1's runs ended under e0 while it was stopped; e1 on waking: "
        f"{noticed}; commits refused for ownership lost: {e1['ownership_lost']} ({refusals}); "
        f"refused {refused}; leases lapsed {lapses(tmp_path)}; engines {reports}"
    )
    for f in freezes:
        assert f.held_s * 1000 > LEASE_MS, f"e1 was stopped past its lease ({f.held_s:.2f} s)"
        assert f.took_s <= (LEASE_MS + BEAT_MS) / 1000 + SLACK_S, f"takeover: {f.took_s:.2f} s"
    assert first.moved, "runs of e1's shards in flight when it stopped ended under e0"
    assert all(noticed), f"e1 noticed on waking, each time, that its shards were gone: {noticed}"
    # what e1 tried under a stale lease was refused (fenced) or not tried at all: no commit of
    # a run of its lost shards went out unfenced between its waking and its taking them back
    assert not landed, f"e1 committed runs of shards it had lost, unfenced: {landed}"
    assert e1["ownership_lost"] >= len(refusals), "each refusal logged was counted"
