"""The BullMQ transport: Accord queues as BullMQ queues on Redis, readable by Node BullMQ too.

``bullmq://host:port/db`` (or ``redis+bullmq://``) with the queue options of the embedded
transport (``visibility_ms``, ``max_deliveries``, ``dedup_ms``) plus ``prefix`` (key prefix,
default ``bull``) and ``stalled_ms`` (how often a consumer looks for stalled jobs).

- **Job ids.** A message id maps to ``m-`` + the id with ``%`` and ``:`` percent-escaped: never
  integer-like, never containing ``:``, so Node BullMQ accepts it, and one-to-one. BullMQ refuses a
  second job with a known id, which makes ``publish`` idempotent while the job exists: waiting,
  delayed, active, completed (kept ``dedup_ms``, rounded up to seconds, and removed lazily when a
  later job completes) or failed (dead letters are kept).
- **Leases.** ``consume`` runs a BullMQ ``Worker`` with ``concurrency = prefetch`` and
  ``lockDuration = visibility_ms``. Its processor hands the job to the iterator and waits until it
  is settled; the worker keeps renewing the lock meanwhile, so a lease lapses only when its process
  dies or stops running its event loop. A stalled job returns to the queue, with a higher
  ``delivery_count`` (BullMQ's ``attemptsStarted``, which counts every start, stalls included).
- **ack / nack** settle through the job itself (``moveToCompleted`` / ``moveToFailed``, the same
  calls a worker makes when its processor returns or throws), so they are durable when they return
  and keep working after the stream has closed. A nack goes through BullMQ's attempts and backoff
  (a backoff strategy that returns the nack's delay); at the limit the job moves to the failed set,
  which is this transport's dead-letter queue. A delivery that would pass the limit (a crash loop)
  is failed before it is handed out.
- **Acceptance.** BullMQ retries only until a job is accepted; after that the engine owns retries,
  and a stalled redelivery of an accepted job must not start a second remote attempt. The worker
  runtime decides that from the engine's acceptance record; ``delivery_count > 1`` is its cue to
  look before starting work.

Limits of the Python port, handled here: its worker blocks in whole seconds between delayed jobs
until it knows the server's version (asked before the worker starts, so a delayed job is late only
by Redis's timer resolution, about 100 ms at the default ``hz 10``); its rate limiter stalls
workers (none is used); handlers run in the event loop, so CPU-heavy work belongs in a child
process, or lock renewal stops and the job stalls.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from bullmq import Queue  # type: ignore[import-untyped]
from bullmq.custom_errors import UnrecoverableError  # type: ignore[import-untyped]
from redis import asyncio as aioredis
from redis.exceptions import RedisError

from accord.adapters.clock import SystemClock
from accord.adapters.transports._base import QueueOptions
from accord.adapters.transports._bullmq_consume import (
    LAPSED,
    NACKED,
    JobStream,
    Lease,
    Nack,
    job_body,
    job_data,
    job_id_for,
    message_id_of,
    nack_delay,
)
from accord.engine.ports import Clock, Delivery
from accord.errors import TransportError

__all__ = ["BullmqTransport", "job_id_for", "message_id_of"]

NACK_BACKOFF = "accord-nack"
DEAD_AT = "accordDeadAt"  # job hash field: when the transport dead-lettered it (clock ms)
_LAPSE_MARKS = (LAPSED, "job stalled more than allowable limit")
_OWN_OPTS = frozenset({"prefix", "stalled_ms"})


class BullmqTransport:
    """:class:`~accord.engine.ports.Transport` over BullMQ (see the module docstring)."""

    def __init__(
        self,
        redis_url: str,
        options: QueueOptions | None = None,
        *,
        prefix: str = "bull",
        stalled_ms: int | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.redis_url, self.prefix = redis_url, prefix
        self.options = options or QueueOptions()
        self.stalled_ms = stalled_ms or self.options.visibility_ms
        self.clock: Clock = clock or SystemClock()
        self.redis = aioredis.Redis.from_url(redis_url, decode_responses=True)
        self._queues: dict[str, Any] = {}
        self._leases: dict[str, Lease] = {}  # receipt -> lease, for deliveries not yet settled
        self._streams: set[JobStream] = set()
        self._closed = False

    @classmethod
    def from_url(
        cls, url: str, clock: Clock | None = None, limits: Mapping[str, int] | None = None
    ) -> BullmqTransport:
        parts = urlsplit(url)
        pairs = parse_qsl(parts.query)
        unknown = sorted(
            {k for k, _ in pairs} - {"visibility_ms", "max_deliveries", "dedup_ms"} - _OWN_OPTS
        )
        if unknown:
            raise ValueError(f"unknown option(s) {unknown}")
        own = dict(pairs)
        options = QueueOptions.from_query([p for p in pairs if p[0] not in _OWN_OPTS], limits)
        stalled = int(own["stalled_ms"]) if "stalled_ms" in own else None
        redis_url = f"redis://{parts.netloc or '127.0.0.1:6379'}{parts.path or '/0'}"
        return cls(
            redis_url, options, prefix=own.get("prefix", "bull"), stalled_ms=stalled, clock=clock
        )

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

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("transport is closed", retryable=False)

    async def publish(self, queue: str, message_id: str, body: bytes, delay_ms: int = 0) -> None:
        self._check_open()
        if not queue or not message_id:
            raise TransportError("publish: queue and message_id must be non-empty", retryable=False)
        opts = {
            "jobId": job_id_for(message_id),
            "delay": max(delay_ms, 0),
            "attempts": self.options.limit(queue),
            "backoff": {"type": NACK_BACKOFF},
            "removeOnComplete": {"age": max(1, math.ceil(self.options.dedup_ms / 1000))},
            "removeOnFail": False,
        }
        try:
            await self.queue(queue).add("accord", job_data(message_id, bytes(body)), opts)
        except (RedisError, OSError) as exc:
            raise TransportError(f"publish to {queue!r} failed: {exc}", retryable=True) from exc

    def consume(self, queue: str, prefetch: int = 1) -> AsyncIterator[Delivery]:
        if prefetch < 1:
            raise ValueError(f"consume({queue!r}): prefetch must be >= 1, got {prefetch}")
        self._check_open()
        stream = JobStream(self, queue, prefetch)
        self._streams.add(stream)
        return stream

    async def ack(self, delivery: Delivery) -> None:
        lease = self._leases.pop(delivery.receipt, None)
        if lease is not None:  # else superseded or already settled: nothing to do
            await self._settle(lease, lease.job.moveToCompleted("", lease.token, False))

    async def nack(self, delivery: Delivery, delay_ms: int = 0) -> None:
        lease = self._leases.pop(delivery.receipt, None)
        if lease is None:
            return
        limit = self.options.limit(delivery.queue)
        if delivery.delivery_count >= limit:
            why = UnrecoverableError(f"{NACKED} on delivery {delivery.delivery_count} of {limit}")
            await self._stamp_death(delivery.queue, lease.job.id)
            await self._settle(lease, lease.job.moveToFailed(why, lease.token, False))
        else:
            await self._settle(lease, lease.job.moveToFailed(Nack(max(delay_ms, 0)), lease.token))

    async def _stamp_death(self, queue: str, job_id: str) -> None:
        """Record when (on this transport's clock) the job was dead-lettered, beside the job."""
        await self.redis.hset(self.queue(queue).toKey(job_id), DEAD_AT, self.clock.now_ms())

    async def _settle(self, lease: Lease, step: Any) -> None:
        try:
            await step
        except (RedisError, OSError) as exc:
            raise TransportError(f"settling a delivery failed: {exc}", retryable=True) from exc
        except Exception as exc:  # the lock was lost: the job is someone else's now
            if "lock" not in str(exc).lower() and "missing" not in str(exc).lower():
                raise TransportError(f"settling a delivery failed: {exc}", retryable=False) from exc
        finally:
            if not lease.done.done():
                lease.done.set_result(None)

    async def dead_letters(self, queue: str) -> list[Delivery]:
        return [
            Delivery(queue, d["message_id"], d["body"], d["delivery_count"], receipt="")
            for d in await self.dead_letter_details(queue)
        ]

    async def dead_letter_details(self, queue: str) -> list[dict[str, Any]]:
        """Jobs in the failed set, oldest first: ``message_id``, ``body``, ``delivery_count``
        (deliveries handed out), ``reason``, ``dead_at_ms``. Reading them removes nothing."""
        jobs = sorted(await self.queue(queue).getFailed(0, -1), key=lambda j: (j.finishedOn, j.id))
        async with self.redis.pipeline(transaction=False) as pipe:
            for job in jobs:
                pipe.hget(self.queue(queue).toKey(job.id), DEAD_AT)
            stamps = await pipe.execute()
        out = []
        for job, stamp in zip(jobs, stamps, strict=True):
            reason = job.failedReason or ""
            lapsed = any(reason.startswith(mark) for mark in _LAPSE_MARKS)
            data = job.data if isinstance(job.data, dict) else {}
            out.append(
                {
                    "message_id": data.get("message_id", message_id_of(job.id)),
                    "body": job_body(data),
                    "delivery_count": job.attemptsStarted - (1 if lapsed else 0),
                    "reason": reason,
                    "dead_at_ms": int(stamp or job.finishedOn or 0),
                }
            )
        return out

    async def close(self) -> None:
        self._closed = True
        await asyncio.gather(*(s.aclose() for s in list(self._streams)))
        await self.redis.aclose()
