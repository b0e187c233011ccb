"""Engines owning shards, in one process over one in-memory store (4 shards) and one in-memory
queue: the shards are split, each engine commits only its own runs (no compare-and-set
conflict), outcomes reaching the shared queue are forwarded to the owner, a graceful stop hands
the shards over at once, and a stale owner's commit is refused with "ownership lost" while the
run finishes under the new owner. Process-level faults (kill -9, SIGSTOP) are in
``test_shard_faults.py``."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable

import redis
from engine_shell_support import ACTIONS, assert_drained, wait_terminal, worker_fleet
from tests.services import REDIS_DB, REDIS_PORT, ensure_redis, held_open, redis_url

from accord.adapters import open_store, open_transport
from accord.adapters.clock import SystemClock
from accord.adapters.stores.memory import MemoryStore
from accord.adapters.transports.memory import MemoryTransport
from accord.engine.machine.events import CancelRequested
from accord.engine.ports import shard_of
from accord.engine.runtime.intake import OUTCOMES_QUEUE
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.errors import OwnershipLost
from accord.testing.plans import QUEUES, model_ingest_shape
from accord.testing.workers import outcome

SHARDS = 4
LEASE_MS = 600


def engine(store: MemoryStore, transport: MemoryTransport, name: str) -> Engine:
    return Engine(
        store, transport, SystemClock(),
        options=EngineOptions(poll_ms=10, owner=name, shard_lease_ms=LEASE_MS, grace_ms=200),
        actions=ACTIONS,
    )  # fmt: skip


async def until(check: Callable[[], bool], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def split(engines: list[Engine]) -> bool:
    owned = [set(e.shards.owned) for e in engines]
    union = set().union(*owned)
    return union == set(range(SHARDS)) and sum(map(len, owned)) == SHARDS and all(owned)


async def test_two_engines_split_the_shards_and_never_conflict() -> None:
    clock = SystemClock()
    store, transport = MemoryStore(clock, shards=SHARDS), MemoryTransport(clock)
    a, b = engine(store, transport, "engine-a"), engine(store, transport, "engine-b")
    plan = model_ingest_shape(name="sharded", lookup_action=True, finaliser=True)
    await a.register_plan(plan)
    await a.start()
    await b.start()
    try:
        await until(lambda: split([a, b]))
        assert {len(a.shards.owned), len(b.shards.owned)} == {2}
        async with worker_fleet(transport):
            runs = [  # an engine picks fresh run ids in its own shards: started where owned
                await (a, b)[i % 2].start_run(plan.name, {"modelId": f"m{i}"}) for i in range(24)
            ]
            assert all((a, b)[i % 2].shards.owns(rid) for i, rid in enumerate(runs))
            given = [f"given-{i}" for i in range(8)]  # ids a requester chose: any shard
            runs += [await a.start_run(plan.name, {"modelId": g}, run_id=g) for g in given]
            assert not all(a.shards.owns(g) for g in given)
            await wait_terminal(store, runs)
        await a.executor.wait_idle()
        await b.executor.wait_idle()
        for run_id in runs:  # every commit after the start was made by the shard's owner
            owner = a if shard_of(run_id, SHARDS) in a.shards.owned else b
            assert owner.shards.owns(run_id)
        assert a.conflicts == b.conflicts == 0
        assert a.ownership_lost == b.ownership_lost == 0
        assert a.transitions > 0 and b.transitions > 0
        assert a.intake.lanes and b.intake.lanes
        await assert_drained(a, plan, runs, queues=(*QUEUES, *lanes(a, b)))
    finally:
        await b.stop()
        await a.stop()


def lanes(*engines: Engine) -> list[str]:
    return [queue for e in engines for queue in e.intake.lanes]


async def test_an_outcome_on_the_shared_queue_is_forwarded_to_the_owner() -> None:
    clock = SystemClock()
    store, transport = MemoryStore(clock, shards=SHARDS), MemoryTransport(clock)
    a, b = engine(store, transport, "engine-a"), engine(store, transport, "engine-b")
    plan = model_ingest_shape(name="forwarded")
    await a.register_plan(plan)
    await a.start()
    await b.start()
    try:
        await until(lambda: split([a, b]))
        run_id = next(
            f"run-{n}" for n in range(99) if shard_of(f"run-{n}", SHARDS) in b.shards.owned
        )
        await b.start_run(plan.name, {"modelId": "m"}, run_id=run_id)
        job = await anext(transport.consume("render", 1))
        envelope = json.loads(job.body)
        assert envelope["replyTo"] == b.shards.queue(shard_of(run_id, SHARDS))
        # an old-style worker answers on the shared queue; engine b does not read it alone
        await b.intake.stop()
        await transport.publish(OUTCOMES_QUEUE, *outcome(envelope, "accepted", worker_id="w"))
        await until(lambda: a.intake.forwarded == 1)
        await until(lambda: b.transitions >= 2)  # b took it from its own queue
        await transport.ack(job)
        run = await b.load(run_id)
        assert run is not None and run.stages["render"].status == "running"
        assert a.transitions == 0  # a only forwarded
    finally:
        await b.stop()
        await a.stop()


async def test_a_graceful_stop_hands_every_shard_over_at_once() -> None:
    clock = SystemClock()
    store, transport = MemoryStore(clock, shards=SHARDS), MemoryTransport(clock)
    a, b = engine(store, transport, "engine-a"), engine(store, transport, "engine-b")
    plan = model_ingest_shape(name="handover")
    await a.register_plan(plan)
    await a.start()
    await b.start()
    try:
        await until(lambda: split([a, b]))
        async with worker_fleet(transport):
            runs = [await a.start_run(plan.name, {"modelId": f"m{i}"}) for i in range(12)]
            started = time.monotonic()
            await a.stop()
            await until(lambda: set(b.shards.owned) == set(range(SHARDS)), LEASE_MS / 1000)
            took = time.monotonic() - started
            await wait_terminal(store, runs)
        assert took < LEASE_MS / 1000  # released, not lapsed
        assert b.conflicts == 0
    finally:
        await b.stop()


async def test_a_stale_owner_cannot_commit_and_the_run_finishes_under_the_new_owner() -> None:
    clock = SystemClock()
    store, transport = MemoryStore(clock, shards=SHARDS), MemoryTransport(clock)
    a = engine(store, transport, "engine-a")
    plan = model_ingest_shape(name="stale")
    await a.register_plan(plan)
    await a.start()
    b = engine(store, transport, "engine-b")
    try:
        run_id = await a.start_run(plan.name, {"modelId": "m"})
        shard = shard_of(run_id, SHARDS)
        stale_epoch = a.shards.owned[shard]
        await a.shards.stop(leave=False)  # a stalls: no more beats, its leases lapse
        a.shards.owned[shard] = stale_epoch  # ...and it still believes it owns the shard
        await asyncio.sleep(LEASE_MS / 1000 + 0.05)
        await b.start()
        await until(lambda: shard in b.shards.owned)
        before = len(await store.history(run_id))
        try:
            await a.deliver(CancelRequested(run_id=run_id, reason="stale", by="a"))
            raise AssertionError("the stale owner's commit landed")
        except OwnershipLost as lost:
            assert "ownership lost" in str(lost) and lost.epoch == stale_epoch
        assert len(await store.history(run_id)) == before  # nothing of it landed
        assert shard not in a.shards.owned and a.ownership_lost == 1
        async with worker_fleet(transport):
            await wait_terminal(store, [run_id])
        done = await b.load(run_id)
        assert done is not None and done.status == "completed"
    finally:
        await b.stop()
        await a.stop()


async def test_on_redis_and_bullmq_two_engines_split_the_shards_and_never_conflict() -> None:
    """The same split over real parts: the Redis store (4 shards, fenced commits in its commit
    script) and BullMQ queues, one queue per shard."""
    ensure_redis()
    clock = SystemClock()
    prefix = f"es{uuid.uuid4().hex[:10]}"
    store_url = redis_url(shards=SHARDS)
    transport_url = f"bullmq://127.0.0.1:{REDIS_PORT}/{REDIS_DB}?prefix={prefix}"
    ports = [(open_store(store_url, clock=clock), open_transport(transport_url, clock=clock))
             for _ in range(2)]  # fmt: skip
    a, b = (
        Engine(
            store,
            transport,
            clock,
            actions=ACTIONS,
            owns_ports=True,
            options=EngineOptions(poll_ms=10, owner=f"redis-{n}", shard_lease_ms=2000),
        )
        for n, (store, transport) in enumerate(ports)
    )
    plan = model_ingest_shape(name="sharded-redis", lookup_action=True)
    await a.register_plan(plan)
    await a.start()
    await b.start()
    try:
        await until(lambda: split([a, b]))
        async with worker_fleet(ports[0][1]):
            runs = [
                await (a, b)[i % 2].start_run(plan.name, {"modelId": f"m{i}"}) for i in range(30)
            ]
            await wait_terminal(a.store, runs)
        assert a.conflicts == b.conflicts == 0
        assert a.ownership_lost == b.ownership_lost == 0
        assert a.transitions > 0 and b.transitions > 0
        leases = await ports[0][0].shard_leases()  # type: ignore[attr-defined]
        assert sorted(lease.owner for lease in leases) == sorted(
            [a.owner] * len(a.shards.owned) + [b.owner] * len(b.shards.owned)
        )
    finally:
        await b.stop()
        await a.stop()
        client = held_open(redis.Redis(port=REDIS_PORT, db=REDIS_DB))
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
