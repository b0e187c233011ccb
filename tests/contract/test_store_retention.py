"""Retention, over every store adapter (see conftest.py): :meth:`Store.prune` removes ended runs
whose last commit is older than the cutoff, with everything they left behind, and nothing else."""

from __future__ import annotations

from collections.abc import Callable

from accord.engine.ports import Commit, OutboxEntry, Store, Timer
from accord.testing.clock import FakeClock

DAY = 86_400_000
NOW = 100 * DAY


async def make_run(
    store: Store,
    run_id: str,
    status: str,
    at_ms: int,
    *,
    leftovers: bool = False,
    history: int = 3,
) -> None:
    """A run created and last committed at ``at_ms``, in ``status``; with ``leftovers`` it keeps
    a timer and an outbox entry, as an end that raced a timer or a dispatch may."""
    index = {"status": "running", "workflow": "wf", "tenant": "t1", "updated_at": str(at_ms - 1)}
    await store.commit(Commit(run_id, 0, {"run": run_id}, [{"seq": 0}], index=index))
    extras: dict[str, object] = {}
    if leftovers:
        extras = {
            "outbox": [OutboxEntry(f"o-{run_id}", run_id, "job:q", {"x": 1}, created_at_ms=1)],
            "timers_set": [Timer(f"t-{run_id}", run_id, 5, {"timer": "run"})],
        }
    await store.commit(
        Commit(
            run_id, 1, {"run": run_id, "status": status},
            [{"seq": n} for n in range(1, history)],
            index={"status": status, "updated_at": str(at_ms)},
            **extras,  # type: ignore[arg-type]
        )
    )  # fmt: skip


async def leftovers(store: Store) -> tuple[list[str], list[str]]:
    """Run ids of every pending timer and outbox entry (claimed far in the future, once)."""
    timers = await store.claim_timers(2**62, 1000, "check", 1)
    outbox = await store.claim_outbox(1000, "check", 1)
    return sorted(t.run_id for t in timers), sorted(e.run_id for e in outbox)


async def test_an_old_ended_run_goes_with_its_history_and_leftovers(store: Store) -> None:
    await make_run(store, "old-done", "completed", NOW - 40 * DAY, leftovers=True)
    await make_run(store, "old-failed", "failed", NOW - 31 * DAY)
    await make_run(store, "old-cancelled", "cancelled", NOW - 90 * DAY)
    await make_run(store, "keep", "running", NOW - 40 * DAY, leftovers=True)

    assert await store.prune(NOW - 30 * DAY, 100) == 3

    for gone in ("old-done", "old-failed", "old-cancelled"):
        assert await store.load(gone) is None
        assert await store.history(gone) == []
    assert [r.run_id for r in await store.list_runs()] == ["keep"]
    assert await store.list_runs(status="completed") == []
    assert await store.list_runs(workflow="wf", tenant="t1") != []
    assert await leftovers(store) == (["keep"], ["keep"])


async def test_recent_ended_runs_and_live_runs_of_any_age_are_kept(store: Store) -> None:
    await make_run(store, "recent", "completed", NOW - 29 * DAY)
    await make_run(store, "at-cutoff", "failed", NOW - 30 * DAY)
    await make_run(store, "ancient-running", "running", 1_000)
    await make_run(store, "ancient-finalising", "finalising", 1_000)

    assert await store.prune(NOW - 30 * DAY, 100) == 0

    kept = sorted(r.run_id for r in await store.list_runs())
    assert kept == ["ancient-finalising", "ancient-running", "at-cutoff", "recent"]
    for run_id in kept:
        assert await store.load(run_id) is not None
        assert len(await store.history(run_id)) == 3


async def test_prune_is_batched_and_idempotent(store: Store) -> None:
    for n in range(7):
        await make_run(store, f"r{n}", "completed", NOW - (40 + n) * DAY)
    await make_run(store, "young", "completed", NOW)
    cutoff = NOW - 30 * DAY

    assert await store.prune(cutoff, 3) == 3
    left = sorted(r.run_id for r in await store.list_runs())
    assert left == ["r0", "r1", "r2", "r3", "young"]  # the oldest went first
    assert await store.prune(cutoff, 3) == 3
    assert await store.prune(cutoff, 3) == 1
    assert await store.prune(cutoff, 3) == 0
    assert await store.prune(cutoff, 3) == 0
    assert [r.run_id for r in await store.list_runs()] == ["young"]


async def test_a_large_prune_spans_several_steps(store: Store) -> None:
    for n in range(250):  # more than one step of the store's own batching
        await make_run(store, f"bulk{n:03d}", "completed", NOW - 40 * DAY - n, history=1)
    await make_run(store, "live", "running", 1)
    assert await store.prune(NOW, 1_000) == 250
    assert [r.run_id for r in await store.list_runs(limit=1_000)] == ["live"]


async def test_a_pruned_run_can_be_named_again_and_the_end_time_is_the_store_clock(
    store_opener: Callable[[], Store], clock: FakeClock
) -> None:
    store = store_opener()
    index = {"status": "completed", "workflow": "wf"}
    await store.commit(Commit("again", 0, {"v": 1}, [{"h": 1}], index=index))  # updated_at: now
    ended_at = clock.now_ms()
    assert await store.prune(ended_at, 10) == 0  # not older than the cutoff
    clock.advance(1)
    other = store_opener()  # another handle on the same storage sees the same runs
    assert await other.prune(ended_at + 1, 10) == 1
    assert await store.load("again") is None
    assert await store.commit(Commit("again", 0, {"v": 2}, [{"h": 2}], index=index)) == 1
    assert await store.history("again") == [{"h": 2}]
