"""The BullMQ transport: Accord queues as BullMQ queues on Redis, readable by Node BullMQ too.

``bullmq://host:port/db`` (or ``redis+bullmq://``) with the queue options of the embedded
transport (``visibility_ms``, ``max_deliveries``, ``dedup_ms``) plus ``prefix`` (key prefix,
default ``bull``) and ``stalled_ms`` (how often a consumer looks for stalled jobs).

Jobs change state only through BullMQ's own Lua scripts as bullmq-py ships them
(``addStandardJob``/``addDelayedJob``, ``moveToActive``, ``moveToFinished``, ``extendLocks``,
``moveStalledJobsToWait``, ``retryJob``, ``moveToDelayed``, ``moveJobFromActiveToWait``,
``removeJob``), so Node BullMQ producers and workers share the queues with this transport
unchanged. Beside them the transport only drops the marker's "jobs waiting" member right before
it looks for jobs itself, lowers ``attemptsStarted`` of a job it gives back never handed out, and
stamps dead letters with a field of its own.

- **Job ids.** A message id maps to ``m-`` + the id with ``%`` and ``:`` percent-escaped: never
  integer-like, never containing ``:``, so Node BullMQ accepts it, and one-to-one. BullMQ refuses a
  second job with a known id, which makes ``publish`` idempotent while the job exists: waiting,
  delayed, active, completed within ``dedup_ms`` or failed (a dead letter, while kept). A completed
  job is removed lazily (``removeOnComplete`` age: ``dedup_ms`` rounded up to seconds, applied when
  a later job completes); a publish refused for a job completed more than ``dedup_ms`` ago removes
  it and adds the message again. Publishes and settles of concurrent tasks share round trips (one
  pipeline of script calls per trip, each script atomic on its own).
- **Retention.** A queue is not an archive of payloads: it keeps at most ``done_count`` (1000)
  completed jobs, and its dead letters (``removeOnFail``) for ``dead_ms`` (one hour, time for the
  reconciler to report them on their runs) and at most ``dead_count`` (1000, at least 1). BullMQ
  trims both when a later job of the queue finishes the same way.
- **Leases.** ``consume`` runs one fetch loop per stream (see
  :mod:`~accord.adapters.transports._bullmq_consume`): it takes jobs with ``moveToActive`` while
  fewer than ``prefetch`` of its deliveries are unsettled, each locked for ``visibility_ms``, and
  waits on the queue's marker when the queue is empty. One timer renews the locks of all the
  stream's unsettled deliveries every ``visibility_ms / 2``, so a lease lapses only when its
  process dies or stops running its event loop. A stalled job returns to the queue (every
  consumer runs BullMQ's stalled-jobs check when it starts and every ``stalled_ms``) with a higher
  ``delivery_count`` (BullMQ's ``attemptsStarted``, which counts every start, stalls included).
- **ack / nack** settle through the transport's own connections with the calls a BullMQ worker
  makes when its processor returns or throws (``moveToFinished``; ``retryJob`` or
  ``moveToDelayed``), so they are durable when they return and keep working after the stream has
  closed. An ack also takes the stream's next job when the stream wants one (``fetchNext``). A
  nack goes through BullMQ's attempts and backoff (the job's ``backoff`` option; this transport's
  own jobs name the nack's delay; without a delay the job goes back to the head of the line, as a
  broker requeues it); at the limit the job moves to the failed set, which is this transport's
  dead-letter queue. A delivery that would pass the limit (a crash loop) is failed
  before it is handed out.
- **Acceptance.** BullMQ retries only until a job is accepted; after that the engine owns retries,
  and a stalled redelivery of an accepted job must not start a second remote attempt. The worker
  runtime decides that from the engine's acceptance record; ``delivery_count > 1`` is its cue to
  look before starting work.

Known limits of the Python port: BullMQ's worker features beyond these calls (job schedulers and
repeatable jobs, flows with parent jobs, per-worker rate limits, job progress and logs) are not
used by a consumer of this transport; a rate limit set on a queue by BullMQ users is waited out,
and a global concurrency limit is honoured by ``moveToActive`` itself. Timestamps in the scripts
are this host's wall clock, as with BullMQ; the transport's clock only stamps dead letters.
Blocking waits use fractional seconds (Redis 6 or later). Handlers run in the event loop, so
CPU-heavy work belongs in a child process, or lock renewal stops and the job stalls.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import msgpack  # type: ignore[import-untyped]
from bullmq import Queue  # type: ignore[import-untyped]
from bullmq.backoffs import Backoffs  # type: ignore[import-untyped]
from redis import asyncio as aioredis
from redis.exceptions import RedisError, WatchError

from accord.adapters._redis_group import GroupCalls
from accord.adapters._store_rules import int_option, prefix_option, redis_db
from accord.adapters.clock import SystemClock
from accord.adapters.transports._base import (
    QueueOptions,
    TransportBase,
    broker_options,
    check_prefetch,
)
from accord.adapters.transports._bullmq_consume import (
    LAPSED,
    NACKED,
    SUPERSEDED,
    UNCOUNT,
    JobStream,
    Lease,
    Nack,
    QueueOps,
    Unreadable,
    ignore,
    job_data,
    job_id_for,
    lua_source,
    message_id_of,
    nack_delay,
    now_ms,
    raw_data,
    read_job,
)
from accord.engine.ports import Clock, Delivery, Waiting
from accord.errors import TransportError

__all__ = ["BullmqTransport", "job_id_for", "message_id_of"]

NACK_BACKOFF = "accord-nack"
DEAD_AT = "accordDeadAt"  # job hash field: when the transport dead-lettered it (clock ms)
_LAPSE_MARKS = (LAPSED, "job stalled more than allowable limit")
_OWN_OPTS = frozenset({"prefix", "stalled_ms", "done_count", "dead_ms", "dead_count"})
DONE_COUNT = 1_000  # completed jobs a queue keeps at most (each within dedup_ms of completing)
DEAD_MS = 3_600_000  # how long a dead letter (a failed job) is kept: the reconciler reads it
DEAD_COUNT = 1_000  # dead letters a queue keeps at most
_MOVE_BACK = lua_source("moveJobFromActiveToWait-9.lua")
_COMPLETED_AT = 'return redis.call("ZSCORE", KEYS[1], ARGV[1])'  # when a job completed, if it did
_UNMARK = 'return redis.call("ZREM", KEYS[1], "0")'  # drop the marker's "jobs waiting" member


def _glob(text: str) -> str:
    """``text`` with Redis glob characters escaped, to match it literally."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _stamp(value: Any) -> int:
    """An integer field of a job hash (0 when absent or not an integer)."""
    return int(value) if isinstance(value, str) and value.isdigit() else 0


class BullmqTransport(TransportBase):
    """:class:`~accord.engine.ports.Transport` over BullMQ (see the module docstring); to its
    streams, a :class:`~accord.adapters.transports._bullmq_consume.JobSource`."""

    def __init__(
        self,
        redis_url: str,
        options: QueueOptions | None = None,
        *,
        prefix: str = "bull",
        stalled_ms: int | None = None,
        clock: Clock | None = None,
        done_count: int = DONE_COUNT,
        dead_ms: int = DEAD_MS,
        dead_count: int = DEAD_COUNT,
    ) -> None:
        self.redis_url, self.prefix = redis_url, prefix
        self.options = options or QueueOptions()
        self.stalled_ms = stalled_ms or self.options.visibility_ms
        self.clock: Clock = clock or SystemClock()
        # job data that is not UTF-8 reads as escaped text (see read_job), not as an error
        self.redis = aioredis.Redis.from_url(
            redis_url, decode_responses=True, encoding_errors="surrogateescape"
        )
        self._queues: dict[str, Any] = {}
        self._ops: dict[str, QueueOps] = {}
        self._leases: dict[str, Lease] = {}  # receipt -> lease, for deliveries not yet settled
        self._receipts = itertools.count(1)
        self._streams: set[JobStream] = set()
        self._calls = GroupCalls(self.redis)  # publishes and settles, many per round trip
        self._completed_at = self.redis.register_script(_COMPLETED_AT)
        self._unmark = self.redis.register_script(_UNMARK)
        # retention: a queue is not an archive of payloads (BullMQ trims on each later finish)
        self._keep_done = {
            "age": max(1, math.ceil(self.options.dedup_ms / 1000)),
            "count": max(0, done_count),
        }
        self._keep_dead = {"age": max(1, math.ceil(dead_ms / 1000)), "count": max(1, dead_count)}
        self._closed = False

    @classmethod
    def from_url(
        cls, url: str, clock: Clock | None = None, limits: Mapping[str, int] | None = None
    ) -> BullmqTransport:
        parts = urlsplit(url)
        options, own = broker_options(parts.query, _OWN_OPTS, limits)
        stalled = int_option(own, "stalled_ms", 0) if "stalled_ms" in own else None
        prefix = prefix_option(own, "bull")
        db = redis_db(parts.path)
        keep = {
            name: int_option(own, name, default)
            for name, default in (
                ("done_count", DONE_COUNT), ("dead_ms", DEAD_MS), ("dead_count", DEAD_COUNT)
            )
        }  # fmt: skip
        if keep["done_count"] < 0 or keep["dead_ms"] < 0 or keep["dead_count"] < 1:
            raise ValueError(
                "queue options done_count and dead_ms must be >= 0 and dead_count >= 1, got "
                + ", ".join(f"{k}={v}" for k, v in sorted(keep.items()))
            )
        redis_url = f"redis://{parts.netloc or '127.0.0.1:6379'}/{db}"
        return cls(
            redis_url, options, prefix=prefix, stalled_ms=stalled, clock=clock,
            **keep,
        )  # fmt: skip

    def queue(self, name: str) -> Any:
        """The ``bullmq.Queue`` behind ``name`` (shares this transport's connection pool)."""
        if name not in self._queues:
            opts = {
                "connection": self.redis,
                "prefix": self.prefix,
                "settings": {"backoffStrategy": nack_delay},
            }
            self._queues[name] = Queue(name, opts)
        return self._queues[name]

    def ops(self, name: str) -> QueueOps:
        """Keys and scripts of queue ``name``, worked out once."""
        ops = self._ops.get(name)
        if ops is None:
            ops = self._ops[name] = QueueOps(self.queue(name))
        return ops

    async def publish(self, queue: str, message_id: str, body: bytes, delay_ms: int = 0) -> None:
        self._check_publish(queue, message_id)
        ops = self._ops.get(queue) or self.ops(queue)
        job_id, delay, stamp = job_id_for(message_id), max(delay_ms, 0), now_ms()
        dedup = self.options.dedup_ms
        opts = {  # what bullmq-py's Queue.add stores for these options
            "attempts": self.options.limit(queue),
            "delay": delay,
            "jobId": job_id,
            "backoff": {"type": NACK_BACKOFF},
            "removeOnComplete": self._keep_done,
            "removeOnFail": self._keep_dead,
        }
        args = [
            msgpack.packb(
                [ops.prefix, job_id, "accord", stamp, None, None, None, None, None],
                use_bin_type=True,
            ),
            json.dumps(job_data(message_id, bytes(body)), separators=(",", ":")),
            msgpack.packb(opts, use_bin_type=True),
            stamp,
        ]
        if delay:
            script, keys = ops.commands["addDelayedJob"], ops.delayed_keys
        else:
            script, keys = ops.commands["addStandardJob"], ops.add_keys
        calls = self._calls
        try:
            for _ in range(2):
                adding = calls.submit(script, keys, args)
                seen = calls.submit(self._completed_at, [ops.completed], [job_id])  # same trip
                seen.add_done_callback(ignore)
                added, finished = await adding, await seen
                if finished is None or float(finished) + dedup >= now_ms():
                    break
                await self._forget(ops, job_id, dedup)  # completed before the window: forget it
        except (RedisError, OSError) as exc:
            raise TransportError(f"publish to {queue!r} failed: {exc}", retryable=True) from exc
        if isinstance(added, int) and added < 0:
            raise TransportError(f"publish to {queue!r} refused: code {added}", retryable=False)

    async def _forget(self, ops: QueueOps, job_id: str, dedup_ms: int) -> None:
        """Remove a job completed more than ``dedup_ms`` ago (BullMQ's ``removeJob``), unless it
        changes meanwhile."""
        remove = ops.commands["removeJob"]
        await self.redis.script_load(remove.script)
        job_key = ops.prefix + job_id
        async with self.redis.pipeline(transaction=True) as pipe:
            await pipe.watch(job_key)
            finished = await pipe.zscore(ops.completed, job_id)
            if finished is None or finished + dedup_ms >= now_ms():
                return
            pipe.multi()  # type: ignore[no-untyped-call]
            pipe.evalsha(remove.sha, 2, job_key, ops.repeat, job_id, 0, ops.prefix)
            with contextlib.suppress(WatchError):
                await pipe.execute()

    def consume(self, queue: str, prefetch: int = 1) -> AsyncIterator[Delivery]:
        check_prefetch(queue, prefetch)
        self._check_open()
        stream = JobStream(self, queue, prefetch)
        self._streams.add(stream)
        return stream

    # -- what its streams use (JobSource) -----------------------------------------------------

    def lease_out(self, lease: Lease) -> str:
        receipt = f"{lease.queue}/{lease.job_id}/{lease.token}/{next(self._receipts)}"
        self._leases[receipt] = lease
        return receipt

    def leased(self, receipt: str) -> Lease | None:
        return self._leases.get(receipt)

    def drop_lease(self, receipt: str) -> Lease | None:
        return self._leases.pop(receipt, None)

    def stream_closed(self, stream: JobStream) -> None:
        self._streams.discard(stream)

    async def dead_letter(self, lease: Lease, reason: str, *, keep: bytes | None = None) -> None:
        """Fail the job of ``lease`` into the failed set, stamped with when (see DEAD_AT); data
        nobody can read is cut to ``keep`` (a bounded prefix of it) first."""
        await self._stamp_death(lease.queue, lease.job_id, keep)
        await self._finish(lease, "failed", reason)

    # -- settling ---------------------------------------------------------------------------

    async def ack(self, delivery: Delivery) -> None:
        lease = self._leases.pop(delivery.receipt, None)
        if lease is None:  # superseded or already settled: nothing to do
            return
        stream = lease.stream
        fetch = stream is not None and stream.settling(delivery.receipt, fetch=True)
        got: Any = None
        try:
            if fetch:  # the marker is stale once the queue is empty (see _bullmq_consume)
                unmark = self.ops(lease.queue).marker
                self._calls.submit(self._unmark, [unmark], []).add_done_callback(ignore)
            got = await self._finish(lease, "completed", '""', fetch=fetch)
        finally:
            if fetch and stream is not None:
                await stream.settled(got, lease.token)

    async def nack(self, delivery: Delivery, delay_ms: int = 0) -> None:
        lease = self._leases.pop(delivery.receipt, None)
        if lease is None:
            return
        try:
            await self._retry_or_fail(lease, delivery, max(delay_ms, 0))
        finally:  # the slot frees once the job is back: it is not overtaken by later ones
            if lease.stream is not None:
                lease.stream.settling(delivery.receipt, fetch=False)

    async def _retry_or_fail(self, lease: Lease, delivery: Delivery, delay_ms: int) -> None:
        limit = self.options.limit(delivery.queue)
        count, nack = delivery.delivery_count, Nack(delay_ms)
        delay: Any = -1
        if count < limit and lease.made + 1 < lease.attempts:  # BullMQ's attempts and backoff
            backoff = Backoffs.normalize(lease.backoff)
            delay = await Backoffs.calculate(backoff, lease.made + 1, nack, None, nack_delay)
        if delay == -1:
            await self.dead_letter(lease, f"{NACKED} on delivery {count} of {limit}")
            return
        scripts, fields = self.ops(lease.queue).scripts, {"failedReason": str(nack)}
        try:
            if delay:
                await scripts.moveToDelayed(
                    lease.job_id, now_ms(), int(delay), lease.token, {"fieldsToUpdate": fields}
                )
            else:
                # at the head of the line, as a broker requeues a message nacked without delay
                await scripts.retryJob(lease.job_id, True, lease.token, {"fieldsToUpdate": fields})
        except (RedisError, OSError) as exc:
            raise TransportError(f"settling a delivery failed: {exc}", retryable=True) from exc
        except TypeError as exc:  # BullMQ's error codes: the lock was lost, the job is elsewhere
            if "lock" not in str(exc).lower() and "missing" not in str(exc).lower():
                raise TransportError(f"settling a delivery failed: {exc}", retryable=False) from exc

    async def _finish(self, lease: Lease, target: str, value: str, *, fetch: bool = False) -> Any:
        """``moveToFinished`` for ``lease``: its reply (the next job when ``fetch``), or None
        when the lease was superseded (its lock lost: the job is someone else's now)."""
        ops = self.ops(lease.queue)
        lock_ms = self.options.visibility_ms
        keys, args = ops.finish_call(lease, target, value, fetch=fetch, lock_ms=lock_ms)
        try:
            got = await self._calls.call(ops.commands["moveToFinished"], keys, args)
        except (RedisError, OSError) as exc:
            raise TransportError(f"settling a delivery failed: {exc}", retryable=True) from exc
        if isinstance(got, int) and got < 0:
            if got in SUPERSEDED:
                return None
            raise TransportError(f"settling a delivery failed: code {got}", retryable=False)
        return got

    async def give_back(self, queue: str, leases: list[Lease]) -> None:
        """Put jobs taken but never handed out back at the head of the queue, uncounted."""
        if not leases:
            return
        ops = self.ops(queue)
        sha = await self.redis.script_load(_MOVE_BACK)
        async with self.redis.pipeline(transaction=True) as pipe:
            for lease in reversed(leases):  # the first taken ends up first in line
                key = ops.prefix + lease.job_id
                pipe.eval(UNCOUNT, 2, key + ":lock", key, lease.token)
                pipe.evalsha(
                    sha, len(ops.back_keys), *ops.back_keys, lease.job_id, lease.token, key
                )
            await pipe.execute(raise_on_error=False)

    async def _stamp_death(self, queue: str, job_id: str, keep: bytes | None = None) -> None:
        """Record when (on this transport's clock) the job was dead-lettered, beside the job
        (and replace data nobody can read with ``keep``)."""
        key, now = self.ops(queue).prefix + job_id, self.clock.now_ms()
        if keep is None:
            await self.redis.hset(key, DEAD_AT, now)
        else:
            await self.redis.hset(key, mapping={DEAD_AT: now, "data": keep})

    async def dead_letter_details(self, queue: str) -> list[dict[str, Any]]:
        """Jobs in the failed set, oldest first: ``message_id``, ``body``, ``delivery_count``
        (deliveries handed out), ``reason``, ``dead_at_ms``. Reading them removes nothing."""
        return [record for _, record in await self._failed_jobs(queue)]

    async def _failed_jobs(self, queue: str) -> list[tuple[str, dict[str, Any]]]:
        """``(job id, dead-letter record)`` of each job in the failed set, oldest first."""
        ops = self.ops(queue)
        names = ("data", "failedReason", "ats", "finishedOn", DEAD_AT)
        try:
            failed = await self.redis.zrange(self.queue(queue).toKey("failed"), 0, -1)
            ids = [str(i) for i in failed]
            async with self.redis.pipeline(transaction=False) as pipe:
                for job_id in ids:  # read raw: data nobody can read is listed, not a failure
                    pipe.hmget(ops.prefix + job_id, names)
                rows = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise TransportError(
                f"cannot read the dead letters of {queue!r}: {exc}", retryable=True
            ) from exc
        jobs = sorted(
            ((_stamp(row[3]), job_id, row) for job_id, row in zip(ids, rows, strict=True)),
            key=lambda j: (j[0], j[1]),
        )
        out = []
        for finished, job_id, (data, failed_reason, started, _, stamp) in jobs:
            reason = failed_reason or ""
            lapsed = any(reason.startswith(mark) for mark in _LAPSE_MARKS)
            try:
                message_id, body = read_job(job_id, data)
            except Unreadable:
                message_id, body = raw_data(job_id, data)
            record = {
                "message_id": message_id,
                "body": body,
                "delivery_count": _stamp(started) - (1 if lapsed else 0),
                "reason": reason,
                "dead_at_ms": _stamp(stamp) or finished,
            }
            out.append((job_id, record))
        return out

    # -- operating on what was refused (QueueAdmin) --------------------------------------------

    async def queue_names(self) -> list[str]:
        """Queues with a job waiting, delayed, active or failed under this prefix (Redis drops
        an empty list or set, so a key's presence is the answer)."""
        head = f"{self.prefix}:"
        states = ("wait", "paused", "delayed", "prioritized", "active", "failed")
        found: set[str] = set()
        try:
            async for key in self.redis.scan_iter(match=f"{_glob(head)}*", count=1000):
                name, _, state = str(key)[len(head) :].rpartition(":")
                if name and state in states:
                    found.add(name)
        except (RedisError, OSError) as exc:
            raise TransportError(f"cannot list queues: {exc}", retryable=True) from exc
        return sorted(found)

    async def _waiting_jobs(self, queue: str, limit: int) -> list[tuple[str, Waiting]]:
        """``(job id, message)`` of the jobs not yet finished, oldest first (read raw: data
        nobody can read is listed, as in :meth:`dead_letter_details`)."""
        if limit <= 0:
            return []
        q = self.queue(queue)
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for state in ("wait", "paused", "active"):
                    pipe.lrange(q.toKey(state), 0, -1)
                for state in ("prioritized", "delayed"):
                    pipe.zrange(q.toKey(state), 0, -1)
                wait, paused, active, prioritized, delayed = await pipe.execute()
            # the head of the line is the right end of a BullMQ list
            ids = [*reversed(active), *reversed(wait), *reversed(paused), *prioritized, *delayed]
            ids = list(dict.fromkeys(str(i) for i in ids))
            names = ("data", "ats", "timestamp")
            prefix = self.ops(queue).prefix
            async with self.redis.pipeline(transaction=False) as pipe:
                for job_id in ids:
                    pipe.hmget(prefix + job_id, names)
                rows = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise TransportError(f"cannot read queue {queue!r}: {exc}", retryable=True) from exc
        out = []
        for job_id, (data, started, stamp) in zip(ids, rows, strict=True):
            if data is None:
                continue  # finished and removed meanwhile
            try:
                message_id, body = read_job(job_id, data)
            except Unreadable:
                message_id, body = raw_data(job_id, data)
            out.append((job_id, Waiting(queue, message_id, body, _stamp(started), _stamp(stamp))))
        out.sort(key=lambda j: (j[1].published_at_ms, j[0]))
        return out[: max(limit, 0)]

    async def waiting(self, queue: str, limit: int = 1000) -> list[Waiting]:
        return [w for _, w in await self._waiting_jobs(queue, limit)]

    async def remove(self, queue: str, message_ids: Sequence[str]) -> list[str]:
        """Remove waiting jobs by message id, with BullMQ's ``removeJob`` (a job locked by a
        consumer is left alone)."""
        wanted = set(message_ids)
        ops = self.ops(queue)
        jobs = [(j, w.message_id) for j, w in await self._waiting_jobs(queue, 1 << 30)]
        done = []
        try:
            remove = ops.commands["removeJob"]
            for job_id, message_id in jobs:
                if message_id in wanted:
                    got = await remove(keys=[ops.prefix + job_id, ops.repeat],
                                       args=[job_id, 0, ops.prefix])  # fmt: skip
                    if got == 1:
                        done.append(message_id)
        except (RedisError, OSError) as exc:
            raise TransportError(f"removing from {queue!r} failed: {exc}", retryable=True) from exc
        return list(dict.fromkeys(done))

    async def withdraw(self, queue: str, message_id: str) -> bool:
        """Remove a job nobody holds (waiting, paused, delayed or prioritized, or active with a
        lapsed lock) with BullMQ's ``removeJob``, watched so a job taken meanwhile is left to its
        consumer; a locked, completed or failed job is left alone (:class:`Withdraw`). The
        transaction leaves a tombstone at the job's key for ``dedup_ms`` (a hash holding only
        ``withdrawn``, in none of the queue's sets), so BullMQ still refuses a second job under
        the id, as it would a completed one: a late republish of the same job (an outbox entry
        handed over again) adds nothing."""
        ops, job_id = self.ops(queue), job_id_for(message_id)
        job_key, remove = ops.prefix + job_id, ops.commands["removeJob"]
        failed = self.queue(queue).toKey("failed")
        try:
            await self.redis.script_load(remove.script)
            async with self.redis.pipeline(transaction=True) as pipe:
                await pipe.watch(job_key)
                if (
                    not await pipe.exists(job_key)
                    or await pipe.hexists(job_key, "withdrawn")  # withdrawn before
                    or await pipe.exists(job_key + ":lock")
                    or await pipe.zscore(ops.completed, job_id) is not None
                    or await pipe.zscore(failed, job_id) is not None
                ):
                    return False
                pipe.multi()  # type: ignore[no-untyped-call]
                pipe.evalsha(remove.sha, 2, job_key, ops.repeat, job_id, 0, ops.prefix)
                pipe.hset(job_key, "withdrawn", str(now_ms()))
                pipe.pexpire(job_key, max(self.options.dedup_ms, 1))
                try:
                    removed, _, _ = await pipe.execute()
                except WatchError:  # taken (or settled) meanwhile: its consumer has it
                    return False
        except (RedisError, OSError) as exc:
            raise TransportError(
                f"withdrawing from {queue!r} failed: {exc}", retryable=True
            ) from exc
        return bool(removed == 1)

    async def redrive_dead(self, queue: str, message_ids: Sequence[str]) -> list[str]:
        """Failed jobs back to the wait list with BullMQ's ``reprocessJob``, their attempt
        counts reset: the job moves in one script, so it is never lost."""
        wanted = set(message_ids)
        scripts = self.ops(queue).scripts
        done = []
        try:
            for job_id, record in await self._failed_jobs(queue):
                if record["message_id"] not in wanted:
                    continue
                job = SimpleNamespace(id=job_id, opts={})
                reset = {"resetAttemptsMade": True, "resetAttemptsStarted": True}
                try:
                    await scripts.reprocessJob(job, "failed", reset)
                except TypeError:  # BullMQ's error codes: it left the failed set meanwhile
                    continue
                await self.redis.hdel(self.ops(queue).prefix + job_id, DEAD_AT, "stacktrace")
                done.append(record["message_id"])
        except (RedisError, OSError) as exc:
            raise TransportError(f"redriving {queue!r} failed: {exc}", retryable=True) from exc
        return list(dict.fromkeys(done))

    async def close(self) -> None:
        self._closed = True
        await asyncio.gather(*(s.aclose() for s in list(self._streams)))
        await self._calls.close()
        await self.redis.aclose()
