"""One PostgreSQL schema as the store and the queue share it: URL, pool, errors, migrations.

URL form (shared by the store and the transport, so one URL opens both)::

    postgresql://user[:password]@host[:port]/database?schema=accord&pool_size=10&migrate=auto
                 (plus the queue options visibility_ms, max_deliveries, dedup_ms, poll_ms)

- ``schema`` (default ``accord``): every table lives in this schema, created when missing; the
  connections' ``search_path`` is set to it, so two schemas in one database never see each other
  (the tests give each test its own). A schema name is an identifier of at most 40 characters
  from ``[a-z0-9_]`` (it also names the queue's notification channel).
- ``pool_size`` (10): connections per store or transport handle (asyncpg pool, opened lazily on
  first use in the event loop that uses it).
- ``migrate`` (``auto``): apply pending schema migrations on first use, under an advisory lock;
  ``off`` refuses to start on a schema that is behind (apply them with ``accord store migrate``).
  Either way a schema *newer* than this code knows is refused, naming both versions.
- ``sslmode``, ``connect_timeout_ms`` (10000): passed to the driver.
- ``shards`` (8): the store's shard count (see :mod:`accord.adapters.stores.postgres`), recorded
  in ``accord_meta`` by the first store opened on the schema; a store opened with another count
  is refused, naming the recorded one. The queue ignores it (one URL opens both).

Errors are translated at this edge (:func:`errors`): a lost connection (or one the driver
caught mid-operation), a server starting or shutting down, a serialisation failure or deadlock,
too many connections become retryable
:class:`~accord.errors.StoreError` / :class:`~accord.errors.TransportError`; anything else a
non-retryable one naming the operation.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias
from urllib.parse import parse_qsl, unquote, urlsplit

import asyncpg

from accord.adapters import _store_rules as rules
from accord.adapters.stores.postgres._schema import MIGRATIONS, SCHEMA_VERSION
from accord.engine.ports import shard_of
from accord.errors import AccordError, StoreError, TransportError

__all__ = ["OPTIONS", "Database", "PgTarget", "errors", "parse_url"]

Kind: TypeAlias = Literal["store", "transport"]
PoolConnection: TypeAlias = "asyncpg.pool.PoolConnectionProxy[asyncpg.Record]"
OPTIONS = frozenset({"schema", "pool_size", "migrate", "sslmode", "connect_timeout_ms", "shards"})
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,39}\Z")
# SQLSTATE classes and codes worth trying again: connection exceptions, insufficient
# resources, operator intervention (admin shutdown, cannot connect now), serialisation, deadlock
_RETRY_CLASSES = ("08", "53", "57")
_RETRY_CODES = frozenset({"40001", "40P01"})
# a pooled connection caught mid-operation when its server went away (the driver's own state
# error): the pool replaces it, so the call may be made again
_CLIENT_STATE = asyncpg.InternalClientError
COMMAND_TIMEOUT_S = 60.0  # no statement of the adapters takes near this long: past it, a hang


@dataclass(frozen=True, slots=True)
class PgTarget:
    """Where a URL points: the driver's DSN and our own options."""

    dsn: str
    schema: str
    pool_size: int
    migrate: bool
    connect_timeout_s: float
    options: Mapping[str, str]  # every option of the URL (the queue's too)

    @property
    def key(self) -> str:
        """Identity of the schema: two handles with the same key share tables."""
        parts = urlsplit(self.dsn)
        return f"postgresql://{parts.hostname}:{parts.port or 5432}{parts.path}#{self.schema}"

    @property
    def channel(self) -> str:
        """The queue's notification channel (``LISTEN``/``NOTIFY``)."""
        return f"accord_jobs_{self.schema}"


def parse_url(url: str, extra: frozenset[str] = rules.SHARED_OPTS) -> PgTarget:
    """A ``postgresql://`` URL as a :class:`PgTarget`; unknown options are refused by name."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "postgresql":
        raise ValueError(f"expected a postgresql:// URL, got scheme {parts.scheme!r}")
    if not parts.hostname:
        raise ValueError("no host; write postgresql://user@host:5432/database")
    database = unquote(parts.path.removeprefix("/"))
    if not database or "/" in database:
        raise ValueError("no database name; write postgresql://user@host:5432/database")
    _ = parts.port  # a port that is not a number raises ValueError here, naming it
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(options) - OPTIONS - extra)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown}; known: {sorted(OPTIONS | extra)}")
    schema = options.get("schema", "accord")
    if not _SCHEMA_NAME.match(schema):
        raise ValueError(
            f"option schema={schema!r}: expected an identifier of 1-40 characters from"
            " [a-z0-9_], not starting with a digit"
        )
    pool_size = rules.int_option(options, "pool_size", 10)
    if pool_size < 1:
        raise ValueError(f"option pool_size={pool_size}: expected an integer >= 1")
    migrate = options.get("migrate", "auto")
    if migrate not in ("auto", "off"):
        raise ValueError(f"option migrate={migrate!r}: expected auto or off")
    timeout_ms = rules.int_option(options, "connect_timeout_ms", 10_000)
    if timeout_ms < 1:
        raise ValueError(f"option connect_timeout_ms={timeout_ms}: expected an integer >= 1")
    query = f"?sslmode={options['sslmode']}" if "sslmode" in options else ""
    dsn = f"postgresql://{parts.netloc}{parts.path}{query}"
    return PgTarget(dsn, schema, pool_size, migrate == "auto", timeout_ms / 1000, options)


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, (OSError, TimeoutError, asyncpg.InterfaceError, _CLIENT_STATE)):
        return True
    code = getattr(exc, "sqlstate", None) or ""
    return code in _RETRY_CODES or code[:2] in _RETRY_CLASSES


def _server_gone(exc: BaseException | None) -> bool:
    """A connection-level failure (not a statement's own error, a timeout or a busy server)."""
    if isinstance(exc, (OSError, asyncpg.InterfaceError, _CLIENT_STATE)):
        return not isinstance(exc, TimeoutError)
    code = getattr(exc, "sqlstate", None) or ""
    return code[:2] == "08" or code in ("57P01", "57P02", "57P03")


def _error(kind: Kind, message: str, *, retryable: bool) -> AccordError:
    if kind == "transport":
        return TransportError(message, retryable=retryable)
    return StoreError(message, retryable=retryable)


@contextlib.contextmanager
def errors(what: str, kind: Kind = "store", where: str = "") -> Any:
    """Translate driver and connection errors raised inside into accord's own (see above)."""
    try:
        yield
    except AccordError:
        raise
    except (TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, _CLIENT_STATE,
            OSError) as exc:  # fmt: skip
        text = " ".join(str(exc).split()) or type(exc).__name__
        code = getattr(exc, "sqlstate", None)
        detail = f"{type(exc).__name__}{f' [{code}]' if code else ''}: {text}"
        place = f" ({where})" if where else ""
        raise _error(kind, f"postgresql {what} failed{place}: {detail}",
                     retryable=_retryable(exc)) from exc  # fmt: skip


class Database:
    """An asyncpg pool on one schema, opened on first use; migrations checked once per pool."""

    def __init__(self, target: PgTarget, kind: Kind, *, shards: int | None = None) -> None:
        self.target = target
        self.kind: Kind = kind
        self.shards = shards  # a store's: checked against (or recorded as) the schema's count
        self._pool: asyncpg.Pool | None = None
        self._opening: asyncio.Lock | None = None
        self._closed = False

    @property
    def where(self) -> str:
        return self.target.key

    async def pool(self) -> asyncpg.Pool:
        if self._closed:
            raise _error(self.kind, f"postgresql {self.where}: handle is closed", retryable=False)
        if self._pool is not None:
            return self._pool
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._pool is None:
                with errors("connect", self.kind, self.where):
                    await ensure_schema(
                        self.target, migrate=self.target.migrate, shards=self.shards
                    )
                    self._pool = await asyncpg.create_pool(
                        self.target.dsn,
                        min_size=0,  # no floor kept: the pool reconnects on demand
                        max_size=self.target.pool_size,
                        timeout=self.target.connect_timeout_s,
                        command_timeout=COMMAND_TIMEOUT_S,
                        server_settings={"search_path": self.target.schema},
                    )
        return self._pool

    @contextlib.asynccontextmanager
    async def connection(self, what: str) -> AsyncIterator[PoolConnection]:
        """A pooled connection, errors inside translated (see :func:`errors`). When the server
        went away (a connection lost or caught mid-operation) the whole pool is dropped, every
        connection of it closed, and the next call opens a fresh one: after a restart or a
        failover no dead or wedged connection is handed out again."""
        pool = await self.pool()
        try:
            with errors(what, self.kind, self.where):
                async with pool.acquire(timeout=self.target.connect_timeout_s) as conn:
                    yield conn
        except AccordError as exc:
            if (
                getattr(exc, "retryable", False)
                and self._pool is pool
                and _server_gone(exc.__cause__)
            ):
                self._pool = None
                pool.terminate()
            raise

    async def close(self) -> None:
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pool.close(), 10)


async def schema_version(conn: asyncpg.Connection, schema: str) -> int:
    """The version of ``schema`` (0: no accord tables there yet)."""
    table = await conn.fetchval("SELECT to_regclass($1)", f'"{schema}".accord_schema')
    if table is None:
        return 0
    return int(
        await conn.fetchval(f'SELECT coalesce(max(version), 0) FROM "{schema}".accord_schema')
    )


def newer_schema(schema: str, found: int) -> str:
    return (
        f"schema {schema!r} is at version {found}, newer than this accord knows"
        f" ({SCHEMA_VERSION}); upgrade accord before using it"
    )


async def ensure_schema(
    target: PgTarget, *, migrate: bool, shards: int | None = None
) -> tuple[int, list[int]]:
    """Check (and with ``migrate``, bring up to date) the schema: ``(version before, versions
    applied)``. One transaction under an advisory lock, so concurrent starts apply each
    migration once. A newer schema is refused (non-retryable). ``shards`` (a store's count) is
    recorded, or checked against the recorded one, in the same transaction."""
    conn = await asyncpg.connect(target.dsn, timeout=target.connect_timeout_s)
    try:
        async with conn.transaction():
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext($1))", f"accord:{target.schema}"
            )
            found = await schema_version(conn, target.schema)
            if found > SCHEMA_VERSION:
                raise StoreError(newer_schema(target.schema, found))
            if found < SCHEMA_VERSION and not migrate:
                raise StoreError(
                    f"schema {target.schema!r} is at version {found}, this accord needs"
                    f" {SCHEMA_VERSION}: run `accord store migrate --store URL`"
                )
            applied = []
            if found < SCHEMA_VERSION:
                await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{target.schema}"')
            await conn.execute(f'SET LOCAL search_path = "{target.schema}"')
            if found < SCHEMA_VERSION:
                await conn.execute(
                    "CREATE TABLE IF NOT EXISTS accord_schema (version integer PRIMARY KEY,"
                    " applied_at timestamptz NOT NULL DEFAULT now())"
                )
                for version, sql in MIGRATIONS:
                    if version > found:
                        await conn.execute(sql)
                        await conn.execute(
                            "INSERT INTO accord_schema (version) VALUES ($1)", version
                        )
                        applied.append(version)
            if shards is not None:
                await _record_shards(conn, target, shards)
            return found, applied
    finally:
        await conn.close()


async def _record_shards(conn: asyncpg.Connection, target: PgTarget, count: int) -> None:
    """Record the shard count (the first store opened on the schema) or refuse another; when it
    is first recorded, give the rows written before shards existed their shard."""
    first = await conn.fetchval(
        "INSERT INTO accord_meta VALUES ('shards', $1) ON CONFLICT (key) DO NOTHING RETURNING 1",
        str(count),
    )
    if first is None:
        recorded = int(await conn.fetchval("SELECT value FROM accord_meta WHERE key = 'shards'"))
        if recorded != count:
            raise StoreError(
                f"PostgreSQL schema {target.schema!r} at {target.key} was created with"
                f" shards={recorded}; this store was opened with shards={count}."
                f" Open it with ?shards={recorded}."
            )
        return
    tables = (("accord_outbox", "id", "bigint"), ("accord_timers", "timer_id", "text"))
    for table, key, kind in tables:
        rows = await conn.fetch(f"SELECT {key}, run_id FROM {table} WHERE shard IS NULL")
        if rows:
            await conn.execute(
                f"UPDATE {table} t SET shard = x.s FROM unnest($1::{kind}[], $2::integer[])"
                f" AS x(k, s) WHERE t.{key} = x.k",
                [r[0] for r in rows],
                [shard_of(r[1], count) for r in rows],
            )
