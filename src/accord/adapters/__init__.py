"""Adapters: all I/O behind the engine's ports, chosen by URL and imported only when used.

Stores (:func:`open_store`)::

    memory://                     a fresh in-process store (tests, the testing API)
    sqlite:///relative/path.db    the embedded default; sqlite:////abs/path.db; sqlite:///:memory:
                                  options: ?synchronous=FULL|NORMAL&busy_timeout_ms=5000
    postgresql://user@host:5432/db  one schema of a PostgreSQL database (docs/postgres.md)
                                  options: ?schema=accord&pool_size=10&migrate=auto|off

Transports (:func:`open_transport`)::

    memory://                     a fresh in-process queue
    sqlite:///path.db             the embedded queue in that SQLite file (its own tables; the
    embedded+sqlite:///path.db      store's URL works unchanged, so one URL opens both)
                                  options: ?visibility_ms=30000&max_deliveries=5&dedup_ms=600000
                                  &poll_ms=50 (a store URL may carry them too)
    embedded://                   the queue inside the store passed as ``store=``: the same SQLite
                                  connection and thread for a SQLite store (one writer, no lock
                                  contention between store and queue in this process), or an
                                  in-process queue for the memory store
    postgresql://user@host/db     the queue tables in that schema (the store's URL works
                                  unchanged; commits then include the queue's writes)

An engine over both (:func:`open_engine`) owns them and closes them when it stops.
:func:`reach_transport` makes one attempt to reach a broker (BullMQ's Redis, RabbitMQ) before
work starts, so a command can tell an unreachable one from a slow start.

Each process opens its own store and transport on the same file; SQLite's write lock and the
store's compare-and-set keep them correct. Modules for optional back-ends (Redis, BullMQ,
RabbitMQ) are imported inside the branch that needs them (hence the ``noqa: PLC0415``), so their
dependencies stay optional.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from urllib.parse import parse_qsl, urlencode, urlsplit

from accord.adapters._store_rules import SHARED_OPTS
from accord.adapters.clock import SystemClock
from accord.adapters.ingress.remote import RemoteConfig
from accord.adapters.transports._base import QueueOptions
from accord.contracts.sealing import Keyring
from accord.engine.ports import Clock, Sink, Store, Transport
from accord.engine.runtime.actions import ActionHandler, ActionRegistry
from accord.engine.runtime.checks import MessageCatalog, ResultHook
from accord.engine.runtime.orchestrator import Engine, EngineOptions, Observer
from accord.errors import StoreError, TransportError
from accord.objects.ports import ObjectStore

__all__ = ["CRASH_ENV", "open_engine", "open_store", "open_transport", "reach_transport"]

CRASH_ENV = "ACCORD_CRASH_AT"  # a crash point for fault tests, read by open_engine
_QUEUE_OPTS = frozenset({"visibility_ms", "max_deliveries", "dedup_ms", "poll_ms"})

STORE_SCHEMES = ("memory", "sqlite", "redis", "rediss", "redis+cluster", "postgresql")
TRANSPORT_SCHEMES = (
    "memory", "sqlite", "embedded+sqlite", "embedded", "bullmq", "redis+bullmq", "amqp", "amqps",
    "postgresql",
)  # fmt: skip


def _scheme(url: str) -> str:
    """The URL's scheme; ``ValueError`` (naming the problem) when it cannot even be split, as in
    ``redis://[::1/0``."""
    return urlsplit(url).scheme.lower()


def open_store(url: str, *, clock: Clock | None = None) -> Store:
    """Open the store named by ``url``; ``clock`` (default: wall clock) stamps leases and times."""
    try:
        scheme = _scheme(url)
        if scheme == "memory":
            from accord.adapters.stores.memory import MemoryStore  # noqa: PLC0415

            return MemoryStore.from_url(url, clock)
        if scheme == "sqlite":
            from accord.adapters.stores.sqlite import SqliteStore  # noqa: PLC0415

            return SqliteStore.from_url(url, clock)
        # redis://host:6379/0?prefix=accord&shards=8; redis+cluster://h1:p1,h2:p2/?prefix=…
        if scheme in ("redis", "rediss", "redis+cluster"):
            from accord.adapters.stores.redis import RedisStore  # noqa: PLC0415

            return RedisStore.from_url(url, clock)
        if scheme == "postgresql":  # postgresql://user@host:5432/db?schema=accord&pool_size=10
            from accord.adapters.stores.postgres import PostgresStore  # noqa: PLC0415

            return PostgresStore.from_url(url, clock)
    except ValueError as exc:
        raise StoreError(f"store URL {url!r}: {exc}") from exc
    raise StoreError(
        f"store URL {url!r}: unknown scheme {scheme!r}; expected one of "
        + ", ".join(f"{s}://" for s in STORE_SCHEMES)
    )


def open_transport(
    url: str,
    *,
    clock: Clock | None = None,
    store: Store | None = None,
    delivery_limits: Mapping[str, int] | None = None,
) -> Transport:
    """Open the transport named by ``url``. ``delivery_limits`` overrides the per-queue delivery
    limit (default ``max_deliveries``); ``store`` is required by ``embedded://``."""
    try:
        scheme = _scheme(url)
        if scheme == "memory":
            from accord.adapters.transports.memory import MemoryTransport  # noqa: PLC0415

            return MemoryTransport(clock, QueueOptions.from_query(_query(url), delivery_limits))
        if scheme in ("sqlite", "embedded+sqlite"):
            from accord.adapters.transports.embedded import EmbeddedTransport  # noqa: PLC0415

            sqlite_url = url.split("+", 1)[1] if scheme == "embedded+sqlite" else url
            return EmbeddedTransport.from_url(sqlite_url, clock, delivery_limits)
        if scheme == "embedded":
            return _embedded_in(url, store, clock, delivery_limits)
        if scheme in ("bullmq", "redis+bullmq"):  # bullmq://host:port/db?prefix=…&stalled_ms=…
            from accord.adapters.transports.bullmq import BullmqTransport  # noqa: PLC0415

            return BullmqTransport.from_url(url, clock, delivery_limits)
        if scheme in ("amqp", "amqps"):  # amqp://user:pass@host:port/vhost?confirm_ms=…
            from accord.adapters.transports.rabbitmq import RabbitmqTransport  # noqa: PLC0415

            return RabbitmqTransport.from_url(url, clock, delivery_limits)
        if scheme == "postgresql":  # the queue tables in that schema (the store's URL works)
            from accord.adapters.transports.postgres import PostgresTransport  # noqa: PLC0415

            return PostgresTransport.from_url(url, clock, delivery_limits)
    except ValueError as exc:
        raise TransportError(f"transport URL {url!r}: {exc}", retryable=False) from exc
    raise TransportError(
        f"transport URL {url!r}: unknown scheme {scheme!r}; expected one of "
        + ", ".join(f"{s}://" for s in TRANSPORT_SCHEMES),
        retryable=False,
    )


async def reach_transport(transport: Transport) -> None:
    """One attempt to reach the broker behind ``transport`` (a ``PING`` to BullMQ's Redis; the
    publisher connection and channel of RabbitMQ, kept for later use); a retryable
    :class:`TransportError` naming why when it does not answer. In-process and SQLite transports
    need no broker: nothing to do. The caller bounds the wait (``asyncio.wait_for``)."""
    # a broker's transport module is loaded already if ``transport`` is one of its transports
    bullmq = sys.modules.get("accord.adapters.transports.bullmq")
    rabbitmq = sys.modules.get("accord.adapters.transports.rabbitmq")
    try:
        if bullmq is not None and isinstance(transport, bullmq.BullmqTransport):
            await transport.redis.ping()
        elif rabbitmq is not None and isinstance(transport, rabbitmq.RabbitmqTransport):
            await transport._channel()  # its connection is the one that publishes later
    except TransportError:
        raise
    except Exception as exc:  # the client's own connection errors
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise TransportError(f"cannot reach the broker: {why}", retryable=True) from exc


def open_engine(
    store_url: str,
    transport_url: str,
    clock: Clock | None = None,
    options: EngineOptions | None = None,
    *,
    actions: ActionRegistry | Mapping[str, ActionHandler] | None = None,
    sink: Sink | None = None,
    result_checks: Sequence[ResultHook] = (),
    observers: Sequence[Observer] = (),
    catalog: MessageCatalog | None = None,
    sealing: Keyring | None = None,
    remote: RemoteConfig | None = None,
    claims: ObjectStore | None = None,
) -> Engine:
    """An :class:`Engine` over the store and transport named by URL, owning both. One SQLite file
    named twice is one connection: the queue lives in the store's own database and joins its
    commits. ``ACCORD_CRASH_AT`` in the environment sets a crash point unless ``options`` does.
    ``sealing`` seals the sensitive fields of contexts and results at rest (it needs
    ``catalog``; see :mod:`accord.engine.runtime.sealed`). ``remote`` delivers the queues it
    names to remote HTTP workers (:mod:`accord.adapters.transports.http`, docs/remote-workers.md).
    ``claims`` is where job payloads above the claim-check threshold are checked in
    (:mod:`accord.objects.claims`; docs/protocol.md §9).
    """
    opts = options or EngineOptions()
    if opts.crash_at is None and os.environ.get(CRASH_ENV):
        opts = dataclasses.replace(opts, crash_at=os.environ[CRASH_ENV])
    if opts.trace_sample is None:  # the runs' sampling decision follows this process's tracing
        from accord.adapters.telemetry import otel  # noqa: PLC0415

        opts = dataclasses.replace(opts, trace_sample=otel.engine_ratio())
    clk: Clock = clock or SystemClock()
    store = open_store(store_url, clock=clk)
    if transport_url == store_url and store_url.startswith("sqlite:"):
        # one file: share the store's connection and thread, so this process's queue and
        # store writes never wait on each other's SQLite write lock
        query = [(k, v) for k, v in parse_qsl(urlsplit(store_url).query) if k in _QUEUE_OPTS]
        transport = open_transport(f"embedded://?{urlencode(query)}", clock=clk, store=store)
    else:
        transport = open_transport(transport_url, clock=clk)
    if remote is not None and remote.remotes:
        from accord.adapters.transports.http import HttpDispatchTransport  # noqa: PLC0415

        transport = HttpDispatchTransport(transport, remote)
    return Engine(
        store, transport, clk, opts, actions=actions, sink=sink, result_checks=result_checks,
        observers=observers, catalog=catalog, owns_ports=True, sealing=sealing, claims=claims,
    )  # fmt: skip


def _embedded_in(
    url: str, store: Store | None, clock: Clock | None, limits: Mapping[str, int] | None
) -> Transport:
    from accord.adapters.stores.memory import MemoryStore  # noqa: PLC0415
    from accord.adapters.stores.sqlite import SqliteStore  # noqa: PLC0415
    from accord.adapters.transports.embedded import EmbeddedTransport  # noqa: PLC0415
    from accord.adapters.transports.memory import MemoryTransport  # noqa: PLC0415

    options = QueueOptions.from_query(_query(url), limits)
    if isinstance(store, SqliteStore):
        return EmbeddedTransport(store.db, clock or store.clock, options, owns_db=False)
    if isinstance(store, MemoryStore):
        return MemoryTransport(clock or store.clock, options)
    raise ValueError("embedded:// needs store= (a SQLite or memory store) to live in")


def _query(url: str) -> list[tuple[str, str]]:
    pairs = parse_qsl(urlsplit(url).query)
    unknown = sorted({k for k, _ in pairs} - SHARED_OPTS)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown}; known: {sorted(SHARED_OPTS)}")
    return pairs
