"""The embedded queue: a durable message table in a SQLite file, usually the store's own file.

One row per message in ``accord_queue``, keyed by ``(queue, message_id)`` so a republish is an
``INSERT … ON CONFLICT DO NOTHING``. ``state`` is 0 (ready or leased), 1 (acked; kept for the
dedup window with its body dropped) or 2 (dead-lettered, with ``reason``). As in the store, a
lease is just ``avail_at``: claiming sets it to ``now + visibility_ms``, so a lapsed lease is ready
again without a sweeper, and a partial index on ready rows serves every claim. Each claim, ack and
nack is one ``BEGIN IMMEDIATE`` transaction, so any number of processes may consume one queue:
exactly one of them leases a given delivery. Delivery semantics are in
:mod:`accord.adapters.transports._base`.

URL options (``sqlite:///path.db?…`` or ``embedded+sqlite:///path.db?…``): ``visibility_ms``
(30000), ``max_deliveries`` (5), ``dedup_ms`` (600000), ``poll_ms`` (50), plus the database
options ``synchronous`` and ``busy_timeout_ms``.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from accord.adapters import _store_rules
from accord.adapters._sqlite import Database, parse_sqlite_url
from accord.adapters.stores.sqlite import SqliteStore
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

__all__ = ["SCHEMA", "EmbeddedTransport"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS accord_queue (
  queue TEXT NOT NULL, message_id TEXT NOT NULL, body BLOB NOT NULL, state INTEGER NOT NULL,
  avail_at INTEGER NOT NULL, deliveries INTEGER NOT NULL, receipt TEXT,
  published_at INTEGER NOT NULL, settled_at INTEGER, reason TEXT,
  UNIQUE (queue, message_id));
CREATE INDEX IF NOT EXISTS accord_queue_ready ON accord_queue (queue, avail_at) WHERE state = 0;
CREATE INDEX IF NOT EXISTS accord_queue_acked ON accord_queue (settled_at) WHERE state = 1
"""

# a known message is left alone; an acked one past its dedup window starts afresh
_PUBLISH = (
    "INSERT INTO accord_queue (queue, message_id, body, state, avail_at, deliveries, published_at)"
    " VALUES (?, ?, ?, 0, ?, 0, ?) ON CONFLICT (queue, message_id) DO UPDATE SET"
    " body = excluded.body, state = 0, avail_at = excluded.avail_at, deliveries = 0,"
    " published_at = excluded.published_at, settled_at = NULL"
    " WHERE state = 1 AND settled_at < ?"
)
_CLAIM = (
    "UPDATE accord_queue SET deliveries = deliveries + 1, avail_at = ?,"
    " receipt = ? || '.' || rowid WHERE rowid IN ("
    " SELECT rowid FROM accord_queue WHERE queue = ? AND state = 0 AND avail_at <= ?"
    " ORDER BY avail_at, rowid LIMIT ?) RETURNING rowid, message_id, body, deliveries, receipt"
)
_DEAD = (
    "UPDATE accord_queue SET state = 2, settled_at = ?, reason = ?, receipt = NULL,"
    " deliveries = min(deliveries, ?) WHERE rowid = ?"
)
_SETTLED = "WHERE queue = ? AND message_id = ? AND receipt = ? AND state = 0"
PURGE_EVERY_MS = 1000


class EmbeddedTransport(QueueTransport):
    """:class:`~accord.engine.ports.Transport` over a SQLite table (see the module docstring)."""

    def __init__(
        self,
        db: Database,
        clock: Clock | None = None,
        options: QueueOptions | None = None,
        *,
        owns_db: bool = True,
    ) -> None:
        memory = db.path == ":memory:"
        key = f"sqlite-memory:{id(db)}" if memory else f"sqlite:{os.path.realpath(db.path)}"
        super().__init__(clock, options or QueueOptions(), key)
        self.db = db
        self._owns_db = owns_db
        self._purged_at = 0
        db.ensure_schema(SCHEMA)

    @classmethod
    def from_url(
        cls, url: str, clock: Clock | None = None, delivery_limits: Mapping[str, int] | None = None
    ) -> EmbeddedTransport:
        """Open on the file of a ``sqlite:///`` URL, with the queue options of its query."""
        # ``shards`` is the store's (one URL opens both): accepted, and no concern of the queue
        path, opts = parse_sqlite_url(
            url, {"synchronous", "busy_timeout_ms", "shards", *_store_rules.SHARED_OPTS}
        )
        db = Database(
            path,
            synchronous=opts.get("synchronous", "FULL"),
            busy_timeout_ms=_store_rules.int_option(opts, "busy_timeout_ms", 5000),
        )
        return cls(db, clock, QueueOptions.from_query(opts.items(), delivery_limits))

    async def _publish(self, queue: str, message_id: str, body: bytes, avail_at: int) -> None:
        await self.db.write(
            self.publish_rider(queue, message_id, body, avail_at), "publish", "transport"
        )

    # ---- riders: queue writes run inside another write transaction on the same database ----

    def joint_commit(self, store: Store) -> JointCommit | None:
        """The joint commit with ``store`` when it commits on this queue's own connection (see
        :mod:`accord.engine.runtime.joint`)."""
        if isinstance(store, SqliteStore) and store.db is self.db:
            return _EmbeddedJoint(self, store)
        return None

    def publish_rider(
        self, queue: str, message_id: str, body: bytes, avail_at: int | None = None
    ) -> Callable[[sqlite3.Connection], object]:
        now = self.clock.now_ms()
        at = now if avail_at is None else avail_at
        args = (queue, message_id, body, at, now, now - self.options.dedup_ms)
        return lambda c: c.execute(_PUBLISH, args)

    def ack_rider(
        self, delivery: Delivery, now: int | None = None
    ) -> Callable[[sqlite3.Connection], object]:
        now = self.clock.now_ms() if now is None else now
        if self.options.dedup_ms:
            sql = "UPDATE accord_queue SET state = 1, settled_at = ?, body = X'', receipt = NULL "
            args: tuple[Any, ...] = (now, delivery.queue, delivery.message_id, delivery.receipt)
        else:
            sql = "DELETE FROM accord_queue "
            args = (delivery.queue, delivery.message_id, delivery.receipt)
        return lambda c: c.execute(sql + _SETTLED, args)

    def riders_committed(self, queues: Iterable[str], acked: Iterable[Delivery]) -> None:
        for delivery in acked:
            self._release(delivery)
        for queue in dict.fromkeys(queues):
            self._wake(queue)

    async def publish_and_ack(
        self, queue: str, message_id: str, body: bytes, delivery: Delivery
    ) -> None:
        """Publish an answer and settle the delivery it answers in one transaction."""
        self._check_publish(queue, message_id)
        publish, ack = self.publish_rider(queue, message_id, bytes(body)), self.ack_rider(delivery)
        await self.db.write(lambda c: (publish(c), ack(c)), "publish_and_ack", "transport")
        self.riders_committed((queue,), (delivery,))

    async def _claim(self, queue: str, n: int, now: int) -> list[Delivery]:
        limit = self.options.limit(queue)
        until = now + self.options.visibility_ms
        purge_before = None
        if now - self._purged_at >= PURGE_EVERY_MS:
            self._purged_at, purge_before = now, now - self.options.dedup_ms

        def claim(conn: sqlite3.Connection) -> list[Delivery]:
            if purge_before is not None:
                conn.execute(
                    "DELETE FROM accord_queue WHERE state = 1 AND settled_at < ?", (purge_before,)
                )
            while True:
                token = secrets.token_hex(8)
                rows = conn.execute(_CLAIM, (until, token, queue, now, n)).fetchall()
                live = []
                for rowid, message_id, body, count, receipt in sorted(rows):
                    if count > limit:  # its lease lapsed at the limit: a crash loop
                        reason = f"lease lapsed on delivery {limit} of {limit}"
                        conn.execute(_DEAD, (now, reason, limit, rowid))
                    else:
                        live.append(Delivery(queue, message_id, bytes(body), count, receipt))
                if live or not rows:
                    return live

        return await self.db.write(claim, "claim", "transport", durable=False)

    async def _ack(self, delivery: Delivery, now: int) -> None:
        await self.db.write(self.ack_rider(delivery, now), "ack", "transport")

    async def _nack(self, delivery: Delivery, now: int, delay_ms: int) -> None:
        limit = self.options.limit(delivery.queue)
        key = (delivery.queue, delivery.message_id, delivery.receipt)

        def nack(conn: sqlite3.Connection) -> None:
            row = conn.execute(
                "SELECT rowid, deliveries FROM accord_queue " + _SETTLED, key
            ).fetchone()
            if row is None:
                return  # superseded receipt: the message was redelivered or settled
            if row[1] >= limit:
                conn.execute(_DEAD, (now, f"nacked on delivery {row[1]} of {limit}", limit, row[0]))
            else:
                conn.execute(
                    "UPDATE accord_queue SET avail_at = ?, receipt = NULL WHERE rowid = ?",
                    (now + delay_ms, row[0]),
                )

        await self.db.write(nack, "nack", "transport")

    async def _unclaim(self, deliveries: list[Delivery]) -> None:
        rows = [(d.queue, d.message_id, d.receipt) for d in deliveries]
        sql = "UPDATE accord_queue SET avail_at = 0, receipt = NULL, deliveries = deliveries - 1 "
        await self.db.write(lambda c: c.executemany(sql + _SETTLED, rows), "unclaim", "transport")

    async def dead_letter_details(self, queue: str) -> list[dict[str, Any]]:
        """Dead letters of ``queue`` with their metadata, oldest first: ``message_id``,
        ``body``, ``delivery_count``, ``reason``, ``published_at_ms``, ``dead_at_ms``."""

        def read(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            rows = conn.execute(
                "SELECT message_id, body, deliveries, reason, published_at, settled_at"
                " FROM accord_queue WHERE queue = ? AND state = 2 ORDER BY settled_at, rowid",
                (queue,),
            )
            names = ("message_id", "body", "delivery_count", "reason", "published_at_ms")
            return [
                dict(zip((*names, "dead_at_ms"), (*r[:1], bytes(r[1]), *r[2:]), strict=True))
                for r in rows
            ]

        return await self.db.read(read, "dead_letters", "transport")

    # ---- operating on what was refused (QueueAdmin) ----

    async def queue_names(self) -> list[str]:
        """Queues with a message waiting or a dead letter."""
        sql = "SELECT DISTINCT queue FROM accord_queue WHERE state IN (0, 2) ORDER BY queue"
        return await self.db.read(
            lambda c: [r[0] for r in c.execute(sql)], "queue_names", "transport"
        )

    async def waiting(self, queue: str, limit: int = 1000) -> list[Waiting]:
        """Messages waiting (or leased) on ``queue``, oldest first, read in place."""
        sql = (
            "SELECT message_id, body, deliveries, published_at FROM accord_queue"
            " WHERE queue = ? AND state = 0 ORDER BY published_at, rowid LIMIT ?"
        )

        def read(conn: sqlite3.Connection) -> list[Waiting]:
            rows = conn.execute(sql, (queue, max(limit, 0)))
            return [Waiting(queue, m, bytes(b), n, at) for m, b, n, at in rows]

        return await self.db.read(read, "waiting", "transport")

    async def remove(self, queue: str, message_ids: Sequence[str]) -> list[str]:
        """Delete waiting messages by id (the id is then unknown: a republish is new)."""
        sql = (
            "DELETE FROM accord_queue WHERE queue = ? AND state = 0 AND message_id = ?"
            " RETURNING message_id"
        )
        ids = list(dict.fromkeys(message_ids))

        def remove(conn: sqlite3.Connection) -> list[str]:
            return [r[0] for m in ids for r in conn.execute(sql, (queue, m)).fetchall()]

        return await self.db.write(remove, "remove", "transport")

    async def withdraw(self, queue: str, message_id: str) -> bool:
        """Settle a message nobody holds as if acknowledged, unread (:class:`Withdraw`)."""
        return bool(await self.db.write(self.withdraw_rider(queue, message_id), "withdraw",
                                        "transport"))  # fmt: skip

    def withdraw_rider(self, queue: str, message_id: str) -> Callable[[sqlite3.Connection], int]:
        """Withdraw inside another write transaction: the row of a message that is ready or
        delayed, or whose lease lapsed, is settled (kept for the dedup window, so a late
        republish is dropped too); a leased, settled or unknown one is left alone."""
        now = self.clock.now_ms()
        if self.options.dedup_ms:
            sql = "UPDATE accord_queue SET state = 1, settled_at = ?, body = X'', receipt = NULL "
            args: tuple[Any, ...] = (now, queue, message_id, now)
        else:
            sql, args = "DELETE FROM accord_queue ", (queue, message_id, now)
        where = (
            "WHERE queue = ? AND message_id = ? AND state = 0"
            " AND (receipt IS NULL OR avail_at <= ?)"
        )
        return lambda c: c.execute(sql + where, args).rowcount

    async def redrive_dead(self, queue: str, message_ids: Sequence[str]) -> list[str]:
        """Dead letters back to ready in place, one transaction: never lost, counted afresh."""
        now = self.clock.now_ms()
        sql = (
            "UPDATE accord_queue SET state = 0, deliveries = 0, avail_at = ?, receipt = NULL,"
            " settled_at = NULL, reason = NULL WHERE queue = ? AND state = 2 AND message_id = ?"
            " RETURNING message_id"
        )
        ids = list(dict.fromkeys(message_ids))

        def redrive(conn: sqlite3.Connection) -> list[str]:
            return [r[0] for m in ids for r in conn.execute(sql, (now, queue, m)).fetchall()]

        done = await self.db.write(redrive, "redrive", "transport")
        self._wake(queue)
        return done

    async def close(self) -> None:
        await super().close()
        if self._owns_db:
            await self.db.close()


class _EmbeddedJoint:
    """The SQLite store's commit with this queue's writes riding in its transaction."""

    def __init__(self, queue: EmbeddedTransport, store: SqliteStore) -> None:
        self.queue, self.store = queue, store

    async def commit(
        self,
        commit: Commit,
        messages: Sequence[QueuedMessage],
        acked: Sequence[Delivery],
        *,
        durable: bool,
    ) -> int:
        riders = [self.queue.ack_rider(d) for d in acked]
        riders += [self.queue.publish_rider(m.queue, m.message_id, m.body) for m in messages]
        # a cancel's fenced job, still waiting, is withdrawn by the same transaction
        jobs = (cancelled_job(m.queue, m.message_id) for m in messages)
        riders += [self.queue.withdraw_rider(*job) for job in jobs if job is not None]
        version = await self.store.commit(commit, riders, durable=durable)
        self.queue.riders_committed((m.queue for m in messages), acked)
        return version
