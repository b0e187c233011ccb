"""The Shards contract (engine membership, shard leases, fenced commits, per-shard claims), run
over every store adapter (see conftest.py: every store of the suite is opened with 4 shards).

Leases are kept on the store's clock, so the fake clock moves them exactly."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from accord.engine.ports import Commit, Fence, OutboxEntry, Shards, Store, Timer, shard_of
from accord.errors import ConflictError, OwnershipLost
from accord.testing.clock import FakeClock

TTL = 5_000
SHARDS = 4


def run_in(shard: int, n: int = 0) -> str:
    """The ``n``-th run id (of ``r<k>``) that lands in ``shard`` of a 4-shard store."""
    found = [f"r{k}" for k in range(1000) if shard_of(f"r{k}", SHARDS) == shard]
    return found[n]


def shards(store: Store) -> Shards:
    assert isinstance(store, Shards)
    return store


async def test_the_store_has_the_shard_count_it_was_created_with(store: Store) -> None:
    assert shards(store).shard_count == SHARDS


async def test_a_beat_lists_the_live_engines_and_a_silent_one_drops_out(
    store: Store, clock: FakeClock
) -> None:
    s = shards(store)
    assert await s.beat("e2", TTL) == ["e2"]
    assert await s.beat("e1", TTL * 2) == ["e1", "e2"]
    clock.advance(TTL + 1)
    assert await s.beat("e3", TTL) == ["e1", "e3"]
    await s.leave("e1")
    assert await s.beat("e3", TTL) == ["e3"]


async def test_a_lease_is_exclusive_until_it_lapses_and_changes_hands_at_a_new_epoch(
    store: Store, clock: FakeClock
) -> None:
    s = shards(store)
    assert await s.hold_shards("e1", [0, 1], TTL) == {0: 1, 1: 1}
    assert await s.hold_shards("e2", [1, 2], TTL) == {2: 1}  # 1 is e1's
    clock.advance(TTL - 1)
    assert await s.hold_shards("e1", [0], TTL) == {0: 1}  # renewed at the same epoch
    clock.advance(2)  # e1's lease of shard 1 lapsed; shard 0 was renewed
    assert await s.hold_shards("e2", [0, 1], TTL) == {1: 2}
    assert await s.hold_shards("e1", [0, 1], TTL) == {0: 1}  # 1 is e2's now
    leases = {lease.shard: lease for lease in await s.shard_leases()}
    assert (leases[1].owner, leases[1].epoch) == ("e2", 2)
    assert (leases[0].owner, leases[0].epoch) == ("e1", 1)
    assert leases[0].expires_at_ms == clock.now_ms() + TTL


async def test_an_engines_own_lapsed_lease_is_taken_back_at_a_new_epoch(
    store: Store, clock: FakeClock
) -> None:
    s = shards(store)
    assert await s.hold_shards("e1", [3], TTL) == {3: 1}
    clock.advance(TTL)
    assert await s.hold_shards("e1", [3], TTL) == {3: 2}  # it may have changed hands meanwhile


async def test_released_and_left_leases_can_be_taken_at_once(
    store: Store, clock: FakeClock
) -> None:
    s = shards(store)
    await s.hold_shards("e1", [0, 1, 2], TTL)
    await s.release_shards("e1", [0])
    await s.release_shards("e2", [1])  # not e2's: nothing happens
    assert await s.hold_shards("e2", [0, 1], TTL) == {0: 2}
    await s.beat("e1", TTL)
    await s.leave("e1")
    assert await s.hold_shards("e2", [1, 2], TTL) == {1: 2, 2: 2}


async def test_a_fenced_commit_lands_while_the_lease_is_held(store: Store) -> None:
    s = shards(store)
    rid = run_in(2)
    epoch = (await s.hold_shards("e1", [2], TTL))[2]
    fence = Fence(2, "e1", epoch)
    assert await store.commit(Commit(rid, 0, {"a": 1}, fence=fence)) == 1
    assert await store.commit(Commit(rid, 1, {"a": 2}, fence=fence)) == 2


async def test_a_fenced_commit_after_a_takeover_is_refused_and_nothing_of_it_lands(
    store: Store, clock: FakeClock
) -> None:
    s = shards(store)
    rid = run_in(1)
    old = Fence(1, "e1", (await s.hold_shards("e1", [1], TTL))[1])
    await store.commit(Commit(rid, 0, {"a": 1}, history=[{"h": 1}], fence=old))
    clock.advance(TTL)
    new = Fence(1, "e2", (await s.hold_shards("e2", [1], TTL))[1])
    assert new.epoch == old.epoch + 1
    late = Commit(
        rid, 1, {"a": "stale"}, history=[{"h": "stale"}],
        outbox=[OutboxEntry("o-stale", rid, "job:q", {"x": 1}, 1)],
        timers_set=[Timer("t-stale", rid, 5, {"t": 1})],
        fence=old,
    )  # fmt: skip
    with pytest.raises(OwnershipLost) as lost:
        await store.commit(late)
    assert (lost.value.shard, lost.value.epoch) == (1, old.epoch)
    assert "ownership lost" in str(lost.value)
    loaded = await store.load(rid)
    assert loaded is not None and (loaded.version, loaded.state) == (1, {"a": 1})
    assert await store.history(rid) == [{"h": 1}]
    assert await store.claim_outbox(100, "x", 1) == []
    assert await store.claim_timers(2**62, 100, "x", 1) == []
    assert await store.commit(Commit(rid, 1, {"a": 3}, fence=new)) == 2


async def test_the_fence_is_checked_before_the_version(store: Store, clock: FakeClock) -> None:
    s = shards(store)
    rid = run_in(0)
    old = Fence(0, "e1", (await s.hold_shards("e1", [0], TTL))[0])
    await store.commit(Commit(rid, 0, {"a": 1}, fence=old))
    await s.release_shards("e1", [0])
    await s.hold_shards("e2", [0], TTL)
    with pytest.raises(OwnershipLost):
        await store.commit(Commit(rid, 7, {"a": 2}, fence=old))  # stale on both counts
    with pytest.raises(ConflictError):  # an unfenced commit knows only versions
        await store.commit(Commit(rid, 7, {"a": 2}))


async def test_a_fence_on_a_shard_never_leased_is_refused(store: Store) -> None:
    with pytest.raises(OwnershipLost):
        await store.commit(Commit(run_in(3), 0, {"a": 1}, fence=Fence(3, "e1", 1)))


async def test_claims_can_be_limited_to_shards(store: Store) -> None:
    by_shard = {n: run_in(n) for n in range(SHARDS)}
    for n, rid in by_shard.items():
        await store.commit(
            Commit(
                rid, 0, {"n": n},
                outbox=[OutboxEntry(f"o{n}", rid, "job:q", {"n": n}, 1)],
                timers_set=[Timer(f"t{n}", rid, 10, {"n": n})],
            )
        )  # fmt: skip
    assert await store.claim_outbox(100, "x", 1, shards=[]) == []
    got = await store.claim_outbox(100, "x", 1_000_000, shards=[1, 3])
    assert sorted(e.entry_id for e in got) == ["o1", "o3"]
    timers = await store.claim_timers(100, 100, "x", 1_000_000, shards=[2])
    assert [t.timer_id for t in timers] == ["t2"]
    rest = await store.claim_timers(100, 100, "x", 1_000_000)
    assert sorted(t.timer_id for t in rest) == ["t0", "t1", "t3"]
    assert sorted(e.entry_id for e in await store.claim_outbox(100, "x", 1)) == ["o0", "o2"]


async def test_two_handles_see_one_set_of_leases(
    store_opener: Callable[[], Store], clock: FakeClock
) -> None:
    a, b = shards(store_opener()), shards(store_opener())
    assert await a.hold_shards("e1", [0], TTL) == {0: 1}
    assert await b.hold_shards("e2", [0], TTL) == {}
    await a.beat("e1", TTL)
    assert await b.beat("e2", TTL) == ["e1", "e2"]


async def test_a_shard_out_of_range_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="out of range"):
        await shards(store).hold_shards("e1", [SHARDS], TTL)
