"""The Redis store with ``replicas=N``: every write waits for ``N`` replicas (``WAIT``), and a
write they did not acknowledge in time is indeterminate, never assumed done or lost.

A private primary and a private replica of it (``--replicaof``) run in the test's temp directory.
The replica is frozen with SIGSTOP to play a replica that has fallen behind or a link that is
down: the primary still carries the write out, the store answers a retryable StoreError, and once
the replica is back (SIGCONT) the engine's redelivery finishes every run as its history explains.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from accord.adapters import open_transport
from accord.adapters.clock import SystemClock
from accord.adapters.stores.redis import RedisStore
from accord.engine.ports import Commit, OutboxEntry, StoredRun
from accord.engine.runtime.orchestrator import Engine
from accord.errors import ConflictError, StoreError
from accord.testing.plans import model_ingest_shape

ROOT = str(Path(__file__).resolve().parents[2])
HERE = str(Path(__file__).resolve().parent)
for path in (ROOT, HERE):  # tests/integration is no package: reach its helpers by path
    if path not in sys.path:
        sys.path.insert(0, path)
from engine_shell_support import ACTIONS, assert_drained, wait_terminal, worker_fleet  # noqa: E402
from tests.services import PrivateRedis  # noqa: E402

from accord.engine.runtime.orchestrator import EngineOptions  # noqa: E402

T = TypeVar("T")


class Pair:
    """A primary and one replica of it, both private."""

    def __init__(self, directory: Path) -> None:
        (directory / "primary").mkdir()
        (directory / "replica").mkdir()
        self.primary = PrivateRedis(directory / "primary").start()
        self.replica = PrivateRedis(
            directory / "replica", "--replicaof", "127.0.0.1", str(self.primary.port)
        ).start()
        deadline = time.monotonic() + 20
        while self.primary.client().info("replication").get("slave0", {}).get("state") != "online":
            assert time.monotonic() < deadline, "the replica did not connect"
            time.sleep(0.05)
        # online is not yet streaming: after a diskless sync the primary holds the stream back
        # until the replica's first REPLCONF ACK (sent once a second), so a write's WAIT can
        # time out for up to a second. One write and its WAIT, so the tests' short
        # replica_wait_ms measures the replica they freeze, not its first sync
        with self.primary.client() as primary:
            primary.set("synced", 1)
            assert primary.wait(1, 20_000) == 1, "the replica does not acknowledge"
            primary.delete("synced")

    def url(self, prefix: str = "acc", replicas: int = 1, wait_ms: int = 150) -> str:
        return f"{self.primary.url(prefix)}&replicas={replicas}&replica_wait_ms={wait_ms}"

    def freeze(self) -> None:
        assert self.replica.proc is not None
        os.kill(self.replica.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.replica.proc is not None
        os.kill(self.replica.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        self.thaw()
        self.replica.kill()
        self.primary.kill()


async def replicated(write: Callable[[], Awaitable[T]], attempts: int = 20) -> T:
    """``write()`` made again while it meets a replica shortfall (a retryable StoreError)."""
    for _ in range(attempts - 1):
        try:
            return await write()
        except StoreError as exc:
            if not exc.retryable:
                raise
            await asyncio.sleep(0.05)
    return await write()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    servers = Pair(tmp_path)
    yield servers
    servers.close()


@pytest.fixture
async def store(pair: Pair) -> AsyncIterator[RedisStore]:
    handle = await RedisStore.connect(pair.url())
    yield handle
    await handle.close()


def box(entry_id: str) -> OutboxEntry:
    return OutboxEntry(entry_id, "r1", "job:q", {"id": entry_id}, created_at_ms=1)


async def test_an_acknowledged_commit_is_already_on_the_replica(
    pair: Pair, store: RedisStore
) -> None:
    replica = pair.replica.client()
    for step in range(20):
        await store.commit(Commit("r1", step, {"step": step}, [{"step": step}], [box(f"o{step}")]))
        # WAIT answered before the commit did: the replica holds this very version, at once
        assert replica.hget(store.keys.run("r1").record, "v") == str(step + 1)
    await store.put_plan("sha256:" + "d" * 64, {"plan": 1})
    assert replica.exists(store.keys.plan("sha256:" + "d" * 64)) == 1


async def test_a_write_no_replica_acknowledged_is_indeterminate(
    pair: Pair, store: RedisStore
) -> None:
    await store.commit(Commit("r1", 0, {"step": 0}, [{"step": 0}], [box("o0")]))
    pair.freeze()
    try:
        started = time.monotonic()
        with pytest.raises(StoreError) as caught:
            await store.commit(Commit("r1", 1, {"step": 1}, [{"step": 1}], [box("o1")]))
        assert caught.value.retryable
        assert "0 of the 1 replicas required acknowledged it within 150 ms" in str(caught.value)
        assert time.monotonic() - started >= 0.14  # it waited replica_wait_ms, no longer
        # carried out on the primary: a caller must reload, never assume it lost or done
        run = await store.load("r1")  # reads do not wait for replicas
        assert run is not None and (run.version, run.state) == (2, {"step": 1})
        # a read sent in the same round as a write gets its reply; the write its shortfall
        read, write = await asyncio.gather(
            store.load("r1"),
            store.commit(Commit("r1", 2, {"step": 2}, [{"step": 2}])),
            return_exceptions=True,
        )
        assert isinstance(read, StoredRun) and read.version in (2, 3)
        assert isinstance(write, StoreError) and "replicas" in str(write)
        for write in (
            store.claim_outbox(10, "d", 1_000),
            store.claim_timers(10**13, 10, "t", 1_000),
            store.put_plan("sha256:" + "e" * 64, {"plan": 2}),
            store.announce("w1", ["cap@1"], 10**13),
        ):
            with pytest.raises(StoreError, match="replicas") as shortfall:
                await write
            assert shortfall.value.retryable
    finally:
        pair.thaw()
    with pytest.raises(ConflictError):  # the same commit again: it had landed
        await store.commit(Commit("r1", 1, {"step": 1}, [{"step": 1}], [box("o1")]))
    assert await store.commit(Commit("r1", 3, {"step": 3}, [{"step": 3}])) == 4
    assert pair.replica.client().hget(store.keys.run("r1").record, "v") == "4"
    assert [h["step"] for h in await store.history("r1")] == [0, 1, 2, 3]


async def test_a_refused_script_is_its_own_error_not_a_shortfall(
    pair: Pair, store: RedisStore
) -> None:
    await store.commit(Commit("r1", 0, {"n": 0}, [{"n": 0}]))
    pair.freeze()
    try:
        with pytest.raises(ConflictError):  # refused by the script: nothing to wait for
            await store.commit(Commit("r1", 7, {"n": 1}, [{"n": 1}]))
    finally:
        pair.thaw()


async def test_too_few_replicas_at_startup_is_logged(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="accord.store.redis"):
        await (await RedisStore.connect(pair.url(replicas=1))).close()
        assert not [r for r in caplog.records if "replicas=" in r.getMessage()]
        store = await RedisStore.connect(pair.url(prefix="two", replicas=2))
    assert any(
        "1 connected replicas" in r.getMessage() and "replicas=2" in r.getMessage()
        for r in caplog.records
    )
    with pytest.raises(StoreError, match="of the 2 replicas required") as caught:
        await store.commit(Commit("r1", 0, {"n": 0}, [{"n": 0}]))
    assert caught.value.retryable
    await store.close()


async def test_runs_finish_once_each_across_a_replica_outage(pair: Pair) -> None:
    """I1, I2, I12: outcomes whose commits the replica did not acknowledge are held and made
    again (not nacked: with a delivery limit of 2, nacking would dead-letter them within the
    outage); once it is back every run completes, each stage released once, and each replays to
    its record."""
    clock = SystemClock()
    store = RedisStore.from_url(pair.url(prefix="eng", wait_ms=100), clock)
    failures: list[StoreError] = []
    commit = store.commit

    async def counted(c: Commit) -> int:
        try:
            return await commit(c)
        except StoreError as exc:
            failures.append(exc)
            raise

    store.commit = counted  # type: ignore[method-assign]
    transport = open_transport("memory://?max_deliveries=2", clock=clock)
    plan = model_ingest_shape(name="replicated", lookup_action=True, finaliser=True)
    engine = Engine(
        store, transport, clock, options=EngineOptions(poll_ms=10, owner="engine"), actions=ACTIONS
    )
    try:
        # before the freeze the replica acknowledges, but a loaded machine can hold its answer
        # past 100 ms: the set-up's writes are made again until one is acknowledged (the plan's
        # SET NX and a start under its own run id are idempotent)
        await replicated(lambda: engine.register_plan(plan))
        await engine.start()
        runs = [
            await replicated(
                lambda i=i: engine.start_run(plan.name, {"modelId": f"m{i}"}, run_id=f"run_r{i}")
            )
            for i in range(6)
        ]
        failures.clear()  # the outage's shortfalls are the ones counted below
        pair.freeze()  # the jobs wait on their queues; their outcomes will meet a frozen replica
        try:
            async with worker_fleet(transport):
                await asyncio.sleep(1.2)
                pair.thaw()
                await wait_terminal(store, runs)
        finally:
            pair.thaw()
        await engine.executor.wait_idle()
        finished = await assert_drained(engine, plan, runs)
        assert {r.status for r in finished} == {"completed"}
        assert await transport.dead_letters(engine.intake.queue) == []  # none given up on
        assert failures and all(f.retryable and "replicas" in str(f) for f in failures)
        assert engine.hold.held > 0
        record: Any = pair.replica.client().hget(store.keys.run(runs[0]).record, "v")
        assert record is not None
    finally:
        await engine.stop()
        await store.close()
        await transport.close()
