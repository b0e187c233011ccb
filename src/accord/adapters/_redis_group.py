"""Group calls: the Redis calls of many tasks, sent as one pipeline per round trip (used by the
Redis store and the BullMQ transport).

Every script call of the store (commits, claims, done-marks), and its plain reads on the engine's
path (run records, history, activations, plans), are queued here and answered by a flusher:
while calls are waiting and no flush is in flight, the flusher takes up to :data:`MAX_GROUP` of
them and writes them as one non-transactional pipeline, reads the replies in order and hands each
caller its own reply or its own error. A call that arrives while a flush is in flight waits for
the next one, so under concurrency one write, one wake-up on the reply and one pass of redis-py's
bookkeeping serve many calls; a lone caller sees one round trip, as before. A caller cancelled
before its call was sent is dropped from the group (nothing is sent for it); once sent, a call
runs whether or not anyone still waits.

Each script stays atomic on its own; a group is no transaction, and a call's outcome never
depends on its neighbours (a refused or failing script answers its own caller only). ``NOSCRIPT``
(a restarted server emptied its script cache) means that script did not run: the flusher loads
the script and sends the calls that met it again, on the same connection. A connection error, or
no reply within redis-py's ``socket_timeout`` (one deadline for the whole group), fails every
call of the group (the store turns it into a retryable :class:`~accord.errors.StoreError`): some
of the scripts may have run, exactly as for a single command whose reply was lost, and the
connection is dropped rather than reused half-read. Nothing is retried blindly.

Connections: at most one flush is in flight per store, on the group's own connection, made by the
client's pool with the same options but kept out of it (checking a connection out of redis-py's
pool and back costs more than a small group's round trip). Before each flush it is checked as the
pool checks its own (a connection the server closed, or holding unread data, is opened afresh).
So a store holds the pool's connections plus this one, however many tasks commit at once.

Replication barrier: a group made with ``replicas=N`` ends every round that holds a write (a
script call, or a command submitted with ``write=True``) with ``WAIT N wait_ms`` on the same
connection, which answers how many replicas have received every write made on that connection so
far. When fewer than ``N`` did within ``wait_ms``, each write of the round that the server did
carry out is answered with :class:`ReplicaShortfall` instead of its reply: it happened on the
primary, but a failover now could lose it, so it is indeterminate, exactly like a write whose
reply was lost. Reads of the round are answered as usual. One ``WAIT`` covers the whole round.

Commands are packed by hiredis when it is installed (one C call per command) and by
:func:`pack_plain` otherwise.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis import exceptions as rx

try:
    import hiredis as _hiredis
except ImportError:  # pragma: no cover - depends on the installed extras
    _hiredis = None  # type: ignore[assignment]


__all__ = ["MAX_GROUP", "GroupCalls", "ReplicaShortfall", "pack", "pack_plain", "round_trip"]

MAX_GROUP = 256  # calls per pipeline


def pack_plain(args: Sequence[str | int | float | bytes]) -> bytes:
    """One command in the Redis protocol, written as hiredis and redis-py write it (``str`` as
    UTF-8, ``int`` in decimal, ``float`` as its ``repr``)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode("utf-8")
        elif isinstance(arg, int) and not isinstance(arg, bool):
            data = b"%d" % arg
        elif isinstance(arg, float):
            data = repr(arg).encode()
        else:
            raise rx.DataError(
                f"invalid script argument {arg!r}: expected str, int, float or bytes"
            )
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def _pack_hiredis(args: Sequence[str | int | float | bytes]) -> bytes:
    try:
        packed: bytes = _hiredis.pack_command(tuple(args))  # type: ignore[arg-type]
    except TypeError as exc:
        raise rx.DataError(f"invalid script argument: {exc}") from None
    return packed


pack: Callable[[Sequence[str | int | float | bytes]], bytes] = (
    pack_plain if _hiredis is None else _pack_hiredis
)


class ReplicaShortfall(rx.RedisError):
    """A write the primary carried out, acknowledged by fewer replicas than required in time;
    ``reply`` is the server's reply to it (a script that refused its arguments wrote nothing, so
    its caller may look)."""

    def __init__(
        self, acknowledged: int, required: int, wait_ms: int, refused: str = "", reply: Any = None
    ) -> None:
        counted = (
            f"WAIT was refused ({refused})"
            if refused
            else f"{acknowledged} of the {required} replicas required acknowledged it within"
            f" {wait_ms} ms"
        )
        super().__init__(f"carried out on the primary, but {counted}: a failover could lose it")
        self.acknowledged, self.required, self.wait_ms = acknowledged, required, wait_ms
        self.reply = reply


@dataclass(slots=True)
class _Call:
    script: Any  # redis-py's AsyncScript (.sha and .script, the source), None for a command
    packed: bytes
    answer: asyncio.Future[Any]
    write: bool


class GroupCalls:
    """The queue and flusher of one store's calls (see the module docstring)."""

    def __init__(self, client: Any, *, replicas: int = 0, wait_ms: int = 1_000) -> None:
        if replicas < 0 or wait_ms < 1:
            raise ValueError(f"replicas={replicas}, wait_ms={wait_ms}: expected ≥ 0 and ≥ 1")
        self.client = client
        self.replicas, self.wait_ms = replicas, wait_ms
        self._barrier = pack(("WAIT", replicas, wait_ms)) if replicas else None
        self._queue: deque[_Call] = deque()
        self._flusher: asyncio.Task[None] | None = None
        self._conn: Any = None  # made on first use
        self._timeout: float | None = None  # redis-py's socket_timeout, for a whole group

    def submit(self, script: Any, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        """Queue one ``EVALSHA`` and return the future of its reply (raises the call's error).
        Arguments that cannot be sent raise here, before anything is queued."""
        packed = pack(("EVALSHA", script.sha, len(keys), *keys, *args))
        return self._queue_call(script, packed, write=True)

    def submit_command(self, *args: str | int, write: bool = False) -> Any:
        """Queue one plain command (``GET``, ``HMGET``, ``LRANGE``; ``SET``, ``RPUSH`` with
        ``write=True``) and return the future of its reply as the server sends it: redis-py's
        reply callbacks are not applied, so this is for commands whose reply needs none."""
        return self._queue_call(None, pack(args), write=write)

    def _queue_call(self, script: Any, packed: bytes, *, write: bool) -> Any:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()
        self._queue.append(_Call(script, packed, answer, write))
        if self._flusher is None:
            self._flusher = loop.create_task(self._flush())
        return answer

    async def call(self, script: Any, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        """:meth:`submit`, awaited."""
        return await self.submit(script, keys, args)

    async def close(self) -> None:
        """Answer every queued call, then close the group's connection."""
        while self._flusher is not None:
            await asyncio.wait([self._flusher])
        if self._conn is not None:
            await self._conn.disconnect()

    async def _flush(self) -> None:
        queue = self._queue
        try:
            while queue:
                group: list[_Call] = []
                while queue and len(group) < MAX_GROUP:
                    call = queue.popleft()
                    if not call.answer.done():  # a caller cancelled before the send: not sent
                        group.append(call)
                if group:
                    await self._send(group)
        except BaseException as exc:  # cancelled (the loop is closing): nobody is left hanging
            while queue:
                _answer(queue.popleft().answer, exc)
            raise
        finally:
            self._flusher = None

    async def _send(self, group: list[_Call]) -> None:
        try:
            try:
                async with asyncio.timeout(self._timeout):
                    replies = await self._exchange(group)
            except TimeoutError:
                raise rx.TimeoutError(f"no reply from Redis within {self._timeout} s") from None
        except BaseException as exc:
            if self._conn is not None:
                await self._conn.disconnect(nowait=True)  # possibly half-read: never reuse it
            for call in group:
                _answer(call.answer, exc)
            if not isinstance(exc, Exception):
                raise
            return
        for call, reply in zip(group, replies, strict=True):
            answer = call.answer
            if not answer.done():
                if isinstance(reply, (rx.ResponseError, ReplicaShortfall)):
                    answer.set_exception(reply)
                else:
                    answer.set_result(reply)

    async def _exchange(self, group: list[_Call]) -> list[Any]:
        conn = await self._connection()
        barrier = self._barrier if any(call.write for call in group) else None
        packed = [call.packed for call in group]
        replies = await round_trip(conn, [*packed, barrier] if barrier else packed)
        acknowledged = replies.pop() if barrier else None
        again = [n for n, reply in enumerate(replies) if isinstance(reply, rx.NoScriptError)]
        if again:
            for script in {id(group[n].script): group[n].script for n in again}.values():
                await conn.send_command("SCRIPT", "LOAD", script.script)
                await conn.read_response()  # the sha is the source's SHA-1: unchanged
            packed = [group[n].packed for n in again]
            if barrier:  # the calls sent again wait for replicas too
                packed.append(barrier)
            more = await round_trip(conn, packed)
            if barrier:
                acknowledged = more.pop()
            for n, reply in zip(again, more, strict=True):
                replies[n] = reply
        if acknowledged is not None:
            self._check_replicas(group, replies, acknowledged)
        return replies

    def _check_replicas(self, group: list[_Call], replies: list[Any], acknowledged: Any) -> None:
        """Answer the round's carried-out writes with :class:`ReplicaShortfall` when ``WAIT``
        counted fewer replicas than required (an error reply from ``WAIT`` itself too)."""
        refused = str(acknowledged) if isinstance(acknowledged, rx.ResponseError) else ""
        count = 0 if refused else int(acknowledged)
        if count >= self.replicas:
            return
        for n, call in enumerate(group):
            if call.write and not isinstance(replies[n], rx.ResponseError):
                short = ReplicaShortfall(count, self.replicas, self.wait_ms, refused, replies[n])
                replies[n] = short

    async def _connection(self) -> Any:
        """The group's own connection (made like the pool's), connected, and opened afresh if the
        server closed it or it holds data nobody asked for. (redis-py's pool skips that check when
        maintenance notifications are on, its default with RESP3, so it is made here.)"""
        conn = self._conn
        if conn is None:
            conn = self._conn = self.client.connection_pool.make_connection()
            # one deadline per group instead of a timer per read and a task per write
            self._timeout, conn.socket_timeout = conn.socket_timeout, None
        if conn.is_connected:
            try:  # can_read: redis-py 8; can_read_destructive before
                check = conn.can_read if hasattr(conn, "can_read") else conn.can_read_destructive
                stale = await check()
            except (rx.ConnectionError, OSError):
                stale = True
            if stale:
                await conn.disconnect()
        if not conn.is_connected:
            await conn.connect()
        return conn


async def round_trip(conn: Any, packed: list[bytes]) -> list[Any]:
    """Send the commands as one write and read one reply (or its error) per command."""
    await conn.send_packed_command(packed, check_health=False)
    replies: list[Any] = []
    for _ in packed:
        try:
            replies.append(await conn.read_response())
        except rx.ResponseError as exc:  # an error reply: read in full, the next one follows
            replies.append(exc)
    return replies


def _answer(answer: asyncio.Future[Any], exc: BaseException) -> None:
    """Fail ``answer`` with an exception of its own (tracebacks are per raise)."""
    if answer.done():
        return
    if isinstance(exc, asyncio.CancelledError):
        fresh: BaseException = rx.ConnectionError("the store's call group was cancelled")
    else:
        try:
            fresh = type(exc)(*exc.args)
        except Exception:
            fresh = exc
    answer.set_exception(fresh)
