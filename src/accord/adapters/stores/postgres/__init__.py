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

Options and schema migrations: :mod:`._db` and :mod:`._schema`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from accord.adapters import _store_rules as rules
from accord.adapters.clock import SystemClock
from accord.adapters.stores.postgres._catalog import PostgresCatalog
from accord.adapters.stores.postgres._db import Database, PgTarget, PoolConnection, parse_url
from accord.engine.ports import Clock, Commit, OutboxEntry, StoredRun, Timer
from accord.errors import ConflictError

__all__ = ["PostgresStore"]

_HISTORY = (
    " h AS (INSERT INTO accord_history (run_id, seq, entry)"
    " SELECT $1, r.history_len - cardinality($9::text[]) + e.ord - 1, e.entry"
    " FROM r, unnest($9::text[]) WITH ORDINALITY AS e(entry, ord)),"
    " o AS (INSERT INTO accord_outbox (entry_id, run_id, topic, payload, created_at, avail_at)"
    " SELECT x.*, 0 FROM r, unnest($10::text[], $11::text[], $12::text[], $13::text[],"
    " $14::bigint[]) AS x),"
    " c AS (DELETE FROM accord_timers WHERE timer_id = ANY($15::text[])"
    " AND EXISTS (SELECT FROM r)),"
    " t AS (INSERT INTO accord_timers (timer_id, run_id, due_at, payload, avail_at)"
    " SELECT x.i, x.r, x.d, x.p, x.d FROM r, unnest($16::text[], $17::text[], $18::bigint[],"
    " $19::text[]) AS x(i, r, d, p) ON CONFLICT (timer_id) DO UPDATE SET run_id = excluded.run_id,"
    " due_at = excluded.due_at, payload = excluded.payload, avail_at = excluded.due_at,"
    " owner = NULL)"
    " SELECT history_len FROM r"
)
# $1 run, $2 state, $3 expected version, $4 updated_at, $5-$7 status/workflow/tenant, $8 labels
_CREATE = (
    "WITH r AS (INSERT INTO accord_runs (run_id, version, state, history_len, status, workflow,"
    " tenant, updated_at, labels) SELECT $1, 1, $2, cardinality($9::text[]), $5, $6, $7, $4,"
    " $8::jsonb WHERE $3::bigint = 0 ON CONFLICT (run_id) DO NOTHING RETURNING history_len),"
    + _HISTORY
)
_UPDATE = (
    "WITH r AS (UPDATE accord_runs SET version = version + 1, state = $2,"
    " history_len = history_len + cardinality($9::text[]), updated_at = $4,"
    " status = coalesce($5, status), workflow = coalesce($6, workflow),"
    " tenant = coalesce($7, tenant), labels = labels || $8::jsonb"
    " WHERE run_id = $1 AND version = $3 RETURNING history_len)," + _HISTORY
)

# a lease need not survive a crash of the server (the row is simply claimable again), so a
# claim's transaction does not wait for its WAL to reach the disk: set for that statement alone
_LEASE_ONLY = "(SELECT set_config('synchronous_commit', 'off', true)) AS lease_only"
_CLAIM_TIMERS = (
    "UPDATE accord_timers t SET owner = $1, avail_at = $2 FROM (SELECT timer_id FROM accord_timers"
    " WHERE avail_at <= $3 ORDER BY avail_at LIMIT $4 FOR UPDATE SKIP LOCKED) c, "
    + _LEASE_ONLY
    + " WHERE t.timer_id = c.timer_id RETURNING t.timer_id, t.run_id, t.due_at, t.payload"
)
_CLAIM_OUTBOX = (
    "UPDATE accord_outbox o SET owner = $1, avail_at = $2 FROM (SELECT id FROM accord_outbox"
    " WHERE avail_at <= $3 ORDER BY avail_at, id LIMIT $4 FOR UPDATE SKIP LOCKED) c, "
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


def commit_args(commit: Commit, now_ms: int) -> tuple[str, tuple[Any, ...]]:
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
    )  # fmt: skip
    return (_CREATE if commit.expected_version == 0 else _UPDATE), args


async def commit_on(conn: PoolConnection, commit: Commit, now_ms: int) -> int:
    """Run one commit on ``conn`` (inside the caller's transaction, if any); the new version."""
    sql, args = commit_args(commit, now_ms)
    row = await conn.fetchrow(sql, *args)
    if row is None:
        if commit.expected_version == 0:
            raise ConflictError(f"run {commit.run_id!r} already exists (expected to create it)")
        raise ConflictError(f"run {commit.run_id!r} is not at version {commit.expected_version}")
    return commit.expected_version + 1


class PostgresStore(PostgresCatalog):
    """:class:`~accord.engine.ports.Store` on PostgreSQL (see the module docstring)."""

    def __init__(self, target: PgTarget, clock: Clock | None = None) -> None:
        self.target = target
        self.db = Database(target, "store")
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
            return await commit_on(conn, commit, now)

    async def history(self, run_id: str) -> list[dict[str, Any]]:
        async with self.db.connection("history") as conn:
            rows = await conn.fetch(
                "SELECT entry FROM accord_history WHERE run_id = $1 ORDER BY seq", run_id
            )
        return [json.loads(r[0]) for r in rows]

    async def claim_timers(self, now_ms: int, limit: int, owner: str, lease_ms: int) -> list[Timer]:
        async with self.db.connection("claim_timers") as conn:
            rows = await conn.fetch(_CLAIM_TIMERS, owner, now_ms + lease_ms, now_ms, limit)
        timers = [Timer(r[0], r[1], r[2], json.loads(r[3])) for r in rows]
        return sorted(timers, key=lambda t: (t.due_at_ms, t.timer_id))

    async def claim_outbox(self, limit: int, owner: str, lease_ms: int) -> list[OutboxEntry]:
        now = self.clock.now_ms()
        async with self.db.connection("claim_outbox") as conn:
            rows = await conn.fetch(_CLAIM_OUTBOX, owner, now + lease_ms, now, limit)
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

    async def close(self) -> None:
        await self.db.close()
