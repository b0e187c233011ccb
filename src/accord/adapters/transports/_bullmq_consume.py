"""What a BullMQ consumer is made of: job ids and job data, the per-queue calls of BullMQ's Lua
scripts, the lease a delivery holds, and the stream that takes jobs and hands them to an iterator.

A :class:`JobStream` is one fetch loop on one Redis connection of its own. While the queue has
jobs and fewer than ``prefetch`` of the stream's deliveries are unsettled it takes them with
BullMQ's ``moveToActive`` (which locks each job for ``visibility_ms`` and counts the start in
``attemptsStarted``), several calls in one round trip (two, doubling while every call finds a job,
at most :data:`MAX_BATCH` and never more than the free slots). When ``moveToActive`` finds nothing
the loop blocks on the queue's marker (``BZPOPMIN``), as a BullMQ worker does, until a producer
adds a job or the next delayed job is due. Before each ``moveToActive`` it drops the marker's "jobs
waiting" member: a ``moveToActive`` that takes a job sets it again (and a consumer blocked on the
marker is served before the next command runs), one that finds the queue empty leaves none
behind, so an emptied queue costs one blocking call rather than a round of empty ones. A delayed
job is taken when due: the loop pings Redis at that moment, so the blocking call ends on time
instead of at Redis's next timer tick. An ``ack`` settles with ``moveToFinished``; while the
stream is taking jobs (not waiting on the marker) that call also takes its next job
(``fetchNext``), one round trip for both, the marker dropped before it in the same way.

One timer per stream renews the locks of all its unsettled deliveries every ``visibility_ms / 2``
(one ``extendLocks`` call); another runs ``moveStalledJobsToWait`` when the stream starts and
every ``stalled_ms``: a job whose lock lapsed (its consumer died or stopped running its event
loop) goes back to the queue and is taken again with a higher ``attemptsStarted``. A job started
more often than the queue's delivery limit, or one BullMQ's stalled check gave up on (``defa``),
is failed before it is handed out, and so is a job whose data is not accord's job data
(:func:`read_job`: not UTF-8, not JSON or nested too deeply, not an object, no string body or a
``body_b64`` that is not base64), with the reason and at most ``UNREADABLE_BODY_BYTES`` of its
raw data kept: it never holds a slot. A delivery whose lock was lost before it was handed out is
never handed out. Closing a stream stops both timers: what it handed out stays leased until
settled or lapsed (and is marked for the next stalled check, so it returns as soon as its lock
lapses); the jobs it took but never handed out go back to the head of the queue in the order
taken, their start uncounted (BullMQ's ``moveJobFromActiveToWait`` and, in the same transaction,
``attemptsStarted`` lowered again if the lock was still the stream's). See
:mod:`accord.adapters.transports.bullmq` for the rules.

A stream uses its transport only through :class:`JobSource`: the connection settings and
options, the queue's :class:`QueueOps`, the transport's register of leases handed out (which the
transport's ``ack`` and ``nack`` settle), dead-lettering a job, and giving jobs back.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import bullmq  # type: ignore[import-untyped]
import msgpack  # type: ignore[import-untyped]
from redis.asyncio.connection import Connection, parse_url
from redis.exceptions import NoScriptError, RedisError

from accord.adapters._redis_group import pack, round_trip
from accord.adapters.transports._base import UNREADABLE_BODY_BYTES, BrokerStream, QueueOptions
from accord.engine.ports import Delivery
from accord.engine.runtime.wire import UndecodableJson, decode_json
from accord.errors import TransportError

__all__ = [
    "LAPSED",
    "NACKED",
    "UNCOUNT",
    "JobSource",
    "JobStream",
    "Lease",
    "Nack",
    "QueueOps",
    "Unreadable",
    "ignore",
    "job_data",
    "job_id_for",
    "lua_source",
    "message_id_of",
    "nack_delay",
    "now_ms",
    "raw_data",
    "read_job",
]

LAPSED = "accord: lease lapsed"
UNREADABLE = "accord: job data"  # how the reason for job data nobody can read begins
NACKED = "accord: nacked"
MAX_BATCH = 16  # moveToActive calls in one round trip, at most
DRAIN_S = 5.0  # longest marker wait without a known next delayed job (BullMQ's drainDelay)
CLOSE_S = 5.0  # how long closing waits for a take under way
RETRY_S = 0.25  # pause after a failed Redis call in a stream's loops
SUPERSEDED = (-1, -2, -6)  # moveToFinished/retryJob codes: no such job, no lock, not our lock
log = logging.getLogger(__name__)
_BULLMQ_LUA = Path(bullmq.__file__).parent / "commands"
# Reverses the start that moveToActive counted, if the lock is still ours; run in one MULTI with
# BullMQ's moveJobFromActiveToWait, which releases the lock and puts the job back for the next
# consumer.
UNCOUNT = """
if redis.call("GET", KEYS[1]) == ARGV[1] then redis.call("HINCRBY", KEYS[2], "ats", -1) end
return 0
"""


def now_ms() -> int:
    """Wall-clock milliseconds, as BullMQ's scripts expect (not the transport's clock)."""
    return round(time.time() * 1000)


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


class Unreadable(ValueError):
    """A job's data is not accord's job data; ``str()`` is the reason it is dead-lettered for."""


def _fallback_id(job_id: str) -> str:
    """The message id of a job whose data names none: from its job id (any job id)."""
    return message_id_of(job_id) if job_id.startswith("m-") and len(job_id) > 2 else job_id


def read_job(job_id: str, data: str | None) -> tuple[str, bytes]:
    """The message id and body a job's data carries (``data`` as Redis gave it, undecodable
    bytes escaped as lone surrogates); raises :class:`Unreadable` with the reason for data that
    is not UTF-8, not JSON (or nested too deeply), not an object, or has no message id or body
    of the expected types."""
    try:
        raw = (data or "{}").encode("utf-8")
    except UnicodeEncodeError:
        raise Unreadable(f"{UNREADABLE} is not UTF-8") from None
    try:
        doc = decode_json(raw)
    except UndecodableJson as exc:
        raise Unreadable(f"{UNREADABLE} is {exc}") from None
    if not isinstance(doc, dict):
        raise Unreadable(f"{UNREADABLE} is not a JSON object")
    message_id = doc.get("message_id") or _fallback_id(job_id)
    if not isinstance(message_id, str):
        raise Unreadable(f"{UNREADABLE}'s message_id is not a string")
    if "body_b64" in doc:
        try:
            return message_id, base64.b64decode(doc["body_b64"], validate=True)
        except (TypeError, ValueError):  # binascii.Error is a ValueError
            raise Unreadable(f"{UNREADABLE}'s body_b64 is not base64") from None
    body = doc.get("body")
    if not isinstance(body, str):
        raise Unreadable(f"{UNREADABLE} has no body (a string 'body' or 'body_b64')")
    try:
        return message_id, body.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate escaped in the JSON text
        raise Unreadable(f"{UNREADABLE}'s body is not UTF-8 text") from None


def raw_data(job_id: str, data: str | None) -> tuple[str, bytes]:
    """What a dead-letter record keeps of a job nobody can read: a message id (the data's, if it
    names one) and at most :data:`UNREADABLE_BODY_BYTES` of the data's raw bytes."""
    raw = (data or "").encode("utf-8", "surrogateescape")
    try:
        named = decode_json(raw).get("message_id")
    except (UndecodableJson, AttributeError):
        named = None
    message_id = named if isinstance(named, str) and named else _fallback_id(job_id)
    return message_id, raw[:UNREADABLE_BODY_BYTES]


def _count(value: Any) -> int:
    """A count field of a job hash, or of its options (0 when not a count)."""
    return int(value) if isinstance(value, int | str) and str(value).isdigit() else 0


class Nack(Exception):
    def __init__(self, delay_ms: int) -> None:
        super().__init__(f"{NACKED} (retry in {delay_ms} ms)")
        self.delay_ms = delay_ms


def nack_delay(attempts: int, kind: str, err: BaseException, job: Any) -> int:
    return err.delay_ms if isinstance(err, Nack) else 0


def keep_jobs(remove: Any) -> dict[str, Any]:
    """BullMQ's ``keepJobs`` for a job's ``removeOnComplete`` / ``removeOnFail`` option."""
    if isinstance(remove, bool) or remove is None:
        return {"count": 0 if remove else -1}
    if isinstance(remove, int):
        return {"count": remove}
    return dict(remove) if isinstance(remove, Mapping) else {"count": -1}


class QueueOps:
    """The keys and BullMQ scripts (bullmq-py's ``Scripts``) of one queue, worked out once."""

    def __init__(self, queue: Any) -> None:
        scripts = queue.backend.scripts
        self.scripts, self.commands = scripts, scripts.commands
        keys = scripts.keys
        self.prefix: str = keys[""]
        self.marker: str = keys["marker"]
        self.stalled: str = keys["stalled"]
        self.completed: str = keys["completed"]
        self.repeat: str = keys["repeat"]
        self.unmark: tuple[str, ...] = ("ZREM", keys["marker"], "0")
        names = ["wait", "active", "prioritized", "events", "stalled", "limiter", "delayed"]
        head = scripts.getKeys([*names, "paused", "meta", "pc"])
        self.active_keys: list[str] = [*head, keys["marker"]]
        self.finish_keys = {
            target: (
                [*head, scripts.toKey(target)],
                [scripts.toKey("metrics:" + target), keys["marker"]],
            )
            for target in ("completed", "failed")
        }
        self.add_keys: list[str] = scripts.getKeys(
            ["wait", "paused", "meta", "id", "completed", "delayed", "active", "events", "marker"]
        )
        self.delayed_keys: list[str] = scripts.getKeys(
            ["marker", "meta", "id", "delayed", "completed", "events"]
        )
        stalled = "stalled wait active stalled-check meta paused marker events repeat"
        self.stalled_keys: list[str] = scripts.getKeys(stalled.split())
        back = "active wait stalled paused meta limiter prioritized marker events"
        self.back_keys: list[str] = scripts.getKeys(back.split())
        self.move_to_active = self.commands["moveToActive"]

    def finish_call(
        self, lease: Lease, target: str, value: str, *, fetch: bool, lock_ms: int
    ) -> tuple[list[str], list[Any]]:
        """``moveToFinished`` keys and arguments (as ``Scripts.moveToFinishedArgs`` builds them)."""
        prop = "returnvalue" if target == "completed" else "failedReason"
        head, tail = self.finish_keys[target]
        opts = {
            "token": lease.token,
            "keepJobs": lease.keep_done if target == "completed" else lease.keep_failed,
            "limiter": None,
            "lockDuration": lock_ms,
            "attempts": lease.attempts,
            "attemptsMade": lease.made,
            "maxMetricsSize": "",
            "fpof": False,
            "cpof": False,
            "idof": False,
            "rdof": False,
        }
        keys = [*head, self.prefix + lease.job_id, *tail]
        args = [lease.job_id, now_ms(), prop, value, target, "1" if fetch else ""]
        return keys, [*args, self.prefix, msgpack.packb(opts, use_bin_type=True)]


class Lease:
    """A job this process holds the lock of, from ``moveToActive`` until it is settled."""

    __slots__ = (
        "attempts",
        "backoff",
        "count",
        "handed",
        "job_id",
        "keep_done",
        "keep_failed",
        "made",
        "queue",
        "stream",
        "token",
    )

    def __init__(
        self, stream: JobStream | None, job_id: str, token: str, fields: Mapping[str, str]
    ) -> None:
        self.stream, self.job_id, self.token = stream, job_id, token
        self.queue = stream.queue if stream is not None else ""
        self.count = _count(fields.get("ats")) or 1
        self.made = _count(fields.get("atm") or fields.get("attemptsMade"))
        try:
            opts = decode_json(fields.get("opts") or "{}")
        except UndecodableJson:
            opts = None
        if not isinstance(opts, dict):  # not BullMQ's: no options of its own
            opts = {}
        self.attempts = _count(opts.get("attempts"))
        self.backoff = opts.get("backoff")
        self.keep_done = keep_jobs(opts.get("removeOnComplete", False))
        self.keep_failed = keep_jobs(opts.get("removeOnFail", False))
        self.handed = False


class JobSource(Protocol):
    """What a :class:`JobStream` uses of its transport (``BullmqTransport``)."""

    redis_url: str
    prefix: str
    options: QueueOptions
    stalled_ms: int
    redis: Any  # the transport's redis.asyncio client

    @property
    def closed(self) -> bool: ...

    def ops(self, name: str) -> QueueOps:
        """Keys and scripts of queue ``name``."""
        ...

    def lease_out(self, lease: Lease) -> str:
        """Register ``lease`` as delivered, to be settled by ack or nack: its fresh receipt."""
        ...

    def leased(self, receipt: str) -> Lease | None:
        """The lease still registered under ``receipt`` (None once settled or lost)."""
        ...

    def drop_lease(self, receipt: str) -> Lease | None:
        """Unregister ``receipt`` (its lock was lost, or it is given back): its lease, if any."""
        ...

    async def dead_letter(self, lease: Lease, reason: str, *, keep: bytes | None = None) -> None:
        """Fail the job of ``lease`` into the failed set, the queue's dead letters (``keep``:
        what to keep of data nobody can read, in its place)."""
        ...

    async def give_back(self, queue: str, leases: list[Lease]) -> None:
        """Put jobs taken but never handed out back at the head of ``queue``, uncounted."""
        ...

    def stream_closed(self, stream: JobStream) -> None:
        """``stream`` closed: the transport's close need not close it."""
        ...


class _Line:
    """A Redis connection used by one task at a time: commands go out together, replies come
    back in order (an error reply is returned, not raised)."""

    def __init__(self, url: str, name: str) -> None:
        kwargs: dict[str, Any] = dict(parse_url(url))
        kind: type[Connection] = kwargs.pop("connection_class", Connection)
        # job data that is not UTF-8 arrives escaped (read_job refuses it), not as a broken reply
        self.conn = kind(
            **kwargs, decode_responses=True, encoding_errors="surrogateescape", client_name=name
        )

    async def send(self, *commands: tuple[Any, ...]) -> list[Any]:
        try:
            return await round_trip(self.conn, [pack(c) for c in commands])
        except BaseException:  # cancelled or broken mid-reply: the next call reconnects
            await self.conn.disconnect(nowait=True)
            raise

    async def close(self) -> None:
        await self.conn.disconnect(nowait=True)


class JobStream(BrokerStream):
    """One fetch loop feeding an iterator; ``aclose`` stops it (see the module docstring)."""

    def __init__(self, transport: JobSource, queue: str, prefetch: int) -> None:
        self._t, self.queue, self._prefetch = transport, queue, prefetch
        self._ops = transport.ops(queue)
        self._inbox: asyncio.Queue[Delivery | None] = asyncio.Queue()
        self._held: dict[str, Lease] = {}  # receipt -> lease: taken by this stream, unsettled
        self._taking = 0  # moveToActive / fetchNext calls under way (each may add one lease)
        self._drained = False  # moveToActive found nothing: wait on the marker
        self._block_until = 0  # when the next delayed job is due (ms), if known
        self._paused_until = 0  # a rate limit on the queue holds takes until then (ms)
        self._late: list[Lease] | None = []  # taken while closing, given back by aclose
        self._batch = 2  # moveToActive calls per round trip: doubles while all find a job
        self._wake = asyncio.Event()
        self._tokens = itertools.count(1)
        self._id = uuid.uuid4().hex
        self._line: _Line | None = None
        self._blocking: asyncio.Future[Any] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._starting: asyncio.Future[None] | None = None
        self._closed = False

    def __aiter__(self) -> JobStream:
        return self

    # -- start, fetch loop, timers ------------------------------------------------------------

    async def _start(self) -> None:
        t, ops = self._t, self._ops
        line = _Line(t.redis_url, f"{t.prefix}:{self.queue}")
        needed = [ops.move_to_active]
        await line.send(*(("SCRIPT", "LOAD", script.script) for script in needed))
        if self._closed:  # closed while starting
            await line.close()
            return
        self._line = line
        spawn = asyncio.get_running_loop().create_task
        self._tasks = [
            spawn(self._fetch_loop()),
            spawn(self._renew_loop()),
            spawn(self._stall_loop()),
        ]

    async def _fetch_loop(self) -> None:
        line = self._line
        assert line is not None
        while not self._closed:
            try:
                room = self._prefetch - len(self._held) - self._taking
                if room <= 0:
                    self._wake.clear()
                    await self._wake.wait()
                elif self._drained:
                    await self._block(line)
                elif self._paused_until > now_ms():
                    await asyncio.sleep((self._paused_until - now_ms()) / 1000)
                else:
                    await self._take(line, min(room, self._batch))
            except (RedisError, OSError, TransportError):  # Redis away: try again shortly
                if not self._closed:
                    await asyncio.sleep(RETRY_S)
            except Exception:  # never leave the stream without its loop
                log.exception("consuming %r", self.queue)
                if not self._closed:
                    await asyncio.sleep(RETRY_S)

    async def _take(self, line: _Line, n: int) -> None:
        """Up to ``n`` ``moveToActive`` calls in one round trip, each after dropping the marker's
        "jobs waiting" member (see the module docstring)."""
        ops, lock_ms = self._ops, self._t.options.visibility_ms
        script, unmark = ops.move_to_active, ops.unmark
        take = ("EVALSHA", script.sha, len(ops.active_keys), *ops.active_keys, ops.prefix)
        tokens = [f"{self._id}:{next(self._tokens)}" for _ in range(n)]
        commands: list[tuple[Any, ...]] = []
        stamp = now_ms()
        for token in tokens:
            opts = {"token": token, "lockDuration": lock_ms, "limiter": None}
            commands += [unmark, (*take, stamp, msgpack.packb(opts, use_bin_type=True))]
        self._taking += n
        taken, failed = 0, None
        try:
            replies = (await line.send(*commands))[1::2]
            for token, got in zip(tokens, replies, strict=True):
                try:
                    if isinstance(got, NoScriptError):  # Redis lost its scripts: load, go again
                        await line.send(("SCRIPT", "LOAD", script.script))
                    elif isinstance(got, Exception):
                        raise got
                    elif await self._took(got, token):
                        taken += 1
                except Exception as exc:  # the other jobs taken still count
                    failed = exc
        finally:
            self._taking -= n
        self._batch = min(self._batch * 2, MAX_BATCH) if taken == n else 2
        if failed is not None:
            raise failed

    async def _block(self, line: _Line) -> None:
        """Wait on the marker until a job is added or the next delayed one is due."""
        timeout_s, poke = DRAIN_S, None
        if self._block_until:
            timeout_s = min(max((self._block_until - now_ms()) / 1000, 0.001), DRAIN_S)
            if timeout_s < DRAIN_S:  # wake Redis when it is due: its timer ticks only every 100 ms
                loop = asyncio.get_running_loop()
                poke = loop.call_later(timeout_s + 0.002, self._poke)
        self._blocking = asyncio.ensure_future(
            line.send(("BZPOPMIN", self._ops.marker, f"{timeout_s:.3f}"))
        )
        try:
            await asyncio.wait([self._blocking])
        finally:
            if poke is not None:
                poke.cancel()
        blocked, self._blocking = self._blocking, None
        if blocked.cancelled():
            return
        (got,) = blocked.result()
        if isinstance(got, Exception):
            raise got
        if got and got[1] and float(got[2]) > now_ms():  # only a delayed job, not yet due
            self._block_until = int(float(got[2]))
            return
        self._drained, self._block_until = False, 0

    def _poke(self) -> None:
        asyncio.ensure_future(self._t.redis.ping()).add_done_callback(ignore)

    async def _took(self, got: Any, token: str) -> bool:
        """Handle a ``moveToActive`` (or ``fetchNext``) reply: a job (True), or why there is
        none."""
        if got and got[0]:
            fields = dict(zip(got[0][::2], got[0][1::2], strict=True))
            await self._accept(Lease(self, str(got[1]), token, fields), fields)
            return True
        limited_ms = int(got[2]) if got else 0
        if limited_ms > 0:  # a rate limit set on the queue (by BullMQ users): come back then
            self._paused_until = now_ms() + min(limited_ms, int(DRAIN_S * 1000))
        else:
            self._drained, self._block_until = True, int(float(got[3])) if got else 0
        return False

    async def _accept(self, lease: Lease, fields: Mapping[str, str]) -> None:
        t = self._t
        limit = t.options.limit(self.queue)
        doomed = fields.get("defa")  # BullMQ's stalled check gave up on it
        if lease.count > limit or doomed:  # its consumers keep dying: dead-letter it instead
            await t.dead_letter(lease, doomed or f"{LAPSED} on delivery {limit} of {limit}")
            return
        if self._closed:  # taken while closing: back to the queue behind those never handed out
            if self._late is not None:
                self._late.append(lease)
            else:
                await t.give_back(self.queue, [lease])
            return
        try:
            message_id, body = read_job(lease.job_id, fields.get("data"))
        except Unreadable as exc:  # nothing a consumer could read: dead-letter it at once
            _, kept = raw_data(lease.job_id, fields.get("data"))
            await t.dead_letter(lease, str(exc), keep=kept)
            return
        receipt = t.lease_out(lease)
        self._held[receipt] = lease
        self._inbox.put_nowait(Delivery(self.queue, message_id, body, lease.count, receipt))

    async def _renew_loop(self) -> None:
        t, ops = self._t, self._ops
        lock_ms = t.options.visibility_ms
        extend = ops.commands["extendLocks"]
        while not self._closed:
            await asyncio.sleep(lock_ms / 2000)
            if not self._held:
                continue
            held = list(self._held.items())
            tokens = msgpack.packb([lease.token for _, lease in held], use_bin_type=True)
            ids = msgpack.packb([lease.job_id for _, lease in held], use_bin_type=True)
            try:
                lost = set(
                    await extend(keys=[ops.stalled], args=[ops.prefix, tokens, ids, lock_ms])
                )
            except (RedisError, OSError):
                continue
            for receipt, lease in held:
                if lease.job_id in lost and self._held.pop(receipt, None) is not None:
                    if not lease.handed:  # not handed out yet: never hand it out
                        t.drop_lease(receipt)
                    self._wake.set()

    async def _stall_loop(self) -> None:
        t, ops = self._t, self._ops
        check = ops.commands["moveStalledJobsToWait"]
        limit = t.options.limit(self.queue)
        while not self._closed:  # at once, as a BullMQ worker starts, then every stalled_ms
            with contextlib.suppress(RedisError, OSError):
                await check(keys=ops.stalled_keys, args=[limit, ops.prefix, now_ms(), t.stalled_ms])
            await asyncio.sleep(t.stalled_ms / 1000)

    # -- settling (called by the transport) ---------------------------------------------------

    def settling(self, receipt: str, fetch: bool) -> bool:
        """``receipt`` is being settled: its slot is free. True (and the slot stays reserved for
        the next job) when the settling call should take the next job for this stream."""
        self._held.pop(receipt, None)
        if fetch and not self._closed and not self._drained and self._line is not None:
            self._taking += 1
            return True
        self._wake.set()
        return False

    async def settled(self, got: Any, token: str) -> None:
        """The settling call that took a slot in :meth:`settling` returned ``got``."""
        try:
            if isinstance(got, list):
                await self._took(got, token)
            elif got == 0:  # queue empty, no delayed job
                self._drained, self._block_until = True, 0
        except Exception:  # the settle itself succeeded; the job taken lapses and returns
            log.exception("taking the next job of %r", self.queue)
        finally:
            self._taking -= 1
            self._wake.set()

    # -- the iterator ---------------------------------------------------------------------------

    async def __anext__(self) -> Delivery:
        await self._started(self._t, self.queue)  # one fetch loop, however many callers
        while not self._closed:
            delivery = await self._inbox.get()
            if delivery is None:
                break
            lease = self._t.leased(delivery.receipt)
            if lease is not None:  # else its lock was lost before it was handed out
                lease.handed = True
                return delivery
        self._inbox.put_nowait(None)  # for the other callers
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """Stop consuming. Deliveries handed out stay leased until settled or lapsed; the jobs
        taken but not handed out go back to the queue, their start uncounted."""
        if self._closed:
            return
        self._closed = True
        self._t.stream_closed(self)
        unhanded: list[Lease] = []
        while not self._inbox.empty():
            pending = self._inbox.get_nowait()
            if pending is not None and (lease := self._t.drop_lease(pending.receipt)):
                unhanded.append(lease)
        self._inbox.put_nowait(None)
        self._wake.set()
        if self._blocking is not None:
            self._blocking.cancel()
        if self._starting is not None:
            with contextlib.suppress(Exception):
                await self._starting  # a start in progress sees _closed and closes its line
        if self._tasks:
            for timer in self._tasks[1:]:
                timer.cancel()
            # a take under way finishes (its jobs go back below); one that hangs is abandoned
            _, hung = await asyncio.wait(self._tasks, timeout=CLOSE_S)
            for task in hung:
                task.cancel()
        kept = [lease.job_id for lease in self._held.values() if lease.handed]
        unhanded += self._late or []
        self._late = None
        with contextlib.suppress(RedisError, OSError):
            await self._t.give_back(self.queue, unhanded)
            if kept:  # no longer renewed: the first stalled check after their locks lapse has them
                await self._t.redis.sadd(self._ops.stalled, *kept)
        if self._line is not None:
            await self._line.close()


def ignore(done: asyncio.Future[Any]) -> None:
    if not done.cancelled():
        done.exception()


def lua_source(name: str) -> str:
    """The text of one of BullMQ's Lua scripts as bullmq-py ships them."""
    return (_BULLMQ_LUA / name).read_text()
