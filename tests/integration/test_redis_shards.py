"""Shard ownership on the Redis store, under races the contract suite does not make.

Two store handles (two connections, two call groups) race for the same leases and the same runs:
a lease is only ever held by one engine at one epoch, and a commit made under a fence either lands
while that fence holds or is refused with OwnershipLost, never alongside the new owner's commit at
the same version. A keyspace made when the limit was 100 shards (``{s07}``) still opens; a store of
256 shards commits and claims in shard 200; ``replicas=N`` still guards every epoch.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from accord.adapters._store_rules import MAX_SHARDS
from accord.adapters.stores.redis import RedisStore
from accord.adapters.stores.redis.keys import order_key
from accord.engine.ports import Commit, Fence, OutboxEntry, Timer, shard_of
from accord.errors import ConflictError, OwnershipLost, StoreError
from accord.testing.clock import FakeClock

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # tests/integration is no package: reach tests.services from the root
    sys.path.insert(0, ROOT)
from tests.services import REDIS_DB, REDIS_PORT, ensure_redis, redis_url  # noqa: E402

TTL = 1_000


def runs_in(shard: int, count: int, shards: int, stem: str = "r") -> list[str]:
    """``count`` run ids that land in ``shard`` of a store of ``shards`` shards."""
    found: list[str] = []
    k = 0
    while len(found) < count:
        if shard_of(f"{stem}{k}", shards) == shard:
            found.append(f"{stem}{k}")
        k += 1
    return found


@pytest.fixture
async def raw() -> AsyncIterator[aioredis.Redis]:
    ensure_redis()
    client = aioredis.Redis(port=REDIS_PORT, db=REDIS_DB, decode_responses=True)
    yield client
    await client.aclose()


async def two_handles(url: str, clock: FakeClock) -> tuple[RedisStore, RedisStore]:
    ensure_redis()
    return await RedisStore.connect(url, clock), await RedisStore.connect(url, clock)


async def test_concurrent_holds_from_two_handles_never_both_hold_a_shard() -> None:
    clock, count = FakeClock(), 16
    a, b = await two_handles(redis_url(shards=count), clock)
    rng = random.Random(7)
    owner_of: dict[tuple[int, int], set[str]] = {}  # (shard, epoch) -> engines told they hold it
    last_epoch = [0] * count
    changes = 0
    try:
        for step in range(60):
            calls = []
            for n in range(6):  # three racing calls per engine per step, on two connections
                handle, engine = (a, "e1") if n % 2 == 0 else (b, "e2")
                wanted = rng.sample(range(count), rng.randint(1, count))
                calls.append((engine, handle.hold_shards(engine, wanted, TTL)))
            answers = await asyncio.gather(*(call for _, call in calls))
            held: dict[str, set[int]] = {"e1": set(), "e2": set()}
            for (engine, _), answer in zip(calls, answers, strict=True):
                held[engine] |= set(answer)
                for shard, epoch in answer.items():
                    owner_of.setdefault((shard, epoch), set()).add(engine)
                    assert epoch >= last_epoch[shard], f"shard {shard}'s epoch went back"
                    changes += epoch > last_epoch[shard]
                    last_epoch[shard] = max(last_epoch[shard], epoch)
            assert not held["e1"] & held["e2"], f"step {step}: both hold {held['e1'] & held['e2']}"
            if step % 3 == 2:
                clock.advance(TTL)  # every lease lapses: the next step races for all of them
            elif step % 5 == 0:
                await rng.choice([a, b]).release_shards(rng.choice(["e1", "e2"]), range(count))
        assert all(len(engines) == 1 for engines in owner_of.values()), owner_of
        assert changes > count * 5  # the shards really changed hands, many times
        leases = {lease.shard: lease for lease in await a.shard_leases()}
        assert sorted(leases) == list(range(count))
        assert all(leases[s].epoch == last_epoch[s] for s in range(count))
        assert all({leases[s].owner} == owner_of[(s, last_epoch[s])] for s in range(count))
    finally:
        await a.close()
        await b.close()


def box(run_id: str, engine: int) -> list[OutboxEntry]:
    return [OutboxEntry(f"{run_id}-e{engine}", run_id, "job:q", {}, 1)]


async def race_once(
    a: RedisStore, b: RedisStore, clock: FakeClock, shard: int, runs: list[str]
) -> list[str]:
    """e1 (handle ``a``) commits every run of ``runs`` again under its fence, in waves, while e2
    (handle ``b``) takes the shard over and commits every run at the same version; checks each
    run's outcome and returns e1's ("landed" or "refused"), run by run."""
    old = Fence(shard, "e1", (await a.hold_shards("e1", [shard], TTL))[shard])
    await asyncio.gather(*(a.commit(Commit(r, 0, {"by": "e1"}, fence=old)) for r in runs))
    clock.advance(TTL)  # e1's lease lapses; until someone takes it, its fence still holds

    taken = asyncio.Event()  # set once e2's hold has answered: e1 commits made later must fail

    async def stale(run_id: str, wave: int) -> str:
        if wave < 0:
            await taken.wait()
        for _ in range(wave):
            await asyncio.sleep(0)
        try:
            await a.commit(
                Commit(run_id, 1, {"by": "e1"}, [{"v2": "e1"}], box(run_id, 1), fence=old)
            )
        except OwnershipLost as lost:
            assert (lost.shard, lost.owner, lost.epoch) == (shard, "e1", old.epoch)
            return "refused"
        return "landed"

    async def fresh(run_id: str, new: Fence) -> str:
        try:
            await b.commit(
                Commit(run_id, 1, {"by": "e2"}, [{"v2": "e2"}], box(run_id, 2), fence=new)
            )
        except ConflictError:
            return "conflict"
        return "landed"

    async def takeover() -> list[str]:
        for _ in range(3):
            await asyncio.sleep(0)
        epoch = (await b.hold_shards("e2", [shard], TTL))[shard]
        assert epoch == old.epoch + 1
        taken.set()
        new = Fence(shard, "e2", epoch)
        return list(await asyncio.gather(*(fresh(r, new) for r in runs)))

    waves = [n % 8 - 1 for n in range(len(runs))]  # -1: after the takeover is known
    stales = asyncio.gather(*(stale(r, wave) for r, wave in zip(runs, waves, strict=True)))
    mine, theirs = await asyncio.gather(stales, takeover())
    assert all(m == "refused" for m, wave in zip(mine, waves, strict=True) if wave < 0)
    for run_id, old_one, new_one in zip(runs, mine, theirs, strict=True):
        loaded = await a.load(run_id)
        assert loaded is not None and loaded.version == 2
        history = await a.history(run_id)
        if old_one == "landed":  # before the takeover: e2's commit then met version 2
            assert new_one == "conflict" and loaded.state == {"by": "e1"}
            assert history == [{"v2": "e1"}]
        else:  # after it: e2's landed, and never both at version 2
            assert new_one == "landed" and loaded.state == {"by": "e2"}
            assert history == [{"v2": "e2"}]
    # the shard's stream is in the server's order: every commit of e1 ran before every one of e2
    stream = await a.client.xrange(a.keys.shards[shard].outbox)
    order = [fields["e"][-2:] for _, fields in stream if fields["r"] in runs]
    assert order == sorted(order) and len(order) == len(runs), order
    with pytest.raises(OwnershipLost):  # the deposed owner stays deposed
        await a.commit(Commit(runs[0], 2, {"by": "e1"}, fence=old))
    await b.release_shards("e2", [shard])
    return list(mine)


async def test_a_fenced_commit_racing_a_takeover_lands_under_its_fence_or_is_refused() -> None:
    clock, count, shard = FakeClock(), 4, 2
    a, b = await two_handles(redis_url(shards=count), clock)
    try:
        outcomes: list[str] = []
        for trial in range(5):
            runs = runs_in(shard, 40, count, stem=f"t{trial}-")
            outcomes += await race_once(a, b, clock, shard, runs)
        print(f"fenced commits racing a takeover: {outcomes.count('landed')} landed before it,"
              f" {outcomes.count('refused')} refused after it")  # fmt: skip
        assert {"landed", "refused"} <= set(outcomes)  # the race was a real one
    finally:
        await a.close()
        await b.close()


async def test_an_8_shard_keyspace_made_before_the_limit_was_raised_still_opens_and_commits(
    raw: aioredis.Redis,
) -> None:
    url = redis_url(shards=8)
    prefix = url.split("prefix=")[1].split("&")[0]
    run_id = runs_in(7, 1, 8)[0]
    up = order_key(1_000)
    # what the store of the 100-shard limit left behind: the meta record and a two-digit tag
    await raw.hset(f"{prefix}:meta", "shards", 8)
    await raw.hset(
        f"{prefix}:{{s07}}:run:{run_id}",
        mapping={"v": 1, "state": '{"a":1}', "ix": '{"status":"running"}', "up": up},
    )
    await raw.rpush(f"{prefix}:{{s07}}:hist:{run_id}", '{"h":1}')
    index = {f"*|{up}|{run_id}": 0, f"status=7:running|{up}|{run_id}": 0}
    await raw.zadd(f"{prefix}:{{s07}}:idx", index)
    store = await RedisStore.connect(url, FakeClock())
    try:
        loaded = await store.load(run_id)
        assert loaded is not None and (loaded.version, loaded.state) == (1, {"a": 1})
        assert [r.run_id for r in await store.list_runs(status="running")] == [run_id]
        fence = Fence(7, "e1", (await store.hold_shards("e1", [7], TTL))[7])
        outbox = [OutboxEntry("o1", run_id, "job:q", {"x": 1}, 1)]
        assert await store.commit(Commit(run_id, 1, {"a": 2}, [{"h": 2}], outbox, fence=fence)) == 2
        assert await raw.hget(f"{prefix}:{{s07}}:run:{run_id}", "v") == "2"
        assert await raw.lrange(f"{prefix}:{{s07}}:hist:{run_id}", 0, -1) == ['{"h":1}', '{"h":2}']
        assert await raw.hget(f"{prefix}:{{s07}}:lease", "owner") == "e1"
        assert [e.entry_id for e in await store.claim_outbox(10, "d", 1, shards=[7])] == ["o1"]
    finally:
        await store.close()
    with pytest.raises(StoreError, match="created with shards=8"):
        await RedisStore.connect(url.replace("shards=8", "shards=256"), FakeClock())


async def test_a_store_of_256_shards_commits_and_claims_in_shard_200(raw: aioredis.Redis) -> None:
    ensure_redis()
    url, clock = redis_url(shards=256), FakeClock()
    prefix = url.split("prefix=")[1].split("&")[0]
    store = await RedisStore.connect(url, clock)
    try:
        run_id = runs_in(200, 1, 256)[0]
        fence = Fence(200, "e1", (await store.hold_shards("e1", [200], TTL))[200])
        commit = Commit(
            run_id, 0, {"a": 1},
            outbox=[OutboxEntry("o200", run_id, "job:q", {"x": 1}, 1)],
            timers_set=[Timer("t200", run_id, 50, {"t": 1})],
            fence=fence,
        )  # fmt: skip
        assert await store.commit(commit) == 1
        assert await raw.hget(f"{prefix}:{{s200}}:run:{run_id}", "v") == "1"
        assert await store.claim_outbox(10, "d", 1_000, shards=[199, 201]) == []
        assert await store.claim_timers(100, 10, "d", 1_000, shards=[0]) == []
        claimed = await store.claim_outbox(10, "d", 1_000, shards=[200])
        assert [e.entry_id for e in claimed] == ["o200"]
        assert [t.timer_id for t in await store.claim_timers(100, 10, "d", 1_000)] == ["t200"]
        assert [(s.shard, s.owner) for s in await store.shard_leases()] == [(200, "e1")]
        every = await store.hold_shards("e2", range(256), TTL)  # one script per shard, pipelined
        assert len(every) == 255 and 200 not in every and set(every.values()) == {1}
        await store.leave("e2")
        assert await store.hold_shards("e1", range(256), TTL) == {
            n: 1 + (n != 200) for n in range(256)
        }
        with pytest.raises(ValueError, match="out of range"):
            await store.claim_outbox(10, "d", 1, shards=[256])
    finally:
        await store.close()


async def test_holding_every_shard_of_the_largest_store_is_a_few_round_trips() -> None:
    ensure_redis()
    store = await RedisStore.connect(redis_url(shards=MAX_SHARDS), FakeClock())
    try:
        started = time.perf_counter()
        held = await store.hold_shards("e1", range(MAX_SHARDS), TTL)
        took = time.perf_counter() - started
        assert held == dict.fromkeys(range(MAX_SHARDS), 1)
        assert len(await store.shard_leases()) == MAX_SHARDS
        print(f"hold_shards over {MAX_SHARDS} shards: {took * 1000:.1f} ms")
        assert took < 5  # a generous bound for a loaded machine; the figure is printed
    finally:
        await store.close()


async def test_with_replicas_a_lease_fewer_replicas_acknowledged_is_never_handed_out() -> None:
    ensure_redis()
    url = redis_url()
    plain = await RedisStore.connect(url, FakeClock())
    guarded = RedisStore.from_url(url + "&replicas=1&replica_wait_ms=5", plain.clock)
    try:
        await guarded.ready()
        if int((await plain.client.info("replication")).get("connected_slaves", 0)):
            pytest.skip("the shared Redis has replicas: this test needs one that has none")
        await plain.hold_shards("e0", [1], TTL)
        assert await guarded.hold_shards("e1", [1], TTL) == {}  # refused: nothing to wait for
        with pytest.raises(StoreError, match="indeterminate") as short:
            await guarded.hold_shards("e1", [0, 1], TTL)  # shard 0's new epoch is unreplicated
        assert short.value.retryable
        assert await guarded.beat("e1", TTL) == ["e1"]  # a beat changes no epoch: it answers
        await guarded.release_shards("e1", [0])  # nor does a release
        assert await plain.hold_shards("e0", [0], TTL) == {0: 2}
    finally:
        await guarded.close()
        await plain.close()
