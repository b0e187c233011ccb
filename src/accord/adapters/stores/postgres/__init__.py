"""The PostgreSQL store: run state, history, outbox, timers and plans in one database schema.

One :meth:`PostgresStore.commit` is one SQL statement, and so one transaction and one round
trip: data-modifying CTEs over the compare-and-set of the run row (an ``UPDATE … WHERE version =
$n`` that must return its row, or an ``INSERT … ON CONFLICT DO NOTHING`` that must, when
creating), then the history rows, outbox rows, timer cancellations and timer upserts, each
joined to the CAS's result, so nothing is written when it matched no row. Any error (a duplicate
outbox id, say) aborts the whole statement. Under ``READ COMMITTED`` two writers racing on one run
serialise on its row lock; the loser re-reads the row, its version no longer matches, and it gets
:class:`~accord.errors.ConflictError` with nothing changed.

Claims lease rows with ``FOR UPDATE SKIP LOCKED`` (concurrent claimers never wait on each other
and never take the same row) and, as in the SQLite store, one ``avail_at`` column per claimable
row: claiming sets it to ``now + lease``, so a lapsed lease needs no sweeper. All times come from
the store's clock, never the server's. The port has no wait hook for claimers, so the store does
not notify; the PostgreSQL queue (:mod:`accord.adapters.transports.postgres`) wakes its
consumers with ``LISTEN``/``NOTIFY``.

Shards (:class:`~accord.engine.ports.Shards`): the ``shards`` URL option (8 by default) is
recorded in ``accord_meta`` by the first store opened on the schema and checked by every later one
(:func:`._db.ensure_schema`); outbox and timer rows carry a ``shard`` column
(:func:`~accord.engine.ports.shard_of` of their run, computed here; rows from before migration 2
are backfilled when the count is first recorded), indexed with ``avail_at`` for per-shard claims.
``accord_engines`` holds the beats and ``accord_leases`` one row per shard ever leased; taking or
renewing leases is one ``INSERT … ON CONFLICT DO UPDATE … WHERE`` (the conflicting row is locked
and its condition re-read at its newest version, so two engines never both take a shard). A
fenced commit's statement starts with a CTE that reads its shard's lease row ``FOR SHARE`` with
the fence's owner and epoch, and the CAS runs only if it found the row: a ``hold_shards`` that
moves the lease either committed before (the row no longer matches: nothing is written, and
:class:`~accord.errors.OwnershipLost` is raised) or waits until the commit is done.

Options and schema migrations: :mod:`._db` and :mod:`._schema`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Collection, Sequence
from typing import Any

from accord.adapters import _store_rules as rules
from accord.adapters.clock import SystemClock
from accord.adapters.stores.postgres._catalog import PostgresCatalog
from accord.adapters.stores.postgres._db import Database, PgTarget, PoolConnection, parse_url
from accord.engine.ports import Clock, Commit, OutboxEntry, ShardLease, StoredRun, Timer, shard_of
from accord.errors import ConflictError, OwnershipLost

__all__ = ["PostgresStore"]

# $1 run, $2 state, $3 expected version, $4 updated_at, $5-$7 status/workflow/tenant, $8 labels,
# $9 history, $10-$14 outbox columns, $15 cancels, $16-$19 timer columns, $20/$21 outbox/timer
# shards, $22-$24 the fence (shard, owner, epoch)
_WRITES = (
    " h AS (INSERT INTO accord_history (run_id, seq, entry)"
    " SELECT $1, r.history_len - cardinality($9::text[]) + e.ord - 1, e.entry"
    " FROM r, unnest($9::text[]) WITH ORDINALITY AS e(entry, ord)),"
    " o AS (INSERT INTO accord_outbox (entry_id, run_id, topic, payload, created_at, shard,"
    " avail_at) SELECT x.*, 0 FROM r, unnest($10::text[], $11::text[], $12::text[], $13::text[],"
    " $14::bigint[], $20::integer[]) AS x),"
    " c AS (DELETE FROM accord_timers WHERE timer_id = ANY($15::text[])"
    " AND EXISTS (SELECT FROM r)),"
    " t AS (INSERT INTO accord_timers (timer_id, run_id, due_at, payload, shard, avail_at)"
    " SELECT x.i, x.r, x.d, x.p, x.s, x.d FROM r, unnest($16::text[], $17::text[],"
    " $18::bigint[], $19::text[], $21::integer[]) AS x(i, r, d, p, s) ON CONFLICT (timer_id)"
    " DO UPDATE SET run_id = excluded.run_id, due_at = excluded.due_at,"
    " payload = excluded.payload, shard = excluded.shard, avail_at = excluded.due_at,"
    " owner = NULL)"
)
# the lease row is read FOR SHARE: a concurrent hold_shards moving it waits for this commit, or
# committed first and then the row (re-read at its newest version) no longer matches
_FENCE = (
    "f AS (SELECT FROM accord_leases WHERE shard = $22 AND owner = $23 AND epoch = $24 FOR SHARE),"
)
_CREATE_RUN = (
    " r AS (INSERT INTO accord_runs (run_id, version, state, history_len, status, workflow,"
    " tenant, updated_at, labels) SELECT $1, 1, $2, cardinality($9::text[]), $5, $6, $7, $4,"
    " $8::jsonb WHERE $3::bigint = 0{fenced} ON CONFLICT (run_id) DO NOTHING"
    " RETURNING history_len),"
)
_UPDATE_RUN = (
    " r AS (UPDATE accord_runs SET version = version + 1, state = $2,"
    " history_len = history_len + cardinality($9::text[]), updated_at = $4,"
    " status = coalesce($5, status), workflow = coalesce($6, workflow),"
    " tenant = coalesce($7, tenant), labels = labels || $8::jsonb"
    " WHERE run_id = $1 AND version = $3{fenced} RETURNING history_len),"
)


@functools.cache
def _commit_sql(create: bool, fenced: bool) -> str:
    """The commit statement: its first column is the run's history length (NULL: the CAS
    matched nothing); a fenced one's second says whether the lease matched."""
    run = (_CREATE_RUN if create else _UPDATE_RUN).format(
        fenced=" AND EXISTS (SELECT FROM f)" if fenced else ""
    )
    if not fenced:
        return "WITH" + run + _WRITES + " SELECT (SELECT history_len FROM r)"
    return (
        "WITH " + _FENCE + run + _WRITES
        + " SELECT (SELECT history_len FROM r), EXISTS (SELECT FROM f)"
    )  # fmt: skip


# a lease need not survive a crash of the server (the row is simply claimable again), so a
# claim's transaction does not wait for its WAL to reach the disk: set for that statement alone
_LEASE_ONLY = "(SELECT set_config('synchronous_commit', 'off', true)) AS lease_only"
_IN_SHARDS = " AND shard = ANY($5::integer[])"
_CLAIM_TIMERS = (
    "UPDATE accord_timers t SET owner = $1, avail_at = $2 FROM (SELECT timer_id FROM accord_timers"
    " WHERE avail_at <= $3{where} ORDER BY avail_at LIMIT $4 FOR UPDATE SKIP LOCKED) c, "
    + _LEASE_ONLY
    + " WHERE t.timer_id = c.timer_id RETURNING t.timer_id, t.run_id, t.due_at, t.payload"
)
_CLAIM_OUTBOX = (
    "UPDATE accord_outbox o SET owner = $1, avail_at = $2 FROM (SELECT id FROM accord_outbox"
    " WHERE avail_at <= $3{where} ORDER BY avail_at, id LIMIT $4 FOR UPDATE SKIP LOCKED) c, "
    + _LEASE_ONLY
    + " WHERE o.id = c.id RETURNING o.id, o.entry_id, o.run_id, o.topic, o.payload, o.created_at"
)
_PRUNE = (
    "WITH p AS (DELETE FROM accord_runs WHERE run_id IN (SELECT run_id FROM accord_runs"
    " WHERE updated_at < $1 AND status = ANY($2::text[]) ORDER BY updated_at LIMIT $3"
    " FOR UPDATE SKIP LOCKED) RETURNING run_id),"
    " h AS (DELETE FROM accord_history WHERE run_id IN (SELECT run_id FROM p)),"
    " t AS (DELETE FROM accord_timers WHERE run_id IN (SELECT run_id FROM p)),"
    " o AS (DELETE FROM accord_outbox WHERE run_id IN (SELECT run_id FROM p))"
    " SELECT count(*) FROM p"
)


_HOLD = (
    "INSERT INTO accord_leases AS l (shard, owner, epoch, expires_at)"
    " SELECT s, $1, 1, $3 FROM unnest($2::integer[]) AS s ORDER BY s"
    " ON CONFLICT (shard) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at,"
    " epoch = CASE WHEN l.owner = excluded.owner AND l.expires_at > $4 THEN l.epoch"
    " ELSE l.epoch + 1 END"
    " WHERE l.owner = excluded.owner OR l.expires_at <= $4 RETURNING shard, epoch"
)
_RELEASE = (
    "UPDATE accord_leases SET expires_at = $3 WHERE owner = $1 AND expires_at > $3"
    " AND shard = ANY($2::integer[])"
)
# the engine's own row is written by the CTE, which the outer query's snapshot cannot see
_BEAT = (
    "WITH b AS (INSERT INTO accord_engines VALUES ($1, $2) ON CONFLICT (engine)"
    " DO UPDATE SET expires_at = excluded.expires_at)"
    " SELECT engine FROM accord_engines WHERE expires_at > $3 AND engine <> $1"
)
_LEAVE = (
    "WITH d AS (DELETE FROM accord_engines WHERE engine = $1)"
    " UPDATE accord_leases SET expires_at = $2 WHERE owner = $1 AND expires_at > $2"
)


def commit_args(commit: Commit, now_ms: int, shard_count: int) -> tuple[str, tuple[Any, ...]]:
    """The statement and arguments of one commit (checked and encoded by the shared rules)."""
    enc = rules.encode_commit(commit, now_ms)
    status, workflow, tenant = enc.columns
    # one statement cannot touch a row twice: the last setting of a timer wins, and a timer
    # both cancelled and set is set (the SQLite store cancels first, then sets)
    timers = {t[0]: t for t in enc.timers}
    cancels = [t for t in dict.fromkeys(commit.timers_cancel) if t not in timers]
    box = list(zip(*enc.outbox, strict=True)) or [(), (), (), (), ()]
    tim = list(zip(*timers.values(), strict=True)) or [(), (), (), ()]
    args = (
        commit.run_id, enc.state, commit.expected_version, enc.updated_at, status, workflow,
        tenant, rules.dump(enc.labels, "index"), enc.history,
        *(list(col) for col in box), cancels, *(list(col) for col in tim),
        [shard_of(o[1], shard_count) for o in enc.outbox],
        [shard_of(t[1], shard_count) for t in timers.values()],
    )  # fmt: skip
    fence = commit.fence
    if fence is not None:
        args = (*args, fence.shard, fence.owner, fence.epoch)
    return _commit_sql(commit.expected_version == 0, fence is not None), args


async def commit_on(conn: PoolConnection, commit: Commit, now_ms: int, shard_count: int) -> int:
    """Run one commit on ``conn`` (inside the caller's transaction, if any); the new version.
    ``shard_count``: the store's (each outbox and timer row is stamped with its run's shard)."""
    sql, args = commit_args(commit, now_ms, shard_count)
    row = await conn.fetchrow(sql, *args)
    fence = commit.fence
    if fence is not None and row is not None and not row[1]:
        raise OwnershipLost(fence.shard, fence.owner, fence.epoch)
    if row is None or row[0] is None:
        if commit.expected_version == 0:
            raise ConflictError(f"run {commit.run_id!r} already exists (expected to create it)")
        raise ConflictError(f"run {commit.run_id!r} is not at version {commit.expected_version}")
    return commit.expected_version + 1


class PostgresStore(PostgresCatalog):
    """:class:`~accord.engine.ports.Store` on PostgreSQL (see the module docstring)."""

    def __init__(self, target: PgTarget, clock: Clock | None = None) -> None:
        self.target = target
        self._shard_count = rules.shard_count_option(target.options, 8)
        self.db = Database(target, "store", shards=self._shard_count)
        self.clock: Clock = clock or SystemClock()

    @classmethod
    def from_url(cls, url: str, clock: Clock | None = None) -> PostgresStore:
        return cls(parse_url(url), clock)

    async def load(self, run_id: str) -> StoredRun | None:
        async with self.db.connection("load") as conn:
            row = await conn.fetchrow(
                "SELECT version, state FROM accord_runs WHERE run_id = $1", run_id
            )
        return None if row is None else StoredRun(run_id, row[0], json.loads(row[1]))

    async def commit(self, commit: Commit) -> int:
        now = self.clock.now_ms()
        async with self.db.connection("commit") as conn:
            return await commit_on(conn, commit, now, self._shard_count)

    async def history(self, run_id: str) -> list[dict[str, Any]]:
        async with self.db.connection("history") as conn:
            rows = await conn.fetch(
                "SELECT entry FROM accord_history WHERE run_id = $1 ORDER BY seq", run_id
            )
        return [json.loads(r[0]) for r in rows]

    def _shard_filter(
        self, shards: Collection[int] | None
    ) -> tuple[str, tuple[list[int], ...]] | None:
        """A claim's extra condition and its argument: none for every shard, ``None`` for no
        shard at all (nothing to claim)."""
        if shards is None:
            return "", ()
        wanted = rules.check_shards(list(shards), self._shard_count)
        return (_IN_SHARDS, (wanted,)) if wanted else None

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
        sql = _CLAIM_TIMERS.format(where=only[0])
        async with self.db.connection("claim_timers") as conn:
            rows = await conn.fetch(sql, owner, now_ms + lease_ms, now_ms, limit, *only[1])
        timers = [Timer(r[0], r[1], r[2], json.loads(r[3])) for r in rows]
        return sorted(timers, key=lambda t: (t.due_at_ms, t.timer_id))

    async def claim_outbox(
        self, limit: int, owner: str, lease_ms: int, shards: Collection[int] | None = None
    ) -> list[OutboxEntry]:
        only = self._shard_filter(shards)
        if only is None:
            return []
        sql = _CLAIM_OUTBOX.format(where=only[0])
        now = self.clock.now_ms()
        async with self.db.connection("claim_outbox") as conn:
            rows = await conn.fetch(sql, owner, now + lease_ms, now, limit, *only[1])
        rows.sort(key=lambda r: int(r[0]))  # commit order
        return [OutboxEntry(r[1], r[2], r[3], json.loads(r[4]), r[5]) for r in rows]

    async def outbox_done(self, entry_ids: Sequence[str]) -> None:
        if entry_ids:
            async with self.db.connection("outbox_done") as conn:
                await conn.execute(
                    "DELETE FROM accord_outbox WHERE entry_id = ANY($1::text[])", list(entry_ids)
                )

    async def prune(self, ended_before_ms: int, limit: int) -> int:
        """Remove up to ``limit`` ended runs last committed before ``ended_before_ms`` (see
        :meth:`~accord.engine.ports.Store.prune`): one statement per step of at most
        :data:`~accord.adapters._store_rules.PRUNE_STEP` runs, found through the ``updated_at``
        index, with their history, timers and outbox rows."""
        removed = 0
        while removed < limit:
            count = min(rules.PRUNE_STEP, limit - removed)
            async with self.db.connection("prune") as conn:
                done = int(await conn.fetchval(_PRUNE, ended_before_ms, list(rules.ENDED), count))
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
        async with self.db.connection("beat") as conn:
            rows = await conn.fetch(_BEAT, engine, now + ttl_ms, now)
        return sorted([r[0] for r in rows] + ([engine] if ttl_ms > 0 else []))

    async def leave(self, engine: str) -> None:
        async with self.db.connection("leave") as conn:
            await conn.execute(_LEAVE, engine, self.clock.now_ms())

    async def hold_shards(self, engine: str, shards: Sequence[int], ttl_ms: int) -> dict[int, int]:
        wanted = rules.check_shards(shards, self._shard_count)
        if not wanted:
            return {}
        now = self.clock.now_ms()
        async with self.db.connection("hold_shards") as conn:
            rows = await conn.fetch(_HOLD, engine, wanted, now + ttl_ms, now)
        return dict(sorted((int(r[0]), int(r[1])) for r in rows))

    async def release_shards(self, engine: str, shards: Sequence[int]) -> None:
        if shards:
            async with self.db.connection("release_shards") as conn:
                await conn.execute(_RELEASE, engine, list(shards), self.clock.now_ms())

    async def shard_leases(self) -> list[ShardLease]:
        async with self.db.connection("shard_leases") as conn:
            rows = await conn.fetch(
                "SELECT shard, owner, epoch, expires_at FROM accord_leases ORDER BY shard"
            )
        return [ShardLease(int(r[0]), r[1], int(r[2]), int(r[3])) for r in rows]

    async def close(self) -> None:
        await self.db.close()
