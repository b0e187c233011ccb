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

Redis Cluster (a group made on redis-py's asyncio ``RedisCluster``): a round is split by the
master that serves each call's slot, and each master's share is one pipeline on the group's own
connection to that master, all masters at once; the ``WAIT`` barrier ends each master's share, on
that connection, so it counts that master's replicas. A script call's keys must all hash to one
slot (Accord's are hash-tagged), else it is refused at :meth:`GroupCalls.submit` with
``CROSSSLOT`` before anything is queued; a command is routed by its first argument (its key). A
``MOVED`` reply (the slot has a new master: a failover or a resharding) or ``ASK`` (a slot being
migrated) means the call was not carried out: the slot map is corrected and the call sent again
where it belongs (``ASKING`` first for ``ASK``), at most :data:`REDIRECTS` times. A connection
error or timeout fails only that master's share of the round, as above, and the slot map is read
afresh from the cluster before the next round, so once a replica has been promoted the calls go to
it. Nothing else is retried.

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
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot

try:
    import hiredis as _hiredis
except ImportError:  # pragma: no cover - depends on the installed extras
    _hiredis = None  # type: ignore[assignment]


__all__ = [
    "MAX_GROUP",
    "REDIRECTS",
    "GroupCalls",
    "ReplicaShortfall",
    "pack",
    "pack_plain",
    "round_trip",
]

MAX_GROUP = 256  # calls per pipeline
REDIRECTS = 5  # MOVED / ASK replies followed per call (a cluster), then the reply is the answer


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


_ASKING = pack_plain(("ASKING",))


@dataclass(slots=True)
class _Call:
    script: Any  # redis-py's AsyncScript (.sha and .script, the source), None for a command
    packed: bytes
    answer: asyncio.Future[Any]
    write: bool
    slot: int = -1  # a cluster: the slot of the call's keys (-1: standalone, or no key)
    ask: str = ""  # a cluster: the node an ASK reply sent this call to, for its next send only
    redirects: int = 0


def _slot(keys: Sequence[str | int | bytes]) -> int:
    """The one slot of ``keys`` (-1 for none); ``CROSSSLOT`` when they span several."""
    slots = {key_slot(k if isinstance(k, bytes) else str(k).encode("utf-8")) for k in keys}
    if len(slots) > 1:
        raise rx.ClusterCrossSlotError(
            f"CROSSSLOT keys {list(keys)!r} hash to slots {sorted(slots)}: a script call on a"
            " Redis Cluster must keep to one slot (hash-tag its keys)"
        )
    return slots.pop() if slots else -1


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
        self._cluster = isinstance(client, RedisCluster)
        self._conns: dict[str, Any] = {}  # a cluster: node name -> the group's connection to it
        self._stale = False  # a cluster: read the slot map afresh before the next round

    def submit(self, script: Any, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        """Queue one ``EVALSHA`` and return the future of its reply (raises the call's error).
        Arguments that cannot be sent raise here, before anything is queued."""
        packed = pack(("EVALSHA", script.sha, len(keys), *keys, *args))
        slot = _slot(keys) if self._cluster else -1
        return self._queue_call(script, packed, write=True, slot=slot)

    def submit_command(self, *args: str | int, write: bool = False) -> Any:
        """Queue one plain command (``GET``, ``HMGET``, ``LRANGE``; ``SET``, ``RPUSH`` with
        ``write=True``) and return the future of its reply as the server sends it: redis-py's
        reply callbacks are not applied, so this is for commands whose reply needs none."""
        slot = _slot(args[1:2]) if self._cluster else -1
        return self._queue_call(None, pack(args), write=write, slot=slot)

    def _queue_call(self, script: Any, packed: bytes, *, write: bool, slot: int = -1) -> Any:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()
        self._queue.append(_Call(script, packed, answer, write, slot))
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
        for conn in self._conns.values():
            await conn.disconnect()
        self._conns.clear()

    async def _flush(self) -> None:
        queue = self._queue
        try:
            while queue:
                group: list[_Call] = []
                while queue and len(group) < MAX_GROUP:
                    call = queue.popleft()
                    if not call.answer.done():  # a caller cancelled before the send: not sent
                        group.append(call)
                if group and self._cluster:
                    await self._send_cluster(group)
                elif group:
                    await self._send(group)
        except BaseException as exc:  # cancelled (the loop is closing): nobody is left hanging
            while queue:
                _answer(queue.popleft().answer, exc)
            raise
        finally:
            self._flusher = None

    async def _send(
        self, group: list[_Call], node: Any = None, redirected: list[_Call] | None = None
    ) -> None:
        """One round trip for ``group`` (on a cluster: ``node``'s share of a round), every call
        answered; on a cluster, calls redirected elsewhere are put in ``redirected`` instead."""
        conn = None
        try:
            try:
                async with asyncio.timeout(self._timeout):
                    conn = await (self._connection() if node is None else self._node_conn(node))
                    replies = await self._exchange(conn, group)
            except TimeoutError:
                raise rx.TimeoutError(f"no reply from Redis within {self._timeout} s") from None
        except BaseException as exc:
            conn = conn or (self._conn if node is None else self._conns.get(node.name))
            if conn is not None:
                await conn.disconnect(nowait=True)  # possibly half-read: never reuse it
            if node is not None and isinstance(exc, (rx.ConnectionError, rx.TimeoutError)):
                self._stale = True  # a master gone: its replica may take over its slots
            for call in group:
                _answer(call.answer, exc)
            if not isinstance(exc, Exception):
                raise
            return
        for call, reply in zip(group, replies, strict=True):
            answer = call.answer
            call.ask = ""
            if answer.done():
                continue
            moved = isinstance(reply, rx.AskError)  # MOVED is an AskError too
            if redirected is not None and moved and call.redirects < REDIRECTS:
                call.redirects += 1
                if isinstance(reply, rx.MovedError):
                    await self.client.nodes_manager.move_slot(reply)
                else:
                    call.ask = f"{reply.host}:{reply.port}"
                redirected.append(call)
                continue
            if isinstance(reply, (rx.ResponseError, ReplicaShortfall)):
                answer.set_exception(reply)
            else:
                answer.set_result(reply)

    async def _send_cluster(self, group: list[_Call]) -> None:
        """A round on a cluster: each master's share in its own pipeline, all at once; calls a
        ``MOVED`` or ``ASK`` sent elsewhere go again, in a round of their own."""
        while group:
            if self._stale:
                try:
                    await self.client.nodes_manager.initialize()
                    self._stale = False
                except Exception as exc:  # no node answered: the whole round fails, retryable
                    failed = rx.ConnectionError(f"the cluster's slot map was not refreshed: {exc}")
                    for call in group:
                        _answer(call.answer, failed)
                    return
            shares: dict[str, tuple[Any, list[_Call]]] = {}
            for call in group:
                try:
                    node = self._node_of(call)
                except (rx.RedisClusterException, rx.RedisError) as exc:  # slot not covered
                    self._stale = True
                    _answer(call.answer, exc)
                    continue
                shares.setdefault(node.name, (node, []))[1].append(call)
            redirected: list[_Call] = []
            await asyncio.gather(
                *(self._send(calls, node, redirected) for node, calls in shares.values())
            )
            group = redirected

    def _node_of(self, call: _Call) -> Any:
        """The node ``call`` goes to: where an ``ASK`` sent it, else its slot's master."""
        manager = self.client.nodes_manager
        if call.ask:
            node = manager.get_node(node_name=call.ask)
            if node is not None:
                return node
            self._stale = True
            raise rx.ConnectionError(f"ASK to {call.ask}, a node not in the slot map")
        if call.slot < 0:
            return self.client.get_default_node()
        return manager.get_node_from_slot(call.slot)

    async def _node_conn(self, node: Any) -> Any:
        """The group's own connection to ``node`` (made like the cluster client's, without its
        retries: a failure is answered, never retried blindly)."""
        conn = self._conns.get(node.name)
        if conn is None:
            kwargs = dict(node.connection_kwargs)
            kwargs["retry"] = Retry(NoBackoff(), 0)
            conn = self._conns[node.name] = node.connection_class(**kwargs)
            self._timeout, conn.socket_timeout = conn.socket_timeout, None
        return await self._fresh(conn)

    def _packed(self, calls: list[_Call]) -> list[bytes]:
        out: list[bytes] = []
        for call in calls:
            if call.ask:
                out.append(_ASKING)
            out.append(call.packed)
        return out

    async def _trip(self, conn: Any, calls: list[_Call], barrier: bytes | None) -> list[Any]:
        """One pipeline of ``calls`` (and the barrier, last); one reply per call, then the
        barrier's (the replies of ``ASKING`` are dropped)."""
        packed = self._packed(calls)
        replies = await round_trip(conn, [*packed, barrier] if barrier else packed)
        if len(packed) == len(calls):
            return replies
        out, n = [], 0
        for call in calls:
            n += 1 if call.ask else 0
            out.append(replies[n])
            n += 1
        return out + replies[n:]

    async def _exchange(self, conn: Any, group: list[_Call]) -> list[Any]:
        barrier = self._barrier if any(call.write for call in group) else None
        replies = await self._trip(conn, group, barrier)
        acknowledged = replies.pop() if barrier else None
        again = [n for n, reply in enumerate(replies) if isinstance(reply, rx.NoScriptError)]
        if again:
            for script in {id(group[n].script): group[n].script for n in again}.values():
                await conn.send_command("SCRIPT", "LOAD", script.script)
                await conn.read_response()  # the sha is the source's SHA-1: unchanged
            more = await self._trip(conn, [group[n] for n in again], barrier)
            if barrier:  # the calls sent again waited for replicas too
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
        return await self._fresh(conn)

    async def _fresh(self, conn: Any) -> Any:
        """``conn``, connected, and opened afresh if stale (see :meth:`_connection`)."""
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
