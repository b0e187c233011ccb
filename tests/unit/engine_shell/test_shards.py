"""Shard assignment (pure) and the keeper's rules, on the in-memory store and a fake clock."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from accord.adapters.stores.memory import MemoryStore
from accord.engine.ports import Commit, shard_of
from accord.engine.runtime.shards import ShardKeeper, assign, shard_queue
from accord.errors import OwnershipLost
from accord.testing.clock import FakeClock

engines = st.lists(st.text("abcdef0123456789-", min_size=1, max_size=12), min_size=1, max_size=9,
                   unique=True)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(count=st.integers(1, 300), live=engines)
def test_every_shard_has_exactly_one_owner_and_the_load_is_bounded(
    count: int, live: list[str]
) -> None:
    mine = assign(count, live)
    owned = sorted(s for shards in mine.values() for s in shards)
    assert owned == list(range(count))
    even = count // len(live)
    assert all(len(shards) in (even, even + 1) for shards in mine.values())


@settings(max_examples=200, deadline=None)
@given(count=st.integers(1, 200), live=engines)
def test_every_engine_computes_the_same_assignment_whatever_order_it_sees(
    count: int, live: list[str]
) -> None:
    assert assign(count, live) == assign(count, list(reversed(live)))


@settings(max_examples=100, deadline=None)
@given(live=engines, joining=st.text("ghijk", min_size=1, max_size=6))
def test_an_engine_joining_gets_its_even_share(live: list[str], joining: str) -> None:
    after = assign(64, [*live, joining])
    assert len(after[joining]) >= 64 // (len(live) + 1)


def test_the_queue_of_a_shard_is_the_shared_one_with_a_single_shard() -> None:
    assert shard_queue("accord.outcomes", 0, 1) == "accord.outcomes"
    assert shard_queue("accord.outcomes", 3, 8) == "accord.outcomes.s3"


def keeper(store: MemoryStore, clock: FakeClock, owner: str, events: list[tuple[str, set[int],
           set[int]]]) -> ShardKeeper:  # fmt: skip
    k = ShardKeeper(store, clock, owner, base_queue="q", lease_ms=1000)

    async def listen(gained: frozenset[int], lost: frozenset[int]) -> None:
        events.append((owner, set(gained), set(lost)))

    k.listeners.append(listen)
    return k


async def test_two_keepers_split_the_shards_and_a_silent_one_is_taken_over() -> None:
    clock, events = FakeClock(), []
    store = MemoryStore(clock, shards=8)
    a, b = keeper(store, clock, "a", events), keeper(store, clock, "b", events)
    await a.step()
    assert set(a.owned) == set(range(8))  # alone: everything
    await b.step()  # b sees a and itself: its shards are still a's leases
    assert not b.owned
    await a.step()  # a gives b's share up
    await b.step()
    assert set(a.owned) | set(b.owned) == set(range(8)) and not set(a.owned) & set(b.owned)
    assert len(a.owned) == len(b.owned) == 4
    handed = set(b.owned)
    assert ("a", set(), handed) in events  # told before the release: intake stops first
    clock.advance(1001)  # a says nothing for a lease
    await b.step()
    assert set(b.owned) == set(range(8))
    assert all(b.owned[s] == 2 for s in range(8) if s not in handed)  # a new epoch


async def test_a_keeper_that_could_not_renew_for_a_lease_drops_everything_itself() -> None:
    clock, events = FakeClock(), []
    store = MemoryStore(clock, shards=4)
    a = keeper(store, clock, "a", events)
    await a.step()
    clock.advance(1000)
    b = keeper(store, clock, "b", events)
    await b.step()  # a's leases lapsed: b takes all
    assert set(b.owned) == set(range(4))
    await a.step()  # a wakes up: first drops what it held, then holds what it is assigned
    assert ("a", set(), {0, 1, 2, 3}) in events
    assert not set(a.owned) & set(b.owned)


async def test_a_refused_commit_drops_the_shard() -> None:
    clock, events = FakeClock(), []
    store = MemoryStore(clock, shards=2)
    a = keeper(store, clock, "a", events)
    await a.step()
    run = next(f"r{n}" for n in range(100) if shard_of(f"r{n}", 2) == 1)
    stale = a.fence(run)
    assert stale is not None and stale.shard == 1
    await store.release_shards("a", [1])
    await store.hold_shards("b", [1], 1000)
    try:
        await store.commit(Commit(run, 0, {}, fence=stale))
    except OwnershipLost as lost:
        a.lost(lost.shard, lost.epoch)
    await asyncio.sleep(0)
    assert 1 not in a.owned and a.fence(run) is None and not a.owns(run)
    assert ("a", set(), {1}) in events


async def test_an_unstarted_keeper_takes_every_run_unfenced() -> None:
    store = MemoryStore(FakeClock(), shards=4)
    k = ShardKeeper(store, FakeClock(), "a", base_queue="q")
    assert k.owns("anything") and k.fence("anything") is None and k.claim_shards() is None
