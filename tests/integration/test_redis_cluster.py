"""The Redis store on a real Redis Cluster (3 masters, 1 replica each, on loopback).

An engine runs model-ingest-shaped runs to completion with its store on ``redis+cluster://``
(the memory transport), the runs' shards spread over every master. Then a master is killed with
SIGKILL while runs are in flight, with ``replicas=1`` (every write waits for the master's replica
to have it): its replica is promoted, the store's errors meanwhile are retryable, the call group
reads the new slot map, and every run whose start was acknowledged completes; none is lost.
Also: a script call whose keys span two slots is refused before it is sent, bad cluster URLs are
refused naming the problem, and ``replicas=1`` waits on the write's own master (freezing one
master's replica makes only that master's writes indeterminate).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from redis import exceptions as rx
from redis.crc import key_slot

from accord.adapters import open_store, open_transport
from accord.adapters.clock import SystemClock
from accord.adapters.stores.redis import RedisStore
from accord.engine.machine.state import RunState
from accord.engine.ports import Commit
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.errors import StoreError
from accord.testing.plans import model_ingest_shape

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # tests/integration is no package: reach tests.services from the root
    sys.path.insert(0, ROOT)
from engine_shell_support import ACTIONS, assert_drained, worker_fleet  # noqa: E402
from tests.services import REDIS_PORT, RedisCluster, ensure_redis, ensure_redis_cluster  # noqa: E402

T = TypeVar("T")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RedisCluster]:
    """A cluster of the test's own (it kills a master), stopped and removed whatever happens."""
    own = RedisCluster(tmp_path / "cluster", node_timeout_ms=1500).start()
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture
async def engine_on() -> AsyncIterator[list[Engine]]:
    """Engines a test starts, stopped with their store and transport at teardown."""
    engines: list[Engine] = []
    yield engines
    for engine in engines:
        await engine.stop()
        await engine.store.close()
        await engine.transport.close()


async def start_engine(
    url: str,
    engines: list[Engine],
    plan_name: str,
    options: EngineOptions | None = None,
    transport_url: str = "memory://",
) -> Engine:
    clock = SystemClock()
    store = await RedisStore.connect(url, clock)
    transport = open_transport(transport_url, clock=clock)
    options = options or EngineOptions(poll_ms=10, owner="engine")
    engine = Engine(store, transport, clock, options=options, actions=ACTIONS)
    engines.append(engine)
    await engine.register_plan(model_ingest_shape(name=plan_name, lookup_action=True))
    await engine.start()
    return engine


async def until_terminal(store: RedisStore, run_ids: list[str], timeout_s: float) -> None:
    """Until every run is terminal; a retryable store error (the cluster failing over) is
    waited out like any caller would, anything else fails the test."""
    deadline = time.monotonic() + timeout_s
    pending = set(run_ids)
    while pending and time.monotonic() < deadline:
        for rid in sorted(pending):
            try:
                stored = await store.load(rid)
            except StoreError as exc:
                assert exc.retryable, exc
                await asyncio.sleep(0.1)
                break
            if stored is not None and RunState.from_json(stored.state).terminal:
                pending.discard(rid)
        await asyncio.sleep(0.02)
    assert not pending, f"{len(pending)} acknowledged run(s) not terminal within {timeout_s} s"


async def retrying(call: Callable[[], Awaitable[T]], timeout_s: float = 10) -> T:
    """What a caller does with a retryable StoreError: try again shortly, for a while."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await call()
        except StoreError as exc:
            if not exc.retryable or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


def masters_of(cluster: RedisCluster, store: RedisStore, run_ids: list[str]) -> set[int]:
    return {cluster.master_of(store.keys.run(rid).record) for rid in run_ids}


async def test_fifty_runs_complete_on_a_cluster(engine_on: list[Engine]) -> None:
    cluster = ensure_redis_cluster()
    engine = await start_engine(cluster.url(shards=8), engine_on, "on-cluster")
    store = engine.store
    assert isinstance(store, RedisStore)
    runs = [await engine.start_run("on-cluster", {"modelId": f"m{i}"}) for i in range(50)]
    assert masters_of(cluster, store, runs) == set(cluster.primaries())  # every master works
    async with worker_fleet(engine.transport):
        await until_terminal(store, runs, timeout_s=30)
    await engine.executor.wait_idle()
    plan = model_ingest_shape(name="on-cluster", lookup_action=True)
    finished = await assert_drained(engine, plan, runs)
    assert {r.status for r in finished} == {"completed"}
    history = await store.history(runs[0])
    assert history, "the run's history is on the cluster"


async def test_a_script_call_across_slots_is_refused_before_it_is_sent() -> None:
    store = await RedisStore.connect(ensure_redis_cluster().url(), SystemClock())
    try:
        s0, s1 = store.keys.shards[0], store.keys.shards[1]
        keys = [s0.outbox, s1.outbox_ids, s0.outbox_lease]  # two shards: two slots
        with pytest.raises(rx.ClusterCrossSlotError, match="CROSSSLOT"):
            store.group.submit(store.scripts.done_outbox, keys, ["e1"])
        commit_keys = store.keys.run("r1").commit_keys()
        assert len({key_slot(k.encode()) for k in commit_keys}) == 1
        announce = [store.keys.announcements, store.keys.capabilities]
        assert len({key_slot(k.encode()) for k in announce}) == 1
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+cluster://127.0.0.1:x/?prefix=a", "startup node"),
        ("redis+cluster://127.0.0.1:7000/3?prefix=a", "only database 0"),
        ("redis+cluster://127.0.0.1:7000/?prefix=a&no_such_option=1", "redis-py refused"),
    ],
)
def test_a_bad_cluster_url_is_refused_naming_the_problem(url: str, says: str) -> None:
    with pytest.raises(StoreError, match=says):
        open_store(url)


async def test_no_node_answering_is_retryable_a_server_without_cluster_mode_is_not() -> None:
    ensure_redis()
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = int(probe.getsockname()[1])
    with pytest.raises(StoreError, match="no node of the cluster answered") as down:
        await RedisStore.connect(f"redis+cluster://127.0.0.1:{dead}/?prefix=a")
    assert down.value.retryable
    with pytest.raises(StoreError, match="Cluster mode is not enabled") as wrong:
        await RedisStore.connect(f"redis+cluster://127.0.0.1:{REDIS_PORT}/?prefix=a")
    assert not wrong.value.retryable


async def test_replicas_wait_on_the_master_of_the_writes_slot() -> None:
    """With ``replicas=1``, a write waits for its own slot's replica: freezing that replica makes
    writes there indeterminate while writes to another master's slots are acknowledged."""
    cluster = ensure_redis_cluster()
    store = await RedisStore.connect(
        cluster.url(options="replicas=1&replica_wait_ms=200"), SystemClock()
    )
    frozen = cluster.replicas_of(cluster.master_of(store.keys.run("r1").record))
    other = next(
        f"o{n}"
        for n in range(1000)
        if cluster.master_of(store.keys.run(f"o{n}").record)
        != cluster.master_of(store.keys.run("r1").record)
    )
    pid = cluster.procs[frozen[0]].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(StoreError, match="0 of the 1 replicas") as caught:
            await store.commit(Commit("r1", 0, {"n": 0}, [{"n": 0}]))
        assert caught.value.retryable
        assert await store.commit(Commit(other, 0, {"n": 0}, [{"n": 0}])) == 1
    finally:
        os.kill(pid, signal.SIGCONT)
        await store.close()


async def test_acknowledged_runs_survive_a_master_failover(
    cluster: RedisCluster, engine_on: list[Engine]
) -> None:
    url = cluster.url(shards=8, options="replicas=1&replica_wait_ms=500&socket_timeout=2")
    # outbox entries and timers claimed while the store was away come back after lease_ms, and
    # messages taken but not settled after the transport's visibility timeout; short ones keep
    # the test short (the defaults recover the same way, only later)
    quick = EngineOptions(
        poll_ms=10, owner="engine", lease_ms=3_000, grace_ms=1_000, reconcile_every_ms=2_000
    )
    transport_url = "memory://?visibility_ms=4000"
    engine = await start_engine(url, engine_on, "failover", quick, transport_url)
    store = engine.store
    assert isinstance(store, RedisStore)
    acknowledged = [await engine.start_run("failover", {"modelId": f"m{i}"}) for i in range(20)]
    victim = cluster.master_of(store.keys.run(acknowledged[0]).record)
    # a second handle, replicas=0, on a run of the same shard (so the same slot: only the tag
    # {sNN} is hashed): it shows the call group itself finds the promoted master
    plain = await RedisStore.connect(cluster.url(shards=8), SystemClock())
    shard = store.keys.shard_of(acknowledged[0])
    probe = next(f"p{n}" for n in range(10_000) if plain.keys.shard_of(f"p{n}") == shard)
    assert await plain.commit(Commit(probe, 0, {"n": 0}, [{"n": 0}])) == 1
    on_victim = [r for r in acknowledged if cluster.master_of(store.keys.run(r).record) == victim]
    refused: list[StoreError] = []

    async def keep_starting() -> None:
        """More runs while the master dies: each either acknowledged or refused retryably."""
        for i in range(20, 60):
            try:
                acknowledged.append(await engine.start_run("failover", {"modelId": f"m{i}"}))
            except StoreError as exc:
                assert exc.retryable, exc
                refused.append(exc)
            await asyncio.sleep(0.05)

    async with worker_fleet(engine.transport):
        starting = asyncio.get_running_loop().create_task(keep_starting())
        await asyncio.sleep(0.3)  # runs in flight on every master
        cluster.kill(victim)
        started = time.monotonic()
        await asyncio.to_thread(cluster.wait_promoted, victim, 20)
        promoted_s = time.monotonic() - started
        try:  # the old master is still dead: only a refreshed slot map reaches the new one
            version = await retrying(lambda: plain.commit(Commit(probe, 1, {"n": 1}, [{"n": 1}])))
            assert version == 2
        finally:
            await plain.close()
        # the old master comes back as its replica's replica: replicas=1 can be met again
        await asyncio.to_thread(cluster.restart, victim)
        await asyncio.to_thread(cluster.wait_ok, 20)
        await starting
        await until_terminal(store, acknowledged, timeout_s=30)
    await engine.executor.wait_idle()
    assert victim not in cluster.primaries(), "the killed master's replica took over"
    assert promoted_s < 15
    assert refused, "the outage was seen: some starts were refused, retryably"
    finished = await assert_drained(
        engine, model_ingest_shape(name="failover", lookup_action=True), acknowledged
    )
    assert {r.status for r in finished} == {"completed"}
    assert on_victim, "some acknowledged runs lived on the killed master"
    assert len(acknowledged) > 20
