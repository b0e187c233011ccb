"""The Store contract, run over every store adapter (see conftest.py)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

import pytest

from accord.engine.ports import Commit, OutboxEntry, Store, Timer
from accord.errors import ConflictError, ImmutableArtefactError, StoreError
from accord.testing.clock import FakeClock

LEASE = 10_000


def box(entry_id: str, run_id: str = "r1") -> OutboxEntry:
    return OutboxEntry(entry_id, run_id, "job:q", {"id": entry_id}, created_at_ms=1)


def timer(timer_id: str, due: int, run_id: str = "r1") -> Timer:
    return Timer(timer_id, run_id, due, {"timer": timer_id})


async def snapshot(store: Store, run_id: str = "r1") -> dict[str, Any]:
    """Everything a commit can touch, read back through the port (claims use a far-future now
    and are taken by a throwaway owner, so take the snapshot only once per test)."""
    run = await store.load(run_id)
    return {
        "run": run,
        "history": await store.history(run_id),
        "outbox": sorted(e.entry_id for e in await store.claim_outbox(1000, "snap", 1)),
        "timers": sorted(
            (t.timer_id, t.due_at_ms) for t in await store.claim_timers(2**62, 1000, "snap", 1)
        ),
    }


async def test_create_then_update_grows_the_version(store: Store) -> None:
    assert await store.load("r1") is None
    assert await store.commit(Commit("r1", 0, {"step": 1})) == 1
    assert await store.commit(Commit("r1", 1, {"step": 2})) == 2
    loaded = await store.load("r1")
    assert loaded is not None
    assert (loaded.version, loaded.state) == (2, {"step": 2})


async def test_create_conflicts_when_the_run_exists(store: Store) -> None:
    await store.commit(Commit("r1", 0, {"a": 1}))
    with pytest.raises(ConflictError):
        await store.commit(Commit("r1", 0, {"a": 2}, history=[{"h": 1}]))
    assert await store.history("r1") == []


async def test_update_of_a_missing_run_conflicts(store: Store) -> None:
    with pytest.raises(ConflictError):
        await store.commit(Commit("nope", 3, {"a": 1}))
    assert await store.load("nope") is None


async def test_cas_conflict_changes_nothing(store: Store) -> None:
    await store.commit(
        Commit(
            "r1", 0, {"v": 1}, [{"h": 1}], [box("o1")], [timer("t1", 100)], index={"status": "a"}
        )
    )
    await store.commit(Commit("r1", 1, {"v": 2}, [{"h": 2}]))
    stale = Commit(
        "r1", 1, {"v": "lost"}, [{"h": "lost"}], [box("o2")], [timer("t2", 50)], ["t1"],
        index={"status": "lost"},
    )  # fmt: skip
    with pytest.raises(ConflictError):
        await store.commit(stale)
    assert await store.list_runs(status="lost") == []
    after = await snapshot(store)
    assert after["run"].version == 2 and after["run"].state == {"v": 2}
    assert after["history"] == [{"h": 1}, {"h": 2}]
    assert after["outbox"] == ["o1"]
    assert after["timers"] == [("t1", 100)]


@pytest.mark.parametrize(
    "poison",
    [
        pytest.param({"outbox": [box("o9"), box("o9")]}, id="duplicate-outbox-id-in-commit"),
        pytest.param({"outbox": [box("o9"), box("o1")]}, id="outbox-id-already-pending"),
        pytest.param({"timers_set": [Timer("t9", "r1", 5, {"x": math.nan})]}, id="non-json"),
    ],
)
async def test_a_failing_commit_lands_nothing(store: Store, poison: dict[str, Any]) -> None:
    await store.commit(Commit("r1", 0, {"v": 1}, [{"h": 1}], [box("o1")], [timer("t1", 100)]))
    doomed = Commit(
        "r1", 1, {"v": "half"}, [{"h": "half"}, {"h": "half2"}], timers_cancel=["t1"], **poison
    )
    with pytest.raises(StoreError):
        await store.commit(doomed)
    after = await snapshot(store)
    assert after["run"].version == 1 and after["run"].state == {"v": 1}
    assert after["history"] == [{"h": 1}]
    assert after["outbox"] == ["o1"]
    assert after["timers"] == [("t1", 100)]


async def test_a_failing_create_leaves_no_run(store: Store) -> None:
    with pytest.raises(StoreError):
        await store.commit(Commit("r1", 0, {"v": 1}, [{"h": 1}], [box("o1"), box("o1")]))
    assert await store.load("r1") is None
    assert await store.history("r1") == []
    assert await store.commit(Commit("r1", 0, {"v": 1})) == 1


async def test_history_keeps_commit_order(store: Store) -> None:
    version = 0
    for n in range(5):
        version = await store.commit(
            Commit("r1", version, {"n": n}, [{"n": n, "part": 0}, {"n": n, "part": 1}])
        )
    assert await store.history("r1") == [{"n": n, "part": p} for n in range(5) for p in (0, 1)]
    assert await store.history("other") == []


async def test_returned_state_is_a_copy(store: Store) -> None:
    await store.commit(Commit("r1", 0, {"list": [1]}, [{"h": [1]}]))
    loaded = await store.load("r1")
    assert loaded is not None
    loaded.state["list"].append(2)
    (await store.history("r1"))[0]["h"].append(2)
    again = await store.load("r1")
    assert again is not None and again.state == {"list": [1]}
    assert await store.history("r1") == [{"h": [1]}]


async def test_only_due_timers_are_claimed_in_due_order(store: Store) -> None:
    timers = [timer("late", 300), timer("soon", 100), timer("mid", 200)]
    await store.commit(Commit("r1", 0, {}, timers_set=timers))
    assert await store.claim_timers(99, 10, "a", LEASE) == []
    claimed = await store.claim_timers(250, 10, "a", LEASE)
    assert [t.timer_id for t in claimed] == ["soon", "mid"]
    assert claimed[0] == timer("soon", 100)


async def test_a_claimed_timer_is_not_claimed_again_until_its_lease_lapses(store: Store) -> None:
    await store.commit(Commit("r1", 0, {}, timers_set=[timer("t1", 100)]))
    assert [t.timer_id for t in await store.claim_timers(100, 10, "a", LEASE)] == ["t1"]
    assert await store.claim_timers(100 + LEASE - 1, 10, "b", LEASE) == []
    assert [t.timer_id for t in await store.claim_timers(100 + LEASE, 10, "b", LEASE)] == ["t1"]


async def test_timer_claim_is_exclusive_under_concurrency(
    store_opener: Callable[[], Store],
) -> None:
    first, second = store_opener(), store_opener()
    due = [timer(f"t{i:03}", 100 + i) for i in range(60)]
    await first.commit(Commit("r1", 0, {}, timers_set=due))

    async def claimant(n: int) -> list[str]:
        handle = (first, second)[n % 2]
        got: list[str] = []
        while batch := await handle.claim_timers(1_000, 3, f"owner{n}", LEASE):
            got += [t.timer_id for t in batch]
        return got

    results = await asyncio.gather(*(claimant(n) for n in range(8)))
    everything = [t for got in results for t in got]
    assert sorted(everything) == [t.timer_id for t in due]  # each exactly once


async def test_resetting_a_timer_replaces_due_time_and_clears_its_lease(store: Store) -> None:
    await store.commit(Commit("r1", 0, {}, timers_set=[timer("t1", 100)]))
    assert len(await store.claim_timers(100, 10, "a", LEASE)) == 1
    await store.commit(Commit("r1", 1, {}, timers_set=[Timer("t1", "r1", 500, {"v": 2})]))
    assert await store.claim_timers(499, 10, "b", LEASE) == []
    assert await store.claim_timers(500, 10, "b", LEASE) == [Timer("t1", "r1", 500, {"v": 2})]


async def test_only_a_cancelling_commit_removes_a_timer(store: Store) -> None:
    await store.commit(Commit("r1", 0, {}, timers_set=[timer("t1", 100), timer("t2", 100)]))
    assert len(await store.claim_timers(100, 10, "a", LEASE)) == 2  # leased, not removed
    await store.commit(Commit("r1", 1, {}, timers_cancel=["t1", "never-set"]))
    assert [t.timer_id for t in await store.claim_timers(100 + LEASE, 10, "b", 1)] == ["t2"]


async def test_outbox_claim_lease_and_done(store: Store, clock: FakeClock) -> None:
    await store.commit(Commit("r1", 0, {}, outbox=[box("o1"), box("o2"), box("o3")]))
    first = await store.claim_outbox(2, "a", LEASE)
    assert [e.entry_id for e in first] == ["o1", "o2"]
    assert first[0] == box("o1")
    assert [e.entry_id for e in await store.claim_outbox(10, "b", LEASE)] == ["o3"]
    assert await store.claim_outbox(10, "c", LEASE) == []
    await store.outbox_done(["o1", "unknown"])
    clock.advance(LEASE)
    assert [e.entry_id for e in await store.claim_outbox(10, "d", LEASE)] == ["o2", "o3"]
    await store.outbox_done(["o2", "o3"])
    clock.advance(LEASE)
    assert await store.claim_outbox(10, "e", LEASE) == []


async def test_plans_are_immutable(store: Store) -> None:
    await store.put_plan("sha256:aa", {"stages": [1, 2]})
    await store.put_plan("sha256:aa", {"stages": [1, 2]})  # same content: fine
    with pytest.raises(ImmutableArtefactError):
        await store.put_plan("sha256:aa", {"stages": [2, 1]})
    assert await store.get_plan("sha256:aa") == {"stages": [1, 2]}
    assert await store.get_plan("sha256:bb") is None


async def test_activation_history(store: Store, clock: FakeClock) -> None:
    await store.put_plan("sha256:v1", {"v": 1})
    await store.put_plan("sha256:v2", {"v": 2})
    assert await store.get_active("ingest") is None
    with pytest.raises(StoreError, match="no plan stored"):
        await store.set_active("ingest", "sha256:missing")
    t0 = clock.now_ms()
    await store.set_active("ingest", "sha256:v1")
    clock.advance(5)
    await store.set_active("ingest", "sha256:v2")
    assert await store.get_active("ingest") == "sha256:v2"
    assert await store.get_active("other") is None
    versions = await store.plan_versions("ingest")  # type: ignore[attr-defined]
    assert versions == [
        {"digest": "sha256:v1", "activated_at_ms": t0, "active": False},
        {"digest": "sha256:v2", "activated_at_ms": t0 + 5, "active": True},
    ]


async def test_announcements_expire_and_are_replaced(store: Store) -> None:
    await store.announce("w1", ["mesh@1", "thumb@2"], expires_at_ms=1_000)
    await store.announce("w2", ["mesh@1"], expires_at_ms=2_000)
    assert await store.live_capabilities(999) == {"mesh@1": ["w1", "w2"], "thumb@2": ["w1"]}
    assert await store.live_capabilities(1_000) == {"mesh@1": ["w2"]}
    await store.announce("w2", ["scan@1"], expires_at_ms=3_000)
    assert await store.live_capabilities(1_500) == {"scan@1": ["w2"]}
    assert await store.live_capabilities(3_000) == {}


async def test_list_runs_filters_on_index_columns_and_labels(store: Store) -> None:
    rows = [
        ("r1", "running", "t1", "10"),
        ("r2", "done", "t1", "30"),
        ("r3", "running", "t2", "20"),
    ]
    for run_id, status, tenant, at in rows:
        index = {"status": status, "tenant": tenant, "workflow": "ingest", "updated_at": at}
        await store.commit(Commit(run_id, 0, {"id": run_id}, index=index | {"region": tenant}))
    assert [r.run_id for r in await store.list_runs()] == ["r2", "r3", "r1"]
    assert [r.run_id for r in await store.list_runs(status="running")] == ["r3", "r1"]
    assert [r.run_id for r in await store.list_runs(status="running", tenant="t1")] == ["r1"]
    assert [r.run_id for r in await store.list_runs(region="t2")] == ["r3"]
    assert [r.run_id for r in await store.list_runs(limit=1, workflow="ingest")] == ["r2"]
    await store.commit(Commit("r1", 1, {"id": "r1"}, index={"status": "done", "updated_at": "40"}))
    assert [r.run_id for r in await store.list_runs(status="done")] == ["r1", "r2"]
    assert [r.run_id for r in await store.list_runs(tenant="t1")] == ["r1", "r2"]  # kept
    with pytest.raises(StoreError, match="identifier"):
        await store.list_runs(100, **{"bad key'": "x"})


async def test_non_json_state_is_refused(store: Store) -> None:
    with pytest.raises(StoreError, match="state"):
        await store.commit(Commit("r1", 0, {"x": {1, 2}}))
    assert await store.load("r1") is None


async def test_concurrent_commits_succeed_or_fail_each_on_their_own(store: Store) -> None:
    """Writes that arrive together (the SQLite store groups them into one transaction) are still
    judged one by one: a conflict or a failure rolls back only its own commit."""
    await store.commit(Commit("taken", 0, {"v": 0}))
    good = [Commit(f"r{n}", 0, {"n": n}, [{"n": n}], [box(f"o{n}", f"r{n}")]) for n in range(20)]
    clash = [Commit("taken", 0, {"v": n}, [{"lost": n}]) for n in range(5)]
    broken = [Commit(f"b{n}", 0, {}, [{"b": n}], [box(f"x{n}"), box(f"x{n}")]) for n in range(5)]
    outcomes = await asyncio.gather(
        *(store.commit(c) for c in [*clash[:2], *good[:10], *broken, *good[10:], *clash[2:]]),
        return_exceptions=True,
    )
    assert sum(o == 1 for o in outcomes) == 20
    assert sum(isinstance(o, ConflictError) for o in outcomes) == 5
    assert sum(isinstance(o, StoreError) for o in outcomes) == 5
    for n in range(20):
        assert await store.history(f"r{n}") == [{"n": n}]
    for n in range(5):
        assert await store.load(f"b{n}") is None
    assert await store.history("taken") == []
    pending = await store.claim_outbox(100, "check", LEASE)
    assert sorted(e.entry_id for e in pending) == sorted(f"o{n}" for n in range(20))
