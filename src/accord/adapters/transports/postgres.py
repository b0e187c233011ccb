"""The PostgreSQL queue: a durable message table in a database schema, usually the store's own.

The same table and semantics as the embedded SQLite queue (:mod:`.embedded`), in
``accord_jobs``: one row per message keyed by ``(queue, message_id)``, so a republish is an
``INSERT … ON CONFLICT``; ``state`` 0 (ready or leased), 1 (acked, kept for the dedup window with
its body dropped) or 2 (dead-lettered, with ``reason``); a lease is ``avail_at = now +
visibility_ms``, so a lapsed lease is ready again without a sweeper. Every claim, ack and nack is
one statement: a claim takes the oldest ready rows ``FOR UPDATE SKIP LOCKED`` (any number of
processes consume one queue, and exactly one leases a given delivery) and dead-letters, in the
same statement, a row whose lapsed lease would pass the queue's delivery limit. Times come from
the transport's clock. Delivery semantics are in :mod:`accord.adapters.transports._base`.

Wake-ups: every publish and nack that makes a message ready notifies the schema's channel
(``pg_notify`` in the same statement, so only once it commits); each transport that consumes
listens on one connection of its own and wakes its streams at once, in any process. Polling
(adaptive, up to ``poll_ms``) stays as the fallback when a notification is lost with its
connection. While the server is away a claim comes back empty after a pause instead of ending
the stream, so consumers ride out a restart or failover (one warning per outage).

Joint commit: when the store is a :class:`~accord.adapters.stores.postgres.PostgresStore` on the
same database and schema, :meth:`PostgresTransport.joint_commit` commits the transition, the jobs
it dispatches, the cancelled job it withdraws and the acknowledgement of the delivery that
carried its event in one transaction (:mod:`accord.engine.runtime.joint`), always with the
server's ``synchronous_commit``: unlike SQLite's, a commit PostgreSQL acknowledged and then lost
in a crash would free its run version for a commit built on the lost state.

URL: the store's (``postgresql://user@host:5432/db?schema=…``, see
:mod:`accord.adapters.stores.postgres._db`) with the queue options ``visibility_ms`` (30000),
``max_deliveries`` (5), ``dedup_ms`` (600000) and ``poll_ms`` (50).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg

from accord.adapters.stores.postgres import PostgresStore, commit_on
from accord.adapters.stores.postgres._db import Database, PgTarget, parse_url
from accord.adapters.transports._base import QueueOptions, QueueTransport
from accord.engine.ports import (
    Clock,
    Commit,
    Delivery,
    JointCommit,
    QueuedMessage,
    Store,
    Waiting,
)
from accord.engine.runtime.outbox import cancelled_job
from accord.errors import TransportError

__all__ = ["PostgresTransport"]

# a known message is left alone; an acked one past its dedup window starts afresh
_PUBLISH = (
    "WITH p AS (INSERT INTO accord_jobs (queue, message_id, body, state, avail_at, deliveries,"
    " published_at) SELECT q, m, b, 0, a, 0, $5 FROM unnest($1::text[], $2::text[], $3::bytea[],"
    " $4::bigint[]) AS x(q, m, b, a) ON CONFLICT (queue, message_id) DO UPDATE SET"
    " body = excluded.body, state = 0, avail_at = excluded.avail_at, deliveries = 0,"
    " published_at = excluded.published_at, settled_at = NULL, reason = NULL, receipt = NULL"
    " WHERE accord_jobs.state = 1 AND accord_jobs.settled_at < $6 RETURNING queue)"
    " SELECT pg_notify($7, q) FROM (SELECT DISTINCT queue AS q FROM p) d"
)
# a lease need not survive a crash of the server (the message is simply offered again), so a
# claim's transaction does not wait for its WAL to reach the disk: set for that statement alone
LEASE_ONLY = "(SELECT set_config('synchronous_commit', 'off', true)) AS lease_only"
# $1 queue, $2 now, $3 n, $4 lease end, $5 receipt token, $6 delivery limit
_CLAIM = (
    "WITH c AS (SELECT id FROM accord_jobs WHERE queue = $1 AND state = 0 AND avail_at <= $2"
    " ORDER BY avail_at, id LIMIT $3 FOR UPDATE SKIP LOCKED)"
    " UPDATE accord_jobs j SET deliveries = least(j.deliveries + 1, $6::int), avail_at = $4,"
    " state = CASE WHEN j.deliveries + 1 > $6::int THEN 2 ELSE 0 END,"
    " receipt = CASE WHEN j.deliveries + 1 > $6::int THEN NULL ELSE $5::text || '.' || j.id END,"
    " settled_at = CASE WHEN j.deliveries + 1 > $6::int THEN $2::bigint END,"
    " reason = CASE WHEN j.deliveries + 1 > $6::int"
    " THEN 'lease lapsed on delivery ' || $6::int || ' of ' || $6::int END"
    " FROM c, " + LEASE_ONLY + " WHERE j.id = c.id"
    " RETURNING j.id, j.message_id, j.body, j.deliveries, j.receipt, j.state"
)
_SETTLED = " WHERE queue = $1 AND message_id = $2 AND receipt = $3 AND state = 0"
_ACK_KEEP = (
    "UPDATE accord_jobs SET state = 1, settled_at = $4, body = '', receipt = NULL" + _SETTLED
)
_ACK_DROP = "DELETE FROM accord_jobs" + _SETTLED
_ACKS_KEEP = (
    "UPDATE accord_jobs j SET state = 1, settled_at = $4, body = '', receipt = NULL FROM"
    " unnest($1::text[], $2::text[], $3::text[]) AS x(q, m, r) WHERE j.queue = x.q"
    " AND j.message_id = x.m AND j.receipt = x.r AND j.state = 0"
)
_ACKS_DROP = (
    "DELETE FROM accord_jobs j USING unnest($1::text[], $2::text[], $3::text[]) AS x(q, m, r)"
    " WHERE j.queue = x.q AND j.message_id = x.m AND j.receipt = x.r AND j.state = 0"
)
# $4 limit, $5 now, $6 avail_at, $7 channel
_NACK = (
    "WITH n AS (UPDATE accord_jobs SET state = CASE WHEN deliveries >= $4::int THEN 2 ELSE 0 END,"
    " settled_at = CASE WHEN deliveries >= $4::int THEN $5::bigint END,"
    " reason = CASE WHEN deliveries >= $4::int"
    " THEN 'nacked on delivery ' || deliveries || ' of ' || $4::int"
    " END, deliveries = least(deliveries, $4::int), avail_at = $6::bigint, receipt = NULL"
    + _SETTLED
    + " RETURNING state) SELECT pg_notify($7, $1) FROM n WHERE state = 0"
)
_WITHDRAW_WHERE = (
    " WHERE queue = $1 AND message_id = $2 AND state = 0 AND (receipt IS NULL OR avail_at <= $3)"
)
PURGE_EVERY_MS = 1000
CLAIM_PAUSE_S = 0.2  # between claims while the server is unavailable
log = logging.getLogger("accord.adapters.postgres")


class PostgresTransport(QueueTransport):
    """:class:`~accord.engine.ports.Transport` on a PostgreSQL table (see the module docstring)."""

    def __init__(
        self, target: PgTarget, clock: Clock | None = None, options: QueueOptions | None = None
    ) -> None:
        super().__init__(clock, options or QueueOptions(), target.key)
        self.target = target
        self.db = Database(target, "transport")
        self._purged_at = 0
        self._listener: asyncpg.Connection | None = None
        self._listening: asyncio.Task[None] | None = None
        self._outage_since: int | None = None

    @classmethod
    def from_url(
        cls, url: str, clock: Clock | None = None, delivery_limits: Mapping[str, int] | None = None
    ) -> PostgresTransport:
        target = parse_url(url)
        queue_opts = [(k, v) for k, v in target.options.items() if k in _QUEUE_OPTS]
        return cls(target, clock, QueueOptions.from_query(queue_opts, delivery_limits))

    # ---- wake-ups across processes ----

    def _listen(self) -> None:
        if self._listening is None and not self._closed:
            self._listening = asyncio.ensure_future(self._start_listener())

    async def _start_listener(self) -> None:
        with contextlib.suppress(Exception):  # polling covers a listener that cannot start
            conn = await asyncpg.connect(self.target.dsn, timeout=self.target.connect_timeout_s)
            if self._closed:
                await conn.close()
                return
            await conn.add_listener(self.target.channel, self._notified)
            self._listener = conn

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        self._wake(str(payload))

    # ---- the four steps of QueueTransport ----

    def _publish_args(
        self, items: Sequence[tuple[str, str, bytes, int]], now: int
    ) -> tuple[Any, ...]:
        unique = list({(q, m): (q, m, b, a) for q, m, b, a in reversed(items)}.values())[::-1]
        cols = list(zip(*unique, strict=True)) or [(), (), (), ()]
        return (*(list(c) for c in cols), now, now - self.options.dedup_ms, self.target.channel)

    async def _publish(self, queue: str, message_id: str, body: bytes, avail_at: int) -> None:
        args = self._publish_args([(queue, message_id, body, avail_at)], self.clock.now_ms())
        async with self.db.connection("publish") as conn:
            await conn.execute(_PUBLISH, *args)

    async def _claim(self, queue: str, n: int, now: int) -> list[Delivery]:
        """Lease up to ``n`` ready messages. While the server is away (a retryable error) the
        claim comes back empty after a pause, so a stream rides out an outage instead of
        ending; one warning per outage, one line when it is over."""
        try:
            got = await self._claim_rows(queue, n, now)
        except TransportError as exc:
            if not exc.retryable or self._closed:
                raise
            if self._outage_since is None:
                self._outage_since = now
                log.warning("queue %r: claims held, the server is unavailable: %s", queue, exc)
            await asyncio.sleep(CLAIM_PAUSE_S)
            return []
        if self._outage_since is not None:
            log.warning("queue %r: claims resumed after %d ms", queue, now - self._outage_since)
            self._outage_since = None
        return got

    async def _claim_rows(self, queue: str, n: int, now: int) -> list[Delivery]:
        self._listen()
        limit = self.options.limit(queue)
        until = now + self.options.visibility_ms
        purge_before = None
        if now - self._purged_at >= PURGE_EVERY_MS:
            self._purged_at, purge_before = now, now - self.options.dedup_ms
        async with self.db.connection("claim") as conn:
            if purge_before is not None:
                await conn.execute(
                    "DELETE FROM accord_jobs WHERE state = 1 AND settled_at < $1", purge_before
                )
            while True:
                token = secrets.token_hex(8)
                rows = await conn.fetch(_CLAIM, queue, now, n, until, token, limit)
                live = [
                    Delivery(queue, r[1], bytes(r[2]), r[3], r[4])
                    for r in sorted(rows, key=lambda r: int(r[0]))
                    if r[5] == 0
                ]
                if live or not rows:
                    return live

    def _ack_sql(self, now: int) -> tuple[str, tuple[Any, ...]]:
        return (_ACK_KEEP, (now,)) if self.options.dedup_ms else (_ACK_DROP, ())

    async def _ack(self, delivery: Delivery, now: int) -> None:
        sql, extra = self._ack_sql(now)
        async with self.db.connection("ack") as conn:
            await conn.execute(sql, delivery.queue, delivery.message_id, delivery.receipt, *extra)

    async def _nack(self, delivery: Delivery, now: int, delay_ms: int) -> None:
        limit = self.options.limit(delivery.queue)
        async with self.db.connection("nack") as conn:
            await conn.execute(
                _NACK, delivery.queue, delivery.message_id, delivery.receipt, limit, now,
                now + delay_ms, self.target.channel,
            )  # fmt: skip

    async def _unclaim(self, deliveries: list[Delivery]) -> None:
        sql = (
            "UPDATE accord_jobs SET avail_at = 0, receipt = NULL, deliveries = deliveries - 1"
            + _SETTLED
        )
        async with self.db.connection("unclaim") as conn:
            await conn.executemany(sql, [(d.queue, d.message_id, d.receipt) for d in deliveries])

    async def publish_and_ack(
        self, queue: str, message_id: str, body: bytes, delivery: Delivery
    ) -> None:
        """Publish an answer and settle the delivery it answers in one transaction."""
        self._check_publish(queue, message_id)
        now = self.clock.now_ms()
        sql, extra = self._ack_sql(now)
        async with self.db.connection("publish_and_ack") as conn, conn.transaction():
            await conn.execute(_PUBLISH, *self._publish_args([(queue, message_id, body, now)], now))
            await conn.execute(sql, delivery.queue, delivery.message_id, delivery.receipt, *extra)
        self._release(delivery)
        self._wake(queue)

    async def dead_letter_details(self, queue: str) -> list[dict[str, Any]]:
        """Dead letters of ``queue`` with their metadata, oldest first: ``message_id``,
        ``body``, ``delivery_count``, ``reason``, ``published_at_ms``, ``dead_at_ms``."""
        async with self.db.connection("dead_letters") as conn:
            rows = await conn.fetch(
                "SELECT message_id, body, deliveries, reason, published_at, settled_at"
                " FROM accord_jobs WHERE queue = $1 AND state = 2 ORDER BY settled_at, id",
                queue,
            )
        names = ("message_id", "body", "delivery_count", "reason", "published_at_ms", "dead_at_ms")
        return [dict(zip(names, (r[0], bytes(r[1]), *r[2:]), strict=True)) for r in rows]

    # ---- operating on what was refused (QueueAdmin, Withdraw) ----

    async def queue_names(self) -> list[str]:
        """Queues with a message waiting or a dead letter."""
        async with self.db.connection("queue_names") as conn:
            rows = await conn.fetch(
                "SELECT DISTINCT queue FROM accord_jobs WHERE state IN (0, 2) ORDER BY queue"
            )
        return [r[0] for r in rows]

    async def waiting(self, queue: str, limit: int = 1000) -> list[Waiting]:
        """Messages waiting (or leased) on ``queue``, oldest first, read in place."""
        async with self.db.connection("waiting") as conn:
            rows = await conn.fetch(
                "SELECT message_id, body, deliveries, published_at FROM accord_jobs"
                " WHERE queue = $1 AND state = 0 ORDER BY published_at, id LIMIT $2",
                queue, max(limit, 0),
            )  # fmt: skip
        return [Waiting(queue, r[0], bytes(r[1]), r[2], r[3]) for r in rows]

    async def remove(self, queue: str, message_ids: Sequence[str]) -> list[str]:
        """Delete waiting messages by id (the id is then unknown: a republish is new)."""
        ids = list(dict.fromkeys(message_ids))
        async with self.db.connection("remove") as conn:
            rows = await conn.fetch(
                "DELETE FROM accord_jobs WHERE queue = $1 AND state = 0"
                " AND message_id = ANY($2::text[]) RETURNING message_id",
                queue, ids,
            )  # fmt: skip
        done = {r[0] for r in rows}
        return [m for m in ids if m in done]

    def _withdraw_sql(self, now: int) -> tuple[str, tuple[Any, ...]]:
        if self.options.dedup_ms:
            sql = "UPDATE accord_jobs SET state = 1, settled_at = $3, body = '', receipt = NULL"
            return sql + _WITHDRAW_WHERE, (now,)
        return "DELETE FROM accord_jobs" + _WITHDRAW_WHERE, (now,)

    async def withdraw(self, queue: str, message_id: str) -> bool:
        """Settle a message nobody holds as if acknowledged, unread (:class:`Withdraw`): one
        that is ready or delayed, or whose lease lapsed (kept for the dedup window, so a late
        republish is dropped too); a leased, settled or unknown one is left alone."""
        sql, args = self._withdraw_sql(self.clock.now_ms())
        async with self.db.connection("withdraw") as conn:
            status = await conn.execute(sql, queue, message_id, *args)
        return not status.endswith(" 0")

    async def redrive_dead(self, queue: str, message_ids: Sequence[str]) -> list[str]:
        """Dead letters back to ready in place, one statement: never lost, counted afresh."""
        ids = list(dict.fromkeys(message_ids))
        async with self.db.connection("redrive") as conn:
            rows = await conn.fetch(
                "UPDATE accord_jobs SET state = 0, deliveries = 0, avail_at = $1, receipt = NULL,"
                " settled_at = NULL, reason = NULL WHERE queue = $2 AND state = 2"
                " AND message_id = ANY($3::text[]) RETURNING message_id",
                self.clock.now_ms(), queue, ids,
            )  # fmt: skip
        self._wake(queue)
        done = {r[0] for r in rows}
        return [m for m in ids if m in done]

    # ---- the joint commit ----

    def joint_commit(self, store: Store) -> JointCommit | None:
        """The joint commit with ``store`` when it is a PostgreSQL store on this same schema."""
        if isinstance(store, PostgresStore) and store.target.key == self.target.key:
            return _PostgresJoint(self, store)
        return None

    async def close(self) -> None:
        await super().close()
        listening, self._listening = self._listening, None
        if listening is not None:  # let a connect under way finish: it sees the close itself
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(listening), 10)
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(listener.close(), 5)
        await self.db.close()


_QUEUE_OPTS = frozenset({"visibility_ms", "max_deliveries", "dedup_ms", "poll_ms"})


class _PostgresJoint:
    """The store's commit with this queue's writes in the same transaction."""

    def __init__(self, queue: PostgresTransport, store: PostgresStore) -> None:
        self.queue, self.store = queue, store

    async def commit(
        self,
        commit: Commit,
        messages: Sequence[QueuedMessage],
        acked: Sequence[Delivery],
        *,
        durable: bool,
    ) -> int:
        q = self.queue
        now = self.store.clock.now_ms()
        # always synchronous, whatever ``durable`` says: a commit the server loses on a crash
        # frees its version number, and a commit built on the lost state could then pass the
        # compare-and-set with that same number (history and record would part ways)
        del durable
        async with self.store.db.connection("commit") as conn, conn.transaction():
            version = await commit_on(conn, commit, now, self.store.shard_count)
            if acked:
                sql = _ACKS_KEEP if q.options.dedup_ms else _ACKS_DROP
                cols = [[d.queue for d in acked], [d.message_id for d in acked],
                        [d.receipt for d in acked]]  # fmt: skip
                await conn.execute(sql, *cols, *((now,) if q.options.dedup_ms else ()))
            if messages:
                items = [(m.queue, m.message_id, m.body, now) for m in messages]
                await conn.execute(_PUBLISH, *q._publish_args(items, now))
                # a cancel's fenced job, still waiting, is withdrawn by the same transaction
                sql, extra = q._withdraw_sql(now)
                for job in (cancelled_job(m.queue, m.message_id) for m in messages):
                    if job is not None:
                        await conn.execute(sql, *job, *extra)
        for delivery in acked:
            q._release(delivery)
        for name in dict.fromkeys(m.queue for m in messages):
            q._wake(name)
        return version
