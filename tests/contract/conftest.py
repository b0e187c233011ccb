"""One contract suite, every adapter: the fixtures here parametrise it.

Each entry of :data:`STORES` / :data:`TRANSPORTS` is a factory ``(tmp_path, clock) -> opener``;
``opener()`` returns a handle on the *same* backing storage each time it is called (a new
connection for SQLite, the one object for memory), so tests can race two handles. Adding an
adapter is one line in one of the two tables; every test in ``tests/contract/`` then runs over it.
Transports are opened with :data:`QUEUE_OPTS` (a short visibility timeout and delivery limit 3).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from accord.adapters import open_store, open_transport
from accord.engine.ports import Store, Transport
from accord.testing.clock import FakeClock
from tests.services import redis_store_opener

Opener = Callable[[], Any]
Factory = Callable[[Path, FakeClock], Opener]

QUEUE_OPTS = "visibility_ms=1000&max_deliveries=3&dedup_ms=60000&poll_ms=5"
VISIBILITY_MS, MAX_DELIVERIES, DEDUP_MS = 1000, 3, 60_000


def _same(handle: Any) -> Opener:
    return lambda: handle


def _queue_in_store(tmp: Path, clock: FakeClock) -> Opener:
    store = open_store(f"sqlite:///{tmp}/both.db?synchronous=NORMAL", clock=clock)
    transport = open_transport(f"embedded://?{QUEUE_OPTS}", clock=clock, store=store)
    _OWNED.append(store)
    return _same(transport)


_OWNED: list[Store] = []  # stores a transport lives in, closed after the test

STORES: dict[str, Factory] = {
    "memory": lambda tmp, clock: _same(open_store("memory://", clock=clock)),
    "sqlite": lambda tmp, clock: lambda: open_store(f"sqlite:///{tmp}/s.db", clock=clock),
    "redis": redis_store_opener,
}
TRANSPORTS: dict[str, Factory] = {
    "memory": lambda tmp, clock: _same(open_transport(f"memory://?{QUEUE_OPTS}", clock=clock)),
    "embedded-sqlite": lambda tmp, clock: (
        lambda: open_transport(
            f"embedded+sqlite:///{tmp}/q.db?synchronous=NORMAL&{QUEUE_OPTS}", clock=clock
        )
    ),
    "embedded-in-store": _queue_in_store,
}


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
