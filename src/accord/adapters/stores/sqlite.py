"""The embedded default store: run state, history, outbox, timers and plans in one SQLite file.

One :meth:`SqliteStore.commit` is one ``BEGIN IMMEDIATE`` transaction: compare-and-set on
``accord_runs.version`` (an ``UPDATE … WHERE version = ?`` that must touch exactly one row, or an
``INSERT`` that must not find one when creating), then the history rows, outbox rows, timer
cancellations and timer upserts, in that order. Any failure rolls the whole transaction back, so a
losing writer sees :class:`~accord.errors.ConflictError` with nothing changed and reloads.

Leases use one ``avail_at`` column per claimable row: a row is claimable when ``avail_at <= now``;
claiming sets it to ``now + lease``; so a lapsed lease needs no sweeper, and one index serves the
claim. Re-setting a timer replaces its due time and clears the lease.

Every commit's pages are written to the WAL and synced, so the schema keeps them few: the run
record is an ordinary rowid table (a run's JSON, a few KiB, fits its leaf page; a ``WITHOUT
ROWID`` row spills past about 1 KiB into overflow pages), only ``updated_at``'s own index moves on
every commit (the status, workflow and tenant indexes change only when those do), and timers are
keyed by id alone (``WITHOUT ROWID``: no second index to keep). Outbox entries are deleted
when done. JSON is stored as canonical text. Several processes may share the file; each opens its
own store, and the write lock of ``BEGIN IMMEDIATE`` plus the CAS keeps them correct.

Shards (:class:`~accord.engine.ports.Shards`): the ``shards`` URL option (1 by default: one
embedded engine owns every shard) is recorded in ``accord_meta`` when the file is created; a
file opened later with another count is refused, naming the recorded one (a file made before
shards existed gets the count it is first opened with). Outbox and timer rows carry a ``shard``
column (:func:`~accord.engine.ports.shard_of` of their run, computed here on insert; an older
file is given it and backfilled on open, in one transaction), indexed with ``avail_at`` for
per-shard claims. ``accord_engines`` holds the beats, ``accord_leases`` one row per shard ever
leased (owner, epoch, expiry), all on the store's clock. A fenced commit first reads its shard's
lease row inside its own ``BEGIN IMMEDIATE`` transaction, which holds the file's write lock, so
no ``hold_shards`` of any process can slip between that check and the writes: a lease not held by
the fence's owner at its epoch raises :class:`~accord.errors.OwnershipLost` and, under group
commit, that write alone is rolled back. A lease taken at a new epoch is a durable write (an epoch
must never go backwards after a power cut); beats, renewals and releases skip their own fsync.

URL options: ``synchronous`` (FULL by default), ``busy_timeout_ms`` (5000), ``shards`` (1).
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Callable, Collection, Sequence
from typing import Any

from accord.adapters import _store_rules as rules
from accord.adapters._sqlite import Database, parse_sqlite_url
from accord.adapters.clock import SystemClock
from accord.adapters.stores.sqlite_catalog import SqliteCatalog
from accord.engine.ports import Clock, Commit, OutboxEntry, ShardLease, StoredRun, Timer, shard_of
from accord.errors import ConflictError, OwnershipLost, StoreError

__all__ = ["SCHEMA", "SqliteStore"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS accord_runs (
  run_id TEXT PRIMARY KEY, version INTEGER NOT NULL, state TEXT NOT NULL,
  history_len INTEGER NOT NULL, status TEXT, workflow TEXT, tenant TEXT,
  updated_at INTEGER NOT NULL, labels TEXT NOT NULL DEFAULT '{}');
CREATE INDEX IF NOT EXISTS accord_runs_status_only ON accord_runs (status);
CREATE INDEX IF NOT EXISTS accord_runs_workflow_only ON accord_runs (workflow);
CREATE INDEX IF NOT EXISTS accord_runs_tenant_only ON accord_runs (tenant);
CREATE INDEX IF NOT EXISTS accord_runs_updated ON accord_runs (updated_at);
CREATE TABLE IF NOT EXISTS accord_history (
  run_id TEXT NOT NULL, seq INTEGER NOT NULL, entry TEXT NOT NULL,
  PRIMARY KEY (run_id, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS accord_outbox (
  entry_id TEXT NOT NULL UNIQUE, run_id TEXT NOT NULL, topic TEXT NOT NULL,
  payload TEXT NOT NULL, created_at INTEGER NOT NULL, avail_at INTEGER NOT NULL, owner TEXT,
  shard INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS accord_outbox_pending ON accord_outbox (avail_at);
CREATE TABLE IF NOT EXISTS accord_timers (
  timer_id TEXT PRIMARY KEY, run_id TEXT NOT NULL, due_at INTEGER NOT NULL,
  payload TEXT NOT NULL, avail_at INTEGER NOT NULL, owner TEXT,
  shard INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS accord_timers_due ON accord_timers (avail_at);
CREATE TABLE IF NOT EXISTS accord_plans (
  digest TEXT PRIMARY KEY, document TEXT NOT NULL, stored_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS accord_activations (
  id INTEGER PRIMARY KEY AUTOINCREMENT, workflow TEXT NOT NULL, digest TEXT NOT NULL,
  activated_at INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS accord_activations_wf ON accord_activations (workflow, id);
CREATE TABLE IF NOT EXISTS accord_capabilities (
  worker_id TEXT NOT NULL, capability TEXT NOT NULL, expires_at INTEGER NOT NULL,
  PRIMARY KEY (worker_id, capability)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS accord_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS accord_engines (
  engine TEXT PRIMARY KEY, expires_at INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS accord_leases (
  shard INTEGER PRIMARY KEY, owner TEXT NOT NULL, epoch INTEGER NOT NULL,
  expires_at INTEGER NOT NULL)
"""
# made once the ``shard`` columns exist (a file older than them is given them first)
_SHARD_INDEXES = (
    "CREATE INDEX IF NOT EXISTS accord_outbox_shard ON accord_outbox (shard, avail_at)",
    "CREATE INDEX IF NOT EXISTS accord_timers_shard ON accord_timers (shard, avail_at)",
)

_INSERT_RUN = (
    "INSERT INTO accord_runs (run_id, version, state, history_len, status, workflow, tenant,"
    " updated_at, labels) VALUES (?, 1, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING"
)


@functools.lru_cache(maxsize=16)
def _update_run(columns: tuple[str, ...], labels: bool) -> str:
    """The CAS update, setting only the index columns the commit names: SQLite rewrites an
    index whenever its column is assigned, even to the same value."""
    sets = "".join(f", {c} = ?" for c in columns) + (", labels = json_patch(labels, ?)" * labels)
    return (
        "UPDATE accord_runs SET version = version + 1, state = ?, history_len = history_len + ?,"
        f" updated_at = ?{sets} WHERE run_id = ? AND version = ? RETURNING history_len"
    )


_INSERT_HISTORY = "INSERT INTO accord_history (run_id, seq, entry) VALUES (?, ?, ?)"
_INSERT_OUTBOX = (
    "INSERT INTO accord_outbox (entry_id, run_id, topic, payload, created_at, shard, avail_at)"
    " VALUES (?, ?, ?, ?, ?, ?, 0)"
)
_CANCEL_TIMER = "DELETE FROM accord_timers WHERE timer_id = ?"
_UPSERT_TIMER = (
    "INSERT INTO accord_timers (timer_id, run_id, due_at, payload, shard, avail_at)"
    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (timer_id) DO UPDATE SET run_id = excluded.run_id,"
    " due_at = excluded.due_at, payload = excluded.payload, shard = excluded.shard,"
    " avail_at = excluded.due_at, owner = NULL"
)
_FENCE = "SELECT 1 FROM accord_leases WHERE shard = ? AND owner = ? AND epoch = ?"
_CLAIM_TIMERS = (
    "UPDATE accord_timers SET owner = ?, avail_at = ? WHERE timer_id IN ("
    " SELECT timer_id FROM accord_timers WHERE avail_at <= ?{where} ORDER BY avail_at"
    " LIMIT ?) RETURNING timer_id, run_id, due_at, payload"
)
_CLAIM_OUTBOX = (
    "UPDATE accord_outbox SET owner = ?, avail_at = ? WHERE rowid IN ("
    " SELECT rowid FROM accord_outbox WHERE avail_at <= ?{where} ORDER BY avail_at, rowid"
    " LIMIT ?) RETURNING rowid, entry_id, run_id, topic, payload, created_at"
)
_IN_SHARDS = " AND shard IN (SELECT value FROM json_each(?))"


class _NeedsDurable(Exception):
    """Raised by a non-durable ``hold_shards`` attempt that would change an epoch: rolled back,
    and made again as a durable write."""


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def _prepare_shards(conn: sqlite3.Connection, count: int, path: str) -> None:
    """Record (or check) the shard count, give a file older than shards its ``shard`` columns
    (backfilled from the run ids) and their indexes: one write transaction."""
    conn.execute("INSERT OR IGNORE INTO accord_meta VALUES ('shards', ?)", (str(count),))
    recorded = int(conn.execute("SELECT value FROM accord_meta WHERE key = 'shards'").fetchone()[0])
    if recorded != count:
        raise StoreError(
            f"SQLite store {path!r} was created with shards={recorded}; this store was opened"
            f" with shards={count}. Open it with ?shards={recorded}."
        )
    for table, key in (("accord_outbox", "rowid"), ("accord_timers", "timer_id")):
        if "shard" not in _columns(conn, table):
            conn.execute(f"ALTER TABLE {table} ADD COLUMN shard INTEGER NOT NULL DEFAULT 0")
            rows = conn.execute(f"SELECT {key}, run_id FROM {table}").fetchall()
            conn.executemany(
                f"UPDATE {table} SET shard = ? WHERE {key} = ?",
                [(shard_of(run_id, count), k) for k, run_id in rows],
            )
    for ddl in _SHARD_INDEXES:
        conn.execute(ddl)


class SqliteStore(SqliteCatalog):
    """:class:`~accord.engine.ports.Store` over one SQLite file (see the module docstring)."""

    def __init__(
        self,
        db: Database,
        clock: Clock | None = None,
        *,
        owns_db: bool = True,
        shards: int = 1,
    ) -> None:
        if not 1 <= shards <= rules.MAX_SHARDS:
            raise ValueError(f"shards must be from 1 to {rules.MAX_SHARDS}, not {shards}")
        self.db = db
        self.clock: Clock = clock or SystemClock()
        self._owns_db = owns_db
        self._shard_count = shards
        try:
            db.ensure_schema(SCHEMA)
            # the database's own thread runs it as one write transaction, before any other job
            db._sync_job(
                functools.partial(_prepare_shards, count=shards, path=db.path),
                "open (shards)",
                write=True,
            )
        except BaseException:
            if owns_db:
                db.close_sync()
            raise

    @classmethod
    def from_url(cls, url: str, clock: Clock | None = None) -> SqliteStore:
        path, opts = parse_sqlite_url(
            url, {"synchronous", "busy_timeout_ms", "shards", *rules.SHARED_OPTS}
        )
        shards = rules.shard_count_option(opts, 1)
        db = Database(
            path,
            synchronous=opts.get("synchronous", "FULL"),
            busy_timeout_ms=rules.int_option(opts, "busy_timeout_ms", 5000),
        )
        return cls(db, clock, shards=shards)

    async def load(self, run_id: str) -> StoredRun | None:
        def read(conn: sqlite3.Connection) -> StoredRun | None:
            row = conn.execute(
                "SELECT version, state FROM accord_runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            return None if row is None else StoredRun(run_id, row[0], json.loads(row[1]))

        return await self.db.read(read, "load")

    async def commit(
        self,
        commit: Commit,
        riders: Sequence[Callable[[sqlite3.Connection], object]] = (),
        *,
        durable: bool = True,
    ) -> int:
        """The atomic step; ``riders`` (queue writes of a transport on this same database, see
        :mod:`accord.engine.runtime.joint`) run inside the same transaction, after the CAS
        succeeded. ``durable=False`` lets it skip its own fsync (see
        :mod:`accord.adapters._sqlite`): only
        for a commit whose loss in a power cut the queue undoes by redelivery."""
        encoded = rules.encode_commit(commit, self.clock.now_ms())
        state, history = encoded.state, encoded.history
        count = self._shard_count
        outbox = [(*o, shard_of(o[1], count)) for o in encoded.outbox]
        # a timer is claimable from its due time
        timers = [(*t, shard_of(t[1], count), t[2]) for t in encoded.timers]
        cols, labels, updated_at = encoded.columns, encoded.labels, encoded.updated_at
        labels_json = rules.dump(labels, "index")
        run_id, expected, fence = commit.run_id, commit.expected_version, commit.fence

        def body(conn: sqlite3.Connection) -> int:
            # under this transaction's write lock: no hold_shards can land between check and write
            if fence is not None and (
                conn.execute(_FENCE, (fence.shard, fence.owner, fence.epoch)).fetchone() is None
            ):
                raise OwnershipLost(fence.shard, fence.owner, fence.epoch)
            if expected == 0:
                cur = conn.execute(
                    _INSERT_RUN,
                    (run_id, state, len(history), *cols, updated_at, labels_json),
                )
                if cur.rowcount != 1:
                    raise ConflictError(f"run {run_id!r} already exists (expected to create it)")
                first = 0
            else:
                named = tuple(c for c, v in zip(rules.COLUMNS, cols, strict=True) if v is not None)
                values = [v for v in cols if v is not None] + ([labels_json] if labels else [])
                row = conn.execute(
                    _update_run(named, bool(labels)),
                    (state, len(history), updated_at, *values, run_id, expected),
                ).fetchone()
                if row is None:
                    raise ConflictError(f"run {run_id!r} is not at version {expected}")
                first = row[0] - len(history)
            if history:
                conn.executemany(
                    _INSERT_HISTORY, [(run_id, first + i, h) for i, h in enumerate(history)]
                )
            if outbox:
                conn.executemany(_INSERT_OUTBOX, outbox)
            if commit.timers_cancel:
                conn.executemany(_CANCEL_TIMER, [(t,) for t in commit.timers_cancel])
            if timers:
                conn.executemany(_UPSERT_TIMER, timers)
            for ride in riders:
                ride(conn)
            return expected + 1

        return await self.db.write(body, "commit", durable=durable)

    async def history(self, run_id: str) -> list[dict[str, Any]]:
        def read(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            rows = conn.execute(
                "SELECT entry FROM accord_history WHERE run_id = ? ORDER BY seq", (run_id,)
            )
            return [json.loads(r[0]) for r in rows]

        return await self.db.read(read, "history")

    def _shard_filter(self, shards: Collection[int] | None) -> tuple[str, tuple[str, ...]] | None:
        """A claim's extra condition and its argument: none for every shard, ``None`` for no
        shard at all (nothing to claim)."""
        if shards is None:
            return "", ()
        wanted = rules.check_shards(list(shards), self._shard_count)
        return (_IN_SHARDS, (json.dumps(wanted),)) if wanted else None

    async def claim_timers(
        self,
        now_ms: int,
        limit: int,
        owner: str,
        lease_ms: int,
        shards: Collection[int] | None = None,
    ) -> list[Timer]:
        only = self._shard_filter(shards)
        if only is None:
            return []
        sql, args = _CLAIM_TIMERS.format(where=only[0]), only[1]

        def claim(conn: sqlite3.Connection) -> list[Timer]:
            rows = conn.execute(sql, (owner, now_ms + lease_ms, now_ms, *args, limit)).fetchall()
            timers = [Timer(r[0], r[1], r[2], json.loads(r[3])) for r in rows]
            return sorted(timers, key=lambda t: (t.due_at_ms, t.timer_id))

        return await self.db.write(claim, "claim_timers", durable=False)

    async def claim_outbox(
        self, limit: int, owner: str, lease_ms: int, shards: Collection[int] | None = None
    ) -> list[OutboxEntry]:
        only = self._shard_filter(shards)
        if only is None:
            return []
        sql, args = _CLAIM_OUTBOX.format(where=only[0]), only[1]
        now = self.clock.now_ms()

        def claim(conn: sqlite3.Connection) -> list[OutboxEntry]:
            rows = conn.execute(sql, (owner, now + lease_ms, now, *args, limit)).fetchall()
            rows.sort()
            return [OutboxEntry(r[1], r[2], r[3], json.loads(r[4]), r[5]) for r in rows]

        return await self.db.write(claim, "claim_outbox", durable=False)

    async def outbox_done(self, entry_ids: Sequence[str]) -> None:
        ids = [(e,) for e in entry_ids]
        if ids:
            await self.db.write(
                lambda c: c.executemany("DELETE FROM accord_outbox WHERE entry_id = ?", ids),
                "outbox_done",
            )

    async def prune(self, ended_before_ms: int, limit: int) -> int:
        """Remove up to ``limit`` ended runs last committed before ``ended_before_ms`` (see
        :meth:`~accord.engine.ports.Store.prune`). Each step is one write transaction of at most
        :data:`~accord.adapters._store_rules.PRUNE_STEP` runs, found through the ``updated_at``
        index; their timers and outbox rows are found by a scan of those tables, which hold
        only pending work."""
        ended = ",".join("?" * len(rules.ENDED))

        def step(conn: sqlite3.Connection, count: int) -> int:
            rows = conn.execute(
                f"SELECT run_id FROM accord_runs WHERE updated_at < ? AND status IN ({ended})"
                " ORDER BY updated_at LIMIT ?",
                (ended_before_ms, *rules.ENDED, count),
            ).fetchall()
            if rows:
                ids = json.dumps([r[0] for r in rows])
                pruned = "(SELECT value FROM json_each(?))"
                conn.execute(f"DELETE FROM accord_runs WHERE run_id IN {pruned}", (ids,))
                conn.execute(f"DELETE FROM accord_history WHERE run_id IN {pruned}", (ids,))
                conn.execute(f"DELETE FROM accord_timers WHERE run_id IN {pruned}", (ids,))
                conn.execute(f"DELETE FROM accord_outbox WHERE run_id IN {pruned}", (ids,))
            return len(rows)

        removed = 0
        while removed < limit:
            count = min(rules.PRUNE_STEP, limit - removed)
            done = await self.db.write(functools.partial(step, count=count), "prune")
            removed += done
            if done < count:
                break
        return removed

    # -- shards (accord.engine.ports.Shards) ------------------------------------------------

    @property
    def shard_count(self) -> int:
        return self._shard_count

    async def beat(self, engine: str, ttl_ms: int) -> list[str]:
        now = self.clock.now_ms()

        def beat(conn: sqlite3.Connection) -> list[str]:
            conn.execute(
                "INSERT INTO accord_engines VALUES (?, ?)"
                " ON CONFLICT (engine) DO UPDATE SET expires_at = excluded.expires_at",
                (engine, now + ttl_ms),
            )
            rows = conn.execute(
                "SELECT engine FROM accord_engines WHERE expires_at > ? ORDER BY engine", (now,)
            )
            return [r[0] for r in rows]

        return await self.db.write(beat, "beat", durable=False)

    async def leave(self, engine: str) -> None:
        now = self.clock.now_ms()

        def leave(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM accord_engines WHERE engine = ?", (engine,))
            conn.execute(
                "UPDATE accord_leases SET expires_at = ? WHERE owner = ? AND expires_at > ?",
                (now, engine, now),
            )

        await self.db.write(leave, "leave", durable=False)

    async def hold_shards(self, engine: str, shards: Sequence[int], ttl_ms: int) -> dict[int, int]:
        wanted = rules.check_shards(shards, self._shard_count)
        now = self.clock.now_ms()

        def hold(conn: sqlite3.Connection, *, durable: bool) -> dict[int, int]:
            found = {
                r[0]: (r[1], r[2], r[3])
                for r in conn.execute(
                    "SELECT shard, owner, epoch, expires_at FROM accord_leases"
                    " WHERE shard IN (SELECT value FROM json_each(?))",
                    (json.dumps(wanted),),
                )
            }
            held: dict[int, int] = {}
            for shard in wanted:
                lease = found.get(shard)
                if lease is None:
                    epoch = 1
                else:
                    owner, last, expires_at = lease
                    if expires_at > now and owner != engine:
                        continue  # another engine's, not yet lapsed
                    epoch = last if expires_at > now else last + 1
                if not durable and (lease is None or epoch != lease[1]):
                    raise _NeedsDurable
                held[shard] = epoch
            conn.executemany(
                "INSERT INTO accord_leases VALUES (?, ?, ?, ?) ON CONFLICT (shard) DO UPDATE SET"
                " owner = excluded.owner, epoch = excluded.epoch, expires_at = excluded.expires_at",
                [(shard, engine, epoch, now + ttl_ms) for shard, epoch in held.items()],
            )
            return held

        try:  # a plain renewal may skip its fsync; a new epoch must survive a power cut
            renew = functools.partial(hold, durable=False)
            return await self.db.write(renew, "hold_shards", durable=False)
        except _NeedsDurable:
            return await self.db.write(functools.partial(hold, durable=True), "hold_shards")

    async def release_shards(self, engine: str, shards: Sequence[int]) -> None:
        now = self.clock.now_ms()
        which = json.dumps(list(shards))
        await self.db.write(
            lambda conn: conn.execute(
                "UPDATE accord_leases SET expires_at = ? WHERE owner = ? AND expires_at > ?"
                " AND shard IN (SELECT value FROM json_each(?))",
                (now, engine, now, which),
            ),
            "release_shards",
            durable=False,
        )

    async def shard_leases(self) -> list[ShardLease]:
        def read(conn: sqlite3.Connection) -> list[ShardLease]:
            rows = conn.execute(
                "SELECT shard, owner, epoch, expires_at FROM accord_leases ORDER BY shard"
            )
            return [ShardLease(r[0], r[1], r[2], r[3]) for r in rows]

        return await self.db.read(read, "shard_leases")

    async def close(self) -> None:
        if self._owns_db:
            await self.db.close()
