"""Claims and listings that span the Redis store's shards.

A crashed dispatcher's outbox entries come back after the lease (in the store's clock) and the
consumer group records the new owner; timers spread over every shard are each claimed once by
concurrent claimants; ``list_runs`` returns exactly what the memory store returns for the same
commits, ties and all.
"""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from accord.adapters.stores.memory import MemoryStore
from accord.adapters.stores.redis import RedisStore
from accord.engine.ports import Commit, OutboxEntry, Timer
from accord.testing.clock import FakeClock

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # tests/integration is no package: reach tests.services from the root
    sys.path.insert(0, ROOT)
from tests.services import ensure_redis, redis_url  # noqa: E402

# ---- helpers -------------------------------------------------------------------------------------


def box(entry_id: str, run_id: str = "r1") -> OutboxEntry:
    return OutboxEntry(entry_id, run_id, "job:q", {"id": entry_id}, created_at_ms=1)


@pytest.fixture
async def store() -> AsyncIterator[RedisStore]:
    ensure_redis()
    handle = await RedisStore.connect(redis_url(), FakeClock())
    yield handle
    await handle.close()


# ---- leases -----------------------------------------------------------------------------------


async def test_a_crashed_dispatchers_entries_are_reclaimed_after_the_lease() -> None:
    ensure_redis()
    clock, url = FakeClock(), redis_url()
    crashed = await RedisStore.connect(url, clock)
    await crashed.commit(Commit("r1", 0, {}, outbox=[box("o1"), box("o2"), box("o3")]))
    assert len(await crashed.claim_outbox(10, "d1", 1_000)) == 3
    await crashed.close()  # dies without marking anything done
    other = await RedisStore.connect(url, clock)
    assert await other.claim_outbox(10, "d2", 1_000) == []
    clock.advance(1_000)
    taken = await other.claim_outbox(10, "d2", 1_000)
    assert [e.entry_id for e in taken] == ["o1", "o2", "o3"]
    shard = other.keys.run("r1").shard
    pending = await other.client.xpending_range(shard.outbox, "accord", "-", "+", 10)
    assert {(p["consumer"], p["times_delivered"]) for p in pending} == {("d2", 2)}
    third = await RedisStore.connect(url, clock)  # knows nothing of the claim: asks every shard
    await third.outbox_done(["o1", "o2", "o3"])
    assert await other.client.xlen(shard.outbox) == 0
    assert await other.client.xpending_range(shard.outbox, "accord", "-", "+", 10) == []
    clock.advance(5_000)
    assert await third.claim_outbox(10, "d3", 1_000) == []
    for handle in (other, third):
        await handle.close()


async def test_timers_of_many_shards_are_each_claimed_once(store: RedisStore) -> None:
    for n in range(24):
        timer = Timer(f"t{n}", f"run{n}", 100 + n, {"n": n})
        await store.commit(Commit(f"run{n}", 0, {}, timers_set=[timer]))
    assert len({store.keys.shard_of(f"run{n}") for n in range(24)}) == store.keys.shard_count
    second = await RedisStore.connect(
        f"redis://127.0.0.1:6379/15?prefix={store.keys.prefix}&shards=4", store.clock
    )

    async def claimant(handle: RedisStore, owner: str) -> list[str]:
        got: list[str] = []
        while batch := await handle.claim_timers(1_000, 5, owner, 60_000):
            got += [t.timer_id for t in batch]
        return got

    results = await asyncio.gather(*(claimant((store, second)[n % 2], f"o{n}") for n in range(6)))
    assert sorted(t for got in results for t in got) == sorted(f"t{n}" for n in range(24))
    await second.close()


async def test_list_runs_matches_the_memory_store_across_shards(store: RedisStore) -> None:
    memory = MemoryStore(store.clock)
    rnd = random.Random(7)
    versions: dict[str, int] = {}
    for step in range(120):
        run_id = f"run-{rnd.randrange(30):02d}"
        index = {"updated_at": str(rnd.randrange(8))}  # many ties: order then falls to run id
        if rnd.random() < 0.7:
            index["status"] = rnd.choice(["running", "done", "failed"])
        if rnd.random() < 0.5:
            index["region"] = rnd.choice(["eu", "us", "ünï|code"])
        commit = Commit(run_id, versions.get(run_id, 0), {"step": step}, index=index)
        versions[run_id] = await store.commit(commit)
        assert await memory.commit(commit) == versions[run_id]
    queries: list[dict[str, Any]] = [
        {}, {"limit": 7}, {"status": "running"}, {"status": "done", "limit": 3},
        {"region": "ünï|code"}, {"status": "failed", "region": "eu"}, {"tenant": "none"},
    ]  # fmt: skip
    for query in queries:
        want = [(r.run_id, r.version, r.state) for r in await memory.list_runs(**query)]
        got = [(r.run_id, r.version, r.state) for r in await store.list_runs(**query)]
        assert got == want, query
