"""The distributed store: run state, history, outbox, timers and plans in Redis.

One :meth:`RedisStore.commit` is one run of ``commit-9.lua``: the fence (a commit made under a
shard lease lands only while the shard's lease still names its owner and epoch, else
:class:`~accord.errors.OwnershipLost`), then compare-and-set on the run record's version, history
append, outbox entries into the shard's stream, timer cancellations and upserts
into the shard's timer set, and the run-index update, all in one script, so they land together or
not at all (the script validates everything before its first write). Keys and the Cluster story
are in ``keys.py``; the scripts' protocols in their own headers.

- Outbox: a stream per shard with consumer group ``accord``. :meth:`claim_outbox` reads new
  entries with ``XREADGROUP`` and re-takes entries whose lease lapsed with ``XCLAIM``; leases are
  kept in the store's clock (a sorted set per shard), like every other store, so a crashed
  dispatcher's entries come back after ``lease_ms`` of store time. :meth:`outbox_done` acks and
  deletes.
- Timers: a sorted set per shard scored by ``avail_at``; claims are one atomic script.
- Claims ask every shard at once (or only the ``shards`` given), starting from a rotating shard
  (see ``_fanout.py``).
- Shards (:class:`~accord.engine.ports.Shards`, the same semantics as the memory store): each
  shard's lease is a hash in the shard's own slot (``P:{sNN}:lease``: owner, epoch, expires),
  taken, renewed and released by one script per shard (``hold-lease-1.lua``,
  ``release-lease-1.lua``), the shards of one call sent together through the call group; engine
  beats are one sorted set (``beat-1.lua``). Times are the store's clock, passed in as arguments,
  never the server's and never key expiry; lease hashes are never deleted, so an epoch never goes
  back. With ``replicas=N`` a lease taken or renewed that fewer replicas acknowledged fails the
  whole ``hold_shards`` (a retryable :class:`~accord.errors.StoreError`): a failover could
  otherwise give an epoch out twice. Beats and releases change no epoch and are answered anyway.
- Every script call (commits, claims, done-marks) and the plain reads of the engine's path
  (``load``, ``history``, plans and activations) go through the store's call group
  (``accord.adapters._redis_group``): calls made while a round trip is in flight are sent
  together as one pipeline on one connection, each still its own atomic script or command with
  its own reply or error.
- Retention: :meth:`RedisStore.prune` finds ended runs older than the cutoff through each
  shard's run index (``status`` entries are ordered oldest last) and removes each with
  ``prune-3.lua``, which checks again that the run is still ended and old enough. Before that,
  the shard's timers and pending outbox entries of the listed runs are found by a scan of that
  shard's timer payloads and outbox stream (pending work only) and removed: an ended run never
  arms a timer again, and a crash between the two steps leaves the runs for the next prune.
- Plans are immutable (``SET NX``, then compare); activations are a list per workflow; worker
  announcements a sorted set by expiry.

Open with :func:`accord.adapters.open_store` (the startup checks of ``_server.py`` run on first
use) or ``await RedisStore.connect(url)`` (checks run before it returns).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Collection, Sequence
from typing import Any

from accord.adapters import _store_rules as rules
from accord.adapters._redis_group import GroupCalls, ReplicaShortfall
from accord.adapters.clock import SystemClock
from accord.adapters.stores.redis._catalog import Catalog
from accord.adapters.stores.redis._fanout import claim_across, each_shard, list_runs
from accord.adapters.stores.redis._scripts import ScriptCode, Scripts, commit_args
from accord.adapters.stores.redis._server import (
    DEFAULT_REPLICA_WAIT_MS,
    check_server,
    open_client,
    redis_errors,
    split_url,
)
from accord.adapters.stores.redis.keys import MAX_UPDATED_AT, StoreKeys, index_prefix, order_key
from accord.engine.ports import Clock, Commit, OutboxEntry, ShardLease, StoredRun, Timer
from accord.errors import ConflictError, OwnershipLost, StoreError

__all__ = ["RedisStore"]

_BEAT_PRUNE_MS = 3_600_000  # beats lapsed this long ago are dropped from the set


def _settle(
    outcomes: list[Any], shards: list[int], *, epochs: bool, script: bool = True
) -> list[tuple[int, Any]]:
    """``(shard, reply)`` of each shard's lease call; the first error is raised. A
    :class:`ReplicaShortfall` stands for its reply where nothing epoch-bearing was written:
    always for a release (it changes no epoch), for a hold only when the script refused (0).
    A script's list reply is its ``{-5, reason}`` refusal (``script=False``: plain reads)."""
    settled, failed = [], None
    for shard, answered in zip(shards, outcomes, strict=True):
        outcome = answered
        if isinstance(answered, ReplicaShortfall) and (not epochs or answered.reply == 0):
            outcome = answered.reply
        if isinstance(outcome, BaseException):
            failed = failed or outcome
        elif script and isinstance(outcome, list):  # {-5, reason}: mis-built arguments
            failed = failed or StoreError(f"shard {shard}: the lease script refused: {outcome}")
        else:
            settled.append((shard, outcome))
    if failed is not None:
        raise failed
    return settled


class RedisStore(Catalog):
    """:class:`~accord.engine.ports.Store` on Redis 7 (see the module docstring)."""

    def __init__(
        self,
        client: Any,
        keys: StoreKeys,
        clock: Clock | None = None,
        where: str = "",
        *,
        replicas: int = 0,
        replica_wait_ms: int = DEFAULT_REPLICA_WAIT_MS,
    ) -> None:
        self.client = client
        self.keys = keys
        self.clock: Clock = clock or SystemClock()
        self.where = where
        self.replicas = replicas
        self.scripts = Scripts(client)
        # every write (commits, claims, done-marks, plans, activations, announcements) goes
        # through the group, so with replicas > 0 every write waits for them
        self.group = GroupCalls(client, replicas=replicas, wait_ms=replica_wait_ms)
        self._checked = False
        self._check_lock = asyncio.Lock()
        self._turn = 0
        self._entry_shard: dict[str, int] = {}  # outbox entry id -> shard, for outbox_done

    @classmethod
    def from_url(cls, url: str, clock: Clock | None = None) -> RedisStore:
        opts = split_url(url)
        where = opts.where  # host:port, or a cluster's startup nodes
        keys = StoreKeys(opts.prefix, opts.shards)
        client = open_client(opts.client_url)
        wait_ms = opts.replica_wait_ms
        return cls(client, keys, clock, where, replicas=opts.replicas, replica_wait_ms=wait_ms)

    @classmethod
    async def connect(cls, url: str, clock: Clock | None = None) -> RedisStore:
        """Open and run the startup checks now; :class:`StoreError` if Redis is refused."""
        try:
            store = cls.from_url(url, clock)
        except ValueError as exc:
            raise StoreError(f"store URL {url!r}: {exc}") from exc
        try:
            await store.ready()
        except BaseException:
            await store.close()
            raise
        return store

    async def ready(self) -> None:
        if not self._checked:
            async with self._check_lock:
                if not self._checked:
                    await check_server(self.client, self.keys, self.where, self.replicas)
                    self._checked = True

    async def load(self, run_id: str) -> StoredRun | None:
        await self.ready()
        try:
            key = self.keys.run(run_id).record
        except StoreError:
            return None  # a run id that cannot be stored names no run
        async with redis_errors("load"):
            version, state = await self.group.submit_command("HMGET", key, "v", "state")
        return None if version is None else StoredRun(run_id, int(version), json.loads(state))

    async def commit(self, commit: Commit) -> int:
        rules.check_commit(commit)
        keys = self.keys.run(commit.run_id)
        fence = commit.fence
        if fence is not None and fence.shard != self.keys.shard_of(commit.run_id):
            raise StoreError(
                f"commit of {commit.run_id!r}: fenced by shard {fence.shard}'s lease, but the run"
                f" is in shard {self.keys.shard_of(commit.run_id)} (a fence is its run's shard)"
            )
        args = commit_args(commit, self.clock.now_ms())
        await self.ready()
        async with redis_errors("commit"):
            try:
                reply = await self.group.submit(self.scripts.commit, keys.commit_keys(), args)
            except ReplicaShortfall as short:
                if int(short.reply[0]) > 0:
                    raise
                reply = short.reply  # refused by the script: it wrote nothing to wait for
        code = int(reply[0])
        if code > 0:
            return code
        detail = str(reply[1]) if len(reply) > 1 else ""
        run = commit.run_id
        if code == ScriptCode.RUN_EXISTS:
            raise ConflictError(f"run {run!r} already exists (expected to create it)")
        if code == ScriptCode.OWNERSHIP_LOST and fence is not None:
            raise OwnershipLost(fence.shard, fence.owner, fence.epoch)
        if code == ScriptCode.VERSION_MISMATCH:
            raise ConflictError(f"run {run!r} is not at version {commit.expected_version}")
        if code in (ScriptCode.OUTBOX_ID_TWICE, ScriptCode.OUTBOX_ID_PENDING):
            raise StoreError(f"commit failed: outbox entry id {detail!r} is not unique")
        raise StoreError(f"commit of {run!r}: the commit script refused its arguments: {detail}")

    async def history(self, run_id: str) -> list[dict[str, Any]]:
        await self.ready()
        try:
            key = self.keys.run(run_id).history
        except StoreError:
            return []
        async with redis_errors("history"):
            entries = await self.group.submit_command("LRANGE", key, 0, -1)
        return [json.loads(e) for e in entries]

    def _shard_order(self, shards: Collection[int] | None) -> list[int]:
        """Every shard (or those of ``shards``), starting from a rotating one."""
        count = self.keys.shard_count
        wanted = None if shards is None else set(rules.check_shards(list(shards), count))
        start, self._turn = self._turn, (self._turn + 1) % count
        order = [(start + n) % count for n in range(count)]
        return order if wanted is None else [n for n in order if n in wanted]

    async def claim_timers(
        self,
        now_ms: int,
        limit: int,
        owner: str,
        lease_ms: int,
        shards: Collection[int] | None = None,
    ) -> list[Timer]:
        order = self._shard_order(shards)
        await self.ready()
        script, shard_keys = self.scripts.claim_timers, self.keys.shards

        def claim(shard: int, quota: int) -> Any:
            s = shard_keys[shard]
            keys = [s.timers, s.timer_data, s.timer_owner]
            return self.group.submit(script, keys, [now_ms, now_ms + lease_ms, quota, owner])

        def timers(flat: list[str]) -> list[Timer]:
            return [
                Timer(timer_id, *json.loads(data))
                for timer_id, data in zip(flat[::2], flat[1::2], strict=True)
            ]

        async with redis_errors("claim_timers"):
            claimed = await claim_across(order, limit, claim, timers)
        return sorted((t for _, t in claimed), key=lambda t: (t.due_at_ms, t.timer_id))

    async def claim_outbox(
        self, limit: int, owner: str, lease_ms: int, shards: Collection[int] | None = None
    ) -> list[OutboxEntry]:
        order = self._shard_order(shards)
        await self.ready()
        now = self.clock.now_ms()
        script, shard_keys = self.scripts.claim_outbox, self.keys.shards

        def claim(shard: int, quota: int) -> Any:
            s = shard_keys[shard]
            keys = [s.outbox, s.outbox_lease]
            return self.group.submit(script, keys, [now, now + lease_ms, quota, owner])

        def entries(flat: list[str]) -> list[tuple[tuple[int, int], OutboxEntry]]:
            entries = []
            for n in range(0, len(flat), 6):
                sid, entry_id, run_id, topic, payload, created = flat[n : n + 6]
                ms, seq = sid.split("-")
                entry = OutboxEntry(entry_id, run_id, topic, json.loads(payload), int(created))
                entries.append(((int(ms), int(seq)), entry))
            return entries

        async with redis_errors("claim_outbox"):
            claimed = await claim_across(order, limit, claim, entries)
        if len(self._entry_shard) > 100_000:  # claims never marked done: forget, fall back
            self._entry_shard.clear()
        for shard, (_, entry) in claimed:
            self._entry_shard[entry.entry_id] = shard
        return [entry for _, (_, entry) in sorted(claimed, key=lambda c: c[1][0])]

    async def outbox_done(self, entry_ids: Sequence[str]) -> None:
        if not entry_ids:
            return
        await self.ready()
        by_shard: dict[int, list[str]] = {}
        for entry_id in entry_ids:
            shard = self._entry_shard.pop(entry_id, None)
            targets = range(self.keys.shard_count) if shard is None else (shard,)
            for n in targets:  # an id claimed elsewhere: ask every shard (unknown ids are no-ops)
                by_shard.setdefault(n, []).append(entry_id)
        async with redis_errors("outbox_done"):
            calls = []
            for shard, ids in by_shard.items():
                s = self.keys.shards[shard]
                keys = [s.outbox, s.outbox_ids, s.outbox_lease]
                calls.append(self.group.submit(self.scripts.done_outbox, keys, ids))
            await asyncio.gather(*calls)

    async def list_runs(self, limit: int = 100, **filters: str) -> list[StoredRun]:
        await self.ready()
        async with redis_errors("list_runs"):
            return await list_runs(self.client, self.keys, limit, filters)

    async def prune(self, ended_before_ms: int, limit: int) -> int:
        """Remove up to ``limit`` ended runs last committed before ``ended_before_ms`` (see
        :meth:`~accord.engine.ports.Store.prune` and the module docstring), at most
        :data:`~accord.adapters._store_rules.PRUNE_STEP` scripts per round."""
        if ended_before_ms <= 0 or limit <= 0:
            return 0
        await self.ready()
        oldest = order_key(min(ended_before_ms - 1, MAX_UPDATED_AT))
        total = 0
        async with redis_errors("prune"):
            while total < limit:
                count = min(rules.PRUNE_STEP, limit - total)
                found = await self._ended(oldest, count)
                # leftovers first: an ended run never arms a timer or queues an entry again, so
                # a crash after this sweep leaves the runs listed, and the next prune finishes
                by_shard: dict[int, set[str]] = {}
                for run_id in found:
                    by_shard.setdefault(self.keys.shard_of(run_id), set()).add(run_id)
                for shard, runs in by_shard.items():
                    await self._drop_leftovers(shard, runs)
                keys = [self.keys.run(run_id) for run_id in found]
                args = [oldest, *rules.ENDED]
                replies = await asyncio.gather(
                    *(self.group.submit(self.scripts.prune, k.prune_keys(), [k.run_id, *args])
                      for k in keys)
                )  # fmt: skip
                done = [k for k, r in zip(keys, replies, strict=True) if r == 1]
                total += len(done)
                if len(found) < count or not done:
                    break
        return total

    async def _ended(self, oldest: str, count: int) -> list[str]:
        """Up to ``count`` run ids of ended runs whose ordering key is at least ``oldest``."""
        ranges = []
        for shard in self.keys.shards:
            for status in rules.ENDED:
                prefix = index_prefix("status", status)
                low, high = "[" + prefix + oldest, "(" + prefix[:-1] + "}"
                ranges.append((prefix, self.client.zrange(
                    shard.index, low, high, bylex=True, offset=0, num=count
                )))  # fmt: skip
        pages = await asyncio.gather(*(page for _, page in ranges))
        hits = sorted(
            (m[len(prefix) : len(prefix) + 15], m[len(prefix) + 16 :])
            for (prefix, _), members in zip(ranges, pages, strict=True)
            for m in members
        )
        return [run_id for _, run_id in reversed(hits)][:count]  # the oldest first

    async def _drop_leftovers(self, shard: int, runs: set[str]) -> None:
        """Remove the timers and pending outbox entries of ``runs`` (removed) from ``shard``."""
        s = self.keys.shards[shard]
        timers = [
            timer_id
            async for timer_id, data in self.client.hscan_iter(s.timer_data, count=500)
            if json.loads(data)[0] in runs
        ]
        for n in range(0, len(timers), 500):
            ids = timers[n : n + 500]
            pipe = self.client.pipeline(transaction=True)
            pipe.zrem(s.timers, *ids).hdel(s.timer_data, *ids).hdel(s.timer_owner, *ids)
            await pipe.execute()
        entries: list[str] = []
        start = "-"
        while True:
            page = await self.client.xrange(s.outbox, min=start, max="+", count=500)
            entries += [f["e"] for _, f in page if f.get("r") in runs]
            if len(page) < 500:
                break
            start = "(" + page[-1][0]
        if entries:
            keys = [s.outbox, s.outbox_ids, s.outbox_lease]
            await self.group.submit(self.scripts.done_outbox, keys, entries)

    # -- shards (accord.engine.ports.Shards; see the module docstring) -------------------------

    @property
    def shard_count(self) -> int:
        return self.keys.shard_count

    async def beat(self, engine: str, ttl_ms: int) -> list[str]:
        await self.ready()
        now = self.clock.now_ms()
        args: list[str | int] = [engine, now, now + ttl_ms, now - _BEAT_PRUNE_MS]
        async with redis_errors("beat"):
            try:
                live = await self.group.submit(self.scripts.beat, [self.keys.engines], args)
            except ReplicaShortfall as short:  # a beat changes no epoch: its answer stands
                live = short.reply
        if not isinstance(live, list) or (live and live[0] == -5):
            raise StoreError(f"Redis beat: the beat script refused its arguments: {live}")
        return sorted(live)

    async def leave(self, engine: str) -> None:
        await self.ready()
        async with redis_errors("leave"):
            with contextlib.suppress(ReplicaShortfall):  # changes no epoch
                await self.group.submit_command("ZREM", self.keys.engines, engine, write=True)
        await self.release_shards(engine, range(self.keys.shard_count))

    async def hold_shards(self, engine: str, shards: Sequence[int], ttl_ms: int) -> dict[int, int]:
        wanted = rules.check_shards(shards, self.keys.shard_count)
        await self.ready()
        now = self.clock.now_ms()
        args: list[str | int] = [engine, now, now + ttl_ms]
        script, keys = self.scripts.hold_lease, self.keys.shards

        def hold(shard: int) -> Any:
            return self.group.submit(script, [keys[shard].lease], args)

        async with redis_errors("hold_shards"):
            outcomes = await each_shard(wanted, hold)
            settled = _settle(outcomes, wanted, epochs=True)
        return {shard: int(epoch) for shard, epoch in settled if int(epoch) > 0}

    async def release_shards(self, engine: str, shards: Sequence[int]) -> None:
        wanted = rules.check_shards(shards, self.keys.shard_count)
        await self.ready()
        args: list[str | int] = [engine, self.clock.now_ms()]
        script, keys = self.scripts.release_lease, self.keys.shards

        def release(shard: int) -> Any:
            return self.group.submit(script, [keys[shard].lease], args)

        async with redis_errors("release_shards"):
            _settle(await each_shard(wanted, release), wanted, epochs=False)

    async def shard_leases(self) -> list[ShardLease]:
        await self.ready()
        every, keys = list(range(self.keys.shard_count)), self.keys.shards

        def read(shard: int) -> Any:
            lease = keys[shard].lease
            return self.group.submit_command("HMGET", lease, "owner", "epoch", "expires")

        async with redis_errors("shard_leases"):
            rows = _settle(await each_shard(every, read), every, epochs=False, script=False)
        return [
            ShardLease(shard, owner, int(epoch), int(expires))
            for shard, (owner, epoch, expires) in rows
            if owner is not None
        ]

    async def close(self) -> None:
        await self.group.close()
        await self.client.aclose()
