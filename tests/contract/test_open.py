"""Opening adapters by URL, and the SQLite edges that only SQLite has (locks, files, options)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from accord.adapters import open_store, open_transport
from accord.adapters.stores.memory import MemoryStore
from accord.adapters.stores.sqlite import SqliteStore
from accord.adapters.transports.embedded import EmbeddedTransport
from accord.adapters.transports.memory import MemoryTransport
from accord.engine.ports import Commit, Store, Transport
from accord.errors import StoreError, TransportError


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis-ish://x", "unknown scheme 'redis-ish'"),
        ("postgres://db/x", "expected one of memory://, sqlite://"),
        ("sqlite://host/x.db", "no host"),
        ("sqlite:///", "no database path"),
        ("sqlite:///x.db?synchronus=FULL", "unknown option(s) ['synchronus']"),
        ("sqlite:///x.db?synchronous=SOMETIMES", "synchronous='SOMETIMES'"),
        ("sqlite:///x.db?busy_timeout_ms=soon", "expected an integer"),
        ("redis://127.0.0.1/0?shards=x", "option shards='x': expected an integer"),
        ("redis://127.0.0.1/0?replicas=-1", "option replicas='-1': expected an integer ≥ 0"),
        ("redis://127.0.0.1/0?replicas=two", "option replicas='two': expected an integer"),
        ("redis://127.0.0.1/0?replica_wait_ms=0", "replica_wait_ms='0': expected an integer ≥ 1"),
    ],
)
def test_bad_store_urls_are_refused_by_name(url: str, message: str) -> None:
    with pytest.raises(StoreError) as caught:
        open_store(url)
    assert message in str(caught.value) and url in str(caught.value)


async def test_bad_transport_urls_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(TransportError, match="unknown scheme 'amqpx'"):
        open_transport("amqpx://broker")
    with pytest.raises(TransportError, match="needs store="):
        open_transport("embedded://")
    with pytest.raises(TransportError, match="visibility_ms must be >= 1"):
        open_transport("memory://?visibility_ms=0")
    with pytest.raises(TransportError, match="unknown option"):
        open_transport("memory://?prefetch=3")
    assert not list(tmp_path.iterdir())


async def test_one_url_opens_store_and_queue_on_one_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/app.db?synchronous=NORMAL&visibility_ms=500"
    store, transport = open_store(url), open_transport(url)
    assert isinstance(store, SqliteStore) and isinstance(transport, EmbeddedTransport)
    assert transport.options.visibility_ms == 500 and store.db.synchronous == "NORMAL"
    shared = open_transport("embedded://?max_deliveries=9", store=store)
    assert isinstance(shared, EmbeddedTransport) and shared.db is store.db
    await transport.publish("q", "m1", b"x")
    assert [d.message_id for d in [await anext(shared.consume("q"))]] == ["m1"]
    await shared.close()  # does not close the store's connection
    await store.commit(Commit("r1", 0, {}))
    for handle in (transport, store):
        await handle.close()
    tables = sqlite3.connect(tmp_path / "app.db").execute("SELECT name FROM sqlite_master")
    names = {row[0] for row in tables}
    assert {"accord_runs", "accord_queue", "accord_outbox"} <= names


async def test_memory_urls_and_embedded_in_a_memory_store() -> None:
    store = open_store("memory://")
    assert isinstance(store, MemoryStore)
    assert isinstance(open_transport("memory://"), MemoryTransport)
    assert isinstance(open_transport("embedded://", store=store), MemoryTransport)
    in_memory_db = open_store("sqlite:///:memory:")
    assert await in_memory_db.commit(Commit("r1", 0, {"a": 1})) == 1
    await in_memory_db.close()
    assert isinstance(store, Store) and isinstance(open_transport("memory://"), Transport)


async def test_a_lock_held_past_the_busy_timeout_is_a_retryable_store_error(
    tmp_path: Path,
) -> None:
    store = open_store(f"sqlite:///{tmp_path}/locked.db?busy_timeout_ms=50")
    await store.commit(Commit("r1", 0, {"v": 1}))
    blocker = sqlite3.connect(tmp_path / "locked.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    with pytest.raises(StoreError) as caught:
        await store.commit(Commit("r1", 1, {"v": 2}))
    assert caught.value.retryable and "locked" in str(caught.value)
    blocker.execute("ROLLBACK")
    blocker.close()
    assert await store.commit(Commit("r1", 1, {"v": 2})) == 2
    await store.close()


async def test_a_closed_store_refuses_work(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/closed.db")
    await store.close()
    with pytest.raises(StoreError, match="closed"):
        await store.load("r1")


def test_an_unopenable_file_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="unable to open"):
        open_store(f"sqlite:///{tmp_path}/missing-dir/x.db")
