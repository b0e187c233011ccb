"""What a BullMQ consumer is made of: job ids and job data, the lease a delivery holds, and the
stream that runs one ``bullmq.Worker`` and hands its jobs to an async iterator.

The worker's processor turns a job into a :class:`~accord.engine.ports.Delivery`, puts it in the
stream's inbox and waits on the job's :class:`Lease` while the worker keeps renewing the lock.
``ack``/``nack`` settle the job through the transport's own connection and release the lease; the
processor then raises ``DelayedError`` so the worker leaves the already-settled job alone. A job
started more often than the queue's delivery limit (leases lapsed: consumers died or stalled) is
failed before it is handed out. See :mod:`accord.adapters.transports.bullmq` for the rules.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from bullmq import Worker  # type: ignore[import-untyped]
from bullmq.custom_errors import DelayedError, UnrecoverableError  # type: ignore[import-untyped]

from accord.engine.ports import Delivery
from accord.errors import TransportError

if TYPE_CHECKING:
    from accord.adapters.transports.bullmq import BullmqTransport

__all__ = [
    "LAPSED",
    "NACKED",
    "JobStream",
    "Lease",
    "Nack",
    "job_body",
    "job_data",
    "job_id_for",
    "message_id_of",
    "nack_delay",
]

LAPSED = "accord: lease lapsed"
NACKED = "accord: nacked"


def job_id_for(message_id: str) -> str:
    """The BullMQ job id of a message id: injective, no ``:``, never integer-like."""
    return "m-" + message_id.replace("%", "%25").replace(":", "%3A")


def message_id_of(job_id: str) -> str:
    return job_id[2:].replace("%3A", ":").replace("%25", "%")


def job_data(message_id: str, body: bytes) -> dict[str, str]:
    try:
        return {"message_id": message_id, "body": body.decode("utf-8")}
    except UnicodeDecodeError:
        return {"message_id": message_id, "body_b64": base64.b64encode(body).decode("ascii")}


def job_body(data: Mapping[str, Any]) -> bytes:
    if "body_b64" in data:
        return base64.b64decode(data["body_b64"])
    return str(data.get("body", "")).encode("utf-8")


class Nack(Exception):
    def __init__(self, delay_ms: int) -> None:
        super().__init__(f"{NACKED} (retry in {delay_ms} ms)")
        self.delay_ms = delay_ms


def nack_delay(attempts: int, kind: str, err: BaseException, job: Any) -> int:
    return err.delay_ms if isinstance(err, Nack) else 0


class Lease:
    __slots__ = ("done", "job", "token")

    def __init__(self, job: Any, token: str) -> None:
        self.job, self.token = job, token
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class JobStream:
    """One BullMQ worker feeding an iterator; ``aclose`` stops it (see the module docstring)."""

    def __init__(self, transport: BullmqTransport, queue: str, prefetch: int) -> None:
        self._t, self._queue, self._prefetch = transport, queue, prefetch
        self._inbox: asyncio.Queue[Delivery | None] = asyncio.Queue()
        self._worker: Any = None
        self._running: asyncio.Future[Any] | None = None
        self._starting: asyncio.Future[None] | None = None
        self._closed = False

    def __aiter__(self) -> JobStream:
        return self

    async def _start(self) -> None:
        t = self._t
        opts = {
            "connection": t.redis_url,
            "prefix": t.prefix,
            "autorun": False,
            "concurrency": self._prefetch,
            "lockDuration": t.options.visibility_ms,
            "stalledInterval": t.stalled_ms,
            "maxStalledCount": t.options.limit(self._queue),
            "settings": {"backoffStrategy": nack_delay},
        }
        worker = Worker(self._queue, self._process, opts)
        # Knowing the server version lets the worker block for fractions of a second.
        await worker.blockingRedisConnection.getRedisVersion()
        await worker.redisConnection.getRedisVersion()
        if self._closed:  # closed while starting
            await worker.close(force=True)
            return
        self._worker = worker
        self._running = asyncio.ensure_future(worker.run())

    async def _process(self, job: Any, token: str) -> None:
        limit = self._t.options.limit(self._queue)
        count = int(job.attemptsStarted or 1)
        if count > limit:
            await self._t._stamp_death(self._queue, job.id)
            raise UnrecoverableError(f"{LAPSED} on delivery {limit} of {limit}")
        queue = self._t.queue(self._queue)
        job.queue, job.backend = queue, queue.backend  # settle on the transport's own connection
        lease = Lease(job, token)
        # bullmq-py (3.4) may lock several jobs fetched at once with one token (its fetch loop's
        # closure reads the token late), so the token alone cannot name a delivery
        receipt = f"{self._queue}/{job.id}/{token}"
        self._t._leases[receipt] = lease
        data = job.data if isinstance(job.data, dict) else {}
        message_id = data.get("message_id", message_id_of(job.id))
        self._inbox.put_nowait(Delivery(self._queue, message_id, job_body(data), count, receipt))
        await lease.done
        raise DelayedError()  # settled by ack/nack already: the worker must not touch the job

    async def __anext__(self) -> Delivery:
        if self._starting is None and not self._closed:  # one worker, however many callers
            self._starting = asyncio.ensure_future(self._start())
        if self._starting is not None and not self._starting.done():
            await asyncio.wait([self._starting])  # a timeout around us leaves the start running
        if self._starting is not None and self._starting.done():
            failed = self._starting.cancelled() or self._starting.exception() is not None
            if failed and not (self._closed or self._t._closed):
                self._starting = None  # the next call tries again
                raise TransportError(f"cannot consume {self._queue!r}", retryable=True)
        if self._closed:
            raise StopAsyncIteration
        delivery = await self._inbox.get()
        if delivery is None:
            raise StopAsyncIteration
        return delivery

    async def aclose(self) -> None:
        """Stop consuming. Deliveries handed out stay leased until settled or lapsed; the locks
        of those not handed out lapse, and the jobs return to the queue."""
        if self._closed:
            return
        self._closed = True
        self._t._streams.discard(self)
        while not self._inbox.empty():
            pending = self._inbox.get_nowait()
            if pending is not None:
                self._t._leases.pop(pending.receipt, None)
        self._inbox.put_nowait(None)
        if self._starting is not None:
            with contextlib.suppress(Exception):
                await self._starting  # a start in progress sees _closed and closes its worker
        if self._worker is not None:
            await self._worker.close(force=True)
