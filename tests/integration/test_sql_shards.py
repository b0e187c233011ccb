"""Shards on the SQL stores, beyond the contract suite: the recorded shard count, the migration of
databases made before shards existed, leases raced from two handles, and fenced joint commits.

SQLite runs on a temporary file; PostgreSQL on a fresh schema of the test database (see
tests/services.py). Leases are on the fake clock, shared by every handle of a test."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import asyncpg
import pytest
from tests.services import postgres_url

from accord.adapters import open_store, open_transport
from accord.adapters.stores.postgres import PostgresStore
from accord.adapters.stores.postgres._db import parse_url
from accord.adapters.stores.postgres._schema import MIGRATIONS
from accord.adapters.stores.sqlite import SqliteStore
from accord.adapters.transports.embedded import EmbeddedTransport
from accord.engine.ports import Commit, Fence, JointQueue, QueuedMessage, Store, shard_of
from accord.errors import OwnershipLost, StoreError
from accord.testing.clock import FakeClock

TTL = 5_000

# the SQLite store's tables as they were before shards (no shard column, no lease tables)
OLD_SQLITE = """
CREATE TABLE accord_runs (
  run_id TEXT PRIMARY KEY, version INTEGER NOT NULL, state TEXT NOT NULL,
  history_len INTEGER NOT NULL, status TEXT, workflow TEXT, tenant TEXT,
  updated_at INTEGER NOT NULL, labels TEXT NOT NULL DEFAULT '{}');
CREATE TABLE accord_history (
  run_id TEXT NOT NULL, seq INTEGER NOT NULL, entry TEXT NOT NULL,
  PRIMARY KEY (run_id, seq)) WITHOUT ROWID;
CREATE TABLE accord_outbox (
  entry_id TEXT NOT NULL UNIQUE, run_id TEXT NOT NULL, topic TEXT NOT NULL,
  payload TEXT NOT NULL, created_at INTEGER NOT NULL, avail_at INTEGER NOT NULL, owner TEXT);
CREATE INDEX accord_outbox_pending ON accord_outbox (avail_at);
CREATE TABLE accord_timers (
  timer_id TEXT PRIMARY KEY, run_id TEXT NOT NULL, due_at INTEGER NOT NULL,
  payload TEXT NOT NULL, avail_at INTEGER NOT NULL, owner TEXT) WITHOUT ROWID;
CREATE INDEX accord_timers_due ON accord_timers (avail_at);
"""
RUNS = [f"old-{k}" for k in range(40)]  # spread over the 4 shards of the migrated stores


def by_shard(count: int) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for run_id in RUNS:
        out.setdefault(shard_of(run_id, count), set()).add(run_id)
    return out


async def assert_claimable_by_shard(store: Store) -> None:
    """Every old outbox entry and timer is claimed by its run's shard, and by no other."""
    expected = by_shard(4)
    assert len(expected) == 4  # the test's runs do cover every shard
    for shard, runs in sorted(expected.items()):
        entries = await store.claim_outbox(1000, "x", 60_000, shards=[shard])
        assert {e.run_id for e in entries} == runs
        assert {e.entry_id for e in entries} == {f"o-{r}" for r in runs}
        timers = await store.claim_timers(2**62, 1000, "x", 60_000, shards=[shard])
        assert {t.timer_id for t in timers} == {f"t-{r}" for r in runs}
    assert await store.claim_outbox(1000, "x", 60_000) == []  # all leased now, none missed


# -- the recorded shard count --------------------------------------------------------------


async def test_sqlite_refuses_another_shard_count_naming_the_recorded_one(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    store = open_store(f"{url}?shards=4")
    assert isinstance(store, SqliteStore) and store.shard_count == 4
    await store.close()
    for other in ("?shards=2", ""):  # no option: the default (1) applies, and is refused too
        with pytest.raises(StoreError) as refused:
            open_store(url + other)
        text = str(refused.value)
        assert "was created with shards=4" in text and "Open it with ?shards=4" in text
        assert f"opened with shards={2 if other else 1}" in text and "s.db" in text
    again = open_store(f"{url}?shards=4")
    assert isinstance(again, SqliteStore) and again.shard_count == 4
    await again.close()


async def test_sqlite_default_is_one_shard_and_a_bad_count_is_refused(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/one.db")
    assert isinstance(store, SqliteStore) and store.shard_count == 1
    assert await store.hold_shards("e1", [0], TTL) == {0: 1}
    await store.close()
    with pytest.raises(StoreError, match="from 1 to 1024"):
        open_store(f"sqlite:///{tmp_path}/two.db?shards=0")


async def test_postgres_refuses_another_shard_count_naming_the_recorded_one() -> None:
    url = postgres_url()
    first = open_store(f"{url}&shards=4")
    assert isinstance(first, PostgresStore) and first.shard_count == 4
    assert await first.load("nothing") is None  # the first use records the count
    for other, count in (("&shards=2", 2), ("", 8)):  # no option: the default (8) is refused
        late = open_store(url + other)
        with pytest.raises(StoreError) as refused:
            await late.load("nothing")
        text = str(refused.value)
        assert "was created with shards=4" in text and "Open it with ?shards=4" in text
        assert f"opened with shards={count}" in text
        await late.close()
    same = open_store(f"{url}&shards=4")
    assert await same.load("nothing") is None
    await same.close()
    await first.close()


# -- databases made before shards ----------------------------------------------------------


def make_old_sqlite(path: Path) -> None:
    conn = sqlite3.connect(path)
    with conn:
        conn.executescript(OLD_SQLITE)
        for n, run_id in enumerate(RUNS):
            conn.execute(
                "INSERT INTO accord_runs VALUES (?, 1, '{}', 0, 'running', 'w', NULL, ?, '{}')",
                (run_id, n),
            )
            conn.execute(
                "INSERT INTO accord_outbox VALUES (?, ?, 'job:q', '{}', ?, 0, NULL)",
                (f"o-{run_id}", run_id, n),
            )
            conn.execute(
                "INSERT INTO accord_timers VALUES (?, ?, ?, '{}', ?, NULL)",
                (f"t-{run_id}", run_id, 10 + n, 10 + n),
            )
    conn.close()


async def test_an_old_sqlite_database_is_migrated_and_its_work_is_claimable_by_shard(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    make_old_sqlite(path)
    store = open_store(f"sqlite:///{path}?shards=4", clock=FakeClock())
    await assert_claimable_by_shard(store)
    loaded = await store.load(RUNS[0])
    assert loaded is not None and loaded.version == 1
    await store.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT value FROM accord_meta WHERE key = 'shards'").fetchone() == (
            "4",
        )
        rows = conn.execute("SELECT run_id, shard FROM accord_timers").fetchall()
        assert sorted(rows) == sorted((r, shard_of(r, 4)) for r in RUNS)
        indexes = {r[1] for r in conn.execute("PRAGMA index_list(accord_outbox)")}
        assert "accord_outbox_shard" in indexes
    finally:
        conn.close()
    with pytest.raises(StoreError, match="was created with shards=4"):
        open_store(f"sqlite:///{path}?shards=8")  # the count it was migrated with is kept


async def test_an_old_postgres_schema_is_migrated_and_its_work_is_claimable_by_shard() -> None:
    url = postgres_url("shards=4")
    target = parse_url(url)
    conn = await asyncpg.connect(target.dsn)
    try:
        async with conn.transaction():
            await conn.execute(f'CREATE SCHEMA "{target.schema}"')
            await conn.execute(f'SET LOCAL search_path = "{target.schema}"')
            await conn.execute(
                "CREATE TABLE accord_schema (version integer PRIMARY KEY,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            await conn.execute(MIGRATIONS[0][1])  # version 1: before shards
            await conn.execute("INSERT INTO accord_schema (version) VALUES (1)")
            for n, run_id in enumerate(RUNS):
                await conn.execute(
                    "INSERT INTO accord_runs VALUES ($1, 1, '{}', 0, 'running', 'w', NULL, $2)",
                    run_id,
                    n,
                )
                await conn.execute(
                    "INSERT INTO accord_outbox (entry_id, run_id, topic, payload, created_at,"
                    " avail_at) VALUES ($1, $2, 'job:q', '{}', $3, 0)",
                    f"o-{run_id}",
                    run_id,
                    n,
                )
                await conn.execute(
                    "INSERT INTO accord_timers VALUES ($1, $2, $3, '{}', $3, NULL)",
                    f"t-{run_id}",
                    run_id,
                    10 + n,
                )
    finally:
        await conn.close()
    store = open_store(url, clock=FakeClock())
    try:
        await assert_claimable_by_shard(store)
    finally:
        await store.close()


# -- leases raced from two handles ---------------------------------------------------------


async def test_two_sqlite_handles_racing_hold_shards_never_both_hold_a_shard(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    url = f"sqlite:///{tmp_path}/race.db?shards=8"
    a, b = open_store(url, clock=clock), open_store(url, clock=clock)
    assert isinstance(a, SqliteStore) and isinstance(b, SqliteStore)
    assert a.db is not b.db  # two connections, each on its own thread, as two processes have
    epochs = dict.fromkeys(range(8), 0)
    try:
        for round_ in range(60):
            # every lease has lapsed: both engines want all of them, from overlapping ends
            clock.advance(TTL)
            want_a, want_b = list(range(8)), list(range(7, -1, -1))
            calls = [a.hold_shards("e1", want_a, TTL), b.hold_shards("e2", want_b, TTL)]
            flip = bool(round_ % 2)  # each handle goes first in turn
            done = await asyncio.gather(*(reversed(calls) if flip else calls))
            of_a, of_b = (done[1], done[0]) if flip else (done[0], done[1])
            assert not set(of_a) & set(of_b), f"round {round_}: {of_a} and {of_b}"
            assert set(of_a) | set(of_b) == set(range(8))
            for shard, epoch in {**of_a, **of_b}.items():
                assert epoch == epochs[shard] + 1  # taken once, at the next epoch
                epochs[shard] = epoch
            leases = {lease.shard: lease for lease in await b.shard_leases()}
            assert {s: (held.owner, held.epoch) for s, held in leases.items()} == {
                **{s: ("e1", e) for s, e in of_a.items()},
                **{s: ("e2", e) for s, e in of_b.items()},
            }
    finally:
        await a.close()
        await b.close()


async def test_two_postgres_pools_racing_hold_shards_never_both_hold_a_shard() -> None:
    clock = FakeClock()
    url = postgres_url("shards=8")
    a, b = open_store(url, clock=clock), open_store(url, clock=clock)
    assert isinstance(a, PostgresStore) and isinstance(b, PostgresStore)
    try:
        for round_ in range(30):
            clock.advance(TTL)
            orders = (list(range(8)), list(range(7, -1, -1)))  # overlapping, from both ends
            results = await asyncio.gather(
                *((a, b)[k % 2].hold_shards(f"e{k}", orders[k % 2], TTL) for k in range(6))
            )
            taken = [s for held in results for s in held]
            assert sorted(taken) == list(range(8)), f"round {round_}: {results}"
            assert {s: e for held in results for s, e in held.items()} == dict.fromkeys(
                range(8), round_ + 1
            )
    finally:
        await a.close()
        await b.close()


# -- fenced joint commits (the queue's writes ride in the store's transaction) -------------


async def _fenced_joint_refused(store: Store, queue: JointQueue, clock: FakeClock) -> None:
    assert isinstance(store, SqliteStore | PostgresStore)
    joint = queue.joint_commit(store)
    assert joint is not None
    run_id = "joint-run"
    shard = shard_of(run_id, store.shard_count)
    old = Fence(shard, "e1", (await store.hold_shards("e1", [shard], TTL))[shard])
    msg = QueuedMessage("jobs", "m-1", b"{}")
    assert await joint.commit(Commit(run_id, 0, {"a": 1}, fence=old), [msg], [], durable=True) == 1
    clock.advance(TTL)
    assert (await store.hold_shards("e2", [shard], TTL))[shard] == old.epoch + 1
    late = QueuedMessage("jobs", "m-late", b"{}")
    with pytest.raises(OwnershipLost):
        await joint.commit(Commit(run_id, 1, {"a": 2}, fence=old), [late], [], durable=True)
    loaded = await store.load(run_id)
    assert loaded is not None and (loaded.version, loaded.state) == (1, {"a": 1})


async def test_a_fenced_embedded_joint_commit_after_a_takeover_lands_nothing(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    store = open_store(f"sqlite:///{tmp_path}/j.db?shards=4", clock=clock)
    assert isinstance(store, SqliteStore)
    queue = EmbeddedTransport(store.db, clock, owns_db=False)
    try:
        await _fenced_joint_refused(store, queue, clock)
    finally:
        await queue.close()
        await store.close()
    conn = sqlite3.connect(tmp_path / "j.db")
    try:
        ids = [r[0] for r in conn.execute("SELECT message_id FROM accord_queue")]
    finally:
        conn.close()
    assert ids == ["m-1"]  # the refused commit's message never reached the queue


async def test_a_fenced_postgres_joint_commit_after_a_takeover_lands_nothing() -> None:
    clock = FakeClock()
    url = postgres_url("shards=4")
    store = open_store(url, clock=clock)
    queue = open_transport(url, clock=clock)
    assert isinstance(queue, JointQueue)
    try:
        await _fenced_joint_refused(store, queue, clock)
        target = parse_url(url)
        conn = await asyncpg.connect(target.dsn)
        try:
            rows = await conn.fetch(f'SELECT message_id FROM "{target.schema}".accord_jobs')
        finally:
            await conn.close()
        assert [r[0] for r in rows] == ["m-1"]
    finally:
        await queue.close()
        await store.close()
