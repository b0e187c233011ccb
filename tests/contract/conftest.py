"""One contract suite, every adapter: the fixtures here parametrise it.

Each entry of :data:`STORES` / :data:`TRANSPORTS` is a factory ``(tmp_path, clock) -> opener``;
``opener()`` returns a handle on the *same* backing storage each time it is called (a new
connection for SQLite and the brokers, the one object for memory), so tests can race two handles.
Adding an adapter is one line in one of the two tables; every test in ``tests/contract/`` then
runs over it. Transports are opened with :data:`QUEUE_OPTS` (a short visibility timeout and
delivery limit 3).

Time: the in-process transports keep their leases on the fake clock, so a test moves time by
hand, exactly. The brokers (BullMQ on the real Redis, RabbitMQ) keep leases on their server's
clock, which no test can move: for them :class:`Timeline` sleeps through the same spans (and still
advances the fake clock, which the transports use only to stamp dead letters), and a crashed
consumer is a handle closed without settling what it holds. :data:`REAL_TIME` and
:data:`NO_DEDUP` name the adapters that differ, so each case states what it checks of each.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import pytest
import redis

from accord.adapters import open_store, open_transport
from accord.engine.ports import Store, Transport
from accord.testing.clock import FakeClock
from tests.services import (
    REDIS_DB,
    ensure_rabbitmq,
    ensure_redis,
    postgres_store_opener,
    postgres_transport_opener,
    redis_cluster_store_opener,
    redis_store_opener,
)

Opener = Callable[[], Any]
Factory = Callable[[Path, FakeClock], Opener]

QUEUE_OPTS = "visibility_ms=1000&max_deliveries=3&dedup_ms=60000&poll_ms=5"
VISIBILITY_MS, MAX_DELIVERIES, DEDUP_MS = 1000, 3, 60_000


# the brokers: a lease lapses a visibility timeout after its holder stops renewing it; BullMQ's
# stalled-job check runs every ``stalled_ms``, so a lapsed job is back within about 1.3 s
BROKER_OPTS = "visibility_ms=1000&max_deliveries=3&dedup_ms=2000"
BROKER_DEDUP_MS = 2000
REAL_TIME = frozenset({"bullmq", "rabbitmq"})
NO_DEDUP = frozenset({"rabbitmq"})  # RabbitMQ has no deduplication: a republish is a duplicate
AMQP = "amqp://guest:guest@127.0.0.1:5672/"


def _same(handle: Any) -> Opener:
    return lambda: handle


def _queue_in_store(tmp: Path, clock: FakeClock) -> Opener:
    store = open_store(f"sqlite:///{tmp}/both.db?synchronous=NORMAL", clock=clock)
    transport = open_transport(f"embedded://?{QUEUE_OPTS}", clock=clock, store=store)
    _OWNED.append(store)
    return _same(transport)


_OWNED: list[Store] = []  # stores a transport lives in, closed after the test
_CLEANUPS: list[Callable[[], Awaitable[None]]] = []  # broker state to remove after the test


def _bullmq(_tmp: Path, clock: FakeClock) -> Opener:
    ensure_redis()
    prefix = f"ct-{uuid.uuid4().hex[:10]}"
    url = f"bullmq://127.0.0.1:6379/{REDIS_DB}?prefix={prefix}&{BROKER_OPTS}&stalled_ms=300"

    async def cleanup() -> None:
        client = redis.Redis(port=6379, db=REDIS_DB)
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()

    _CLEANUPS.append(cleanup)
    return lambda: open_transport(url, clock=clock)


def _rabbitmq(_tmp: Path, clock: FakeClock) -> Opener:
    ensure_rabbitmq()
    prefix = f"ct{uuid.uuid4().hex[:10]}."
    opened: list[Any] = []

    def opener() -> Any:
        handle = open_transport(f"{AMQP}?prefix={prefix}&{BROKER_OPTS}", clock=clock)
        opened.append(handle)
        return handle

    async def cleanup() -> None:
        names = {n for h in opened for n in getattr(h, "declared", ())}
        connection = await aio_pika.connect(AMQP)
        async with connection:
            channel = await connection.channel()
            for name in sorted(names):
                await channel.queue_delete(name)

    _CLEANUPS.append(cleanup)
    return opener


STORES: dict[str, Factory] = {
    "memory": lambda tmp, clock: _same(open_store("memory://?shards=4", clock=clock)),
    "sqlite": lambda tmp, clock: lambda: open_store(f"sqlite:///{tmp}/s.db?shards=4", clock=clock),
    "redis": redis_store_opener,
    "redis-cluster": redis_cluster_store_opener,  # a fresh prefix on the shared 3+3 cluster
    "postgres": postgres_store_opener,
}
TRANSPORTS: dict[str, Factory] = {
    "memory": lambda tmp, clock: _same(open_transport(f"memory://?{QUEUE_OPTS}", clock=clock)),
    "embedded-sqlite": lambda tmp, clock: (
        lambda: open_transport(
            f"embedded+sqlite:///{tmp}/q.db?synchronous=NORMAL&{QUEUE_OPTS}", clock=clock
        )
    ),
    "embedded-in-store": _queue_in_store,
    "bullmq": _bullmq,
    "rabbitmq": _rabbitmq,
    "postgres": postgres_transport_opener(QUEUE_OPTS),
}


@dataclass
class Timeline:
    """Time as one transport's leases see it (see the module docstring)."""

    clock: FakeClock
    real: bool
    dedups: bool
    dedup_ms: int

    @property
    def quiet_s(self) -> float:
        """How long "nothing arrives" is watched: sixteen poll intervals, or for a broker long
        enough for a redelivery that was going to happen to have happened."""
        return 0.3 if self.real else 0.08

    def now_ms(self) -> int:
        return self.clock.now_ms()

    async def advance(self, ms: int) -> None:
        self.clock.advance(ms)
        if self.real:
            await asyncio.sleep(ms / 1000)

    async def lapse(self, holder: Transport) -> None:
        """The consumer holding leases on ``holder`` is gone; come back when they have lapsed.
        On a broker the holder is closed without settling (it stops renewing its leases), so a
        test continues on another handle."""
        if self.real:
            await holder.close()
            await asyncio.sleep(VISIBILITY_MS / 1000)
        self.clock.advance(VISIBILITY_MS)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def _opener(
    factories: dict[str, Factory], name: str, tmp: Path, clock: FakeClock
) -> AsyncIterator[Callable[[], Any]]:
    make = factories[name](tmp, clock)
    opened: list[Any] = []

    def opener() -> Any:
        handle = make()
        opened.append(handle)
        return handle

    yield opener
    for handle in [*opened, *_OWNED]:
        await handle.close()
    _OWNED.clear()
    for cleanup in _CLEANUPS:
        await cleanup()
    _CLEANUPS.clear()


@pytest.fixture(params=sorted(STORES))
async def store_opener(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> AsyncIterator[Callable[[], Store]]:
    async for opener in _opener(STORES, request.param, tmp_path, clock):
        yield opener


@pytest.fixture
def store(store_opener: Callable[[], Store]) -> Store:
    return store_opener()


@pytest.fixture(params=sorted(TRANSPORTS))
async def transport_opener(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> AsyncIterator[Callable[[], Transport]]:
    async for opener in _opener(TRANSPORTS, request.param, tmp_path, clock):
        yield opener


@pytest.fixture
def transport(transport_opener: Callable[[], Transport]) -> Transport:
    return transport_opener()


@pytest.fixture
def timeline(request: pytest.FixtureRequest, clock: FakeClock) -> Timeline:
    name = request.node.callspec.params.get("transport_opener", "")
    real = name in REAL_TIME
    return Timeline(clock, real, name not in NO_DEDUP, BROKER_DEDUP_MS if real else DEDUP_MS)
