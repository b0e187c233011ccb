"""The in-process store: the SQLite store's semantics over dicts, for tests and the testing API.

Every value is kept as canonical JSON text and parsed on the way out, exactly as the SQLite store
does, so a caller can never mutate stored state through a returned object and a value that is not
JSON is refused the same way. A commit is validated in full before anything is touched, then
applied without an ``await`` in between: it lands entirely or not at all. Leases use the same
``avail_at`` rule as the SQLite store (claimable when ``avail_at <= now``).

Shards (:class:`~accord.engine.ports.Shards`): ``shard_count`` is given at construction (1 by
default); engine beats and shard leases are dicts, on the store's clock.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from accord.adapters import _store_rules as rules
from accord.adapters.clock import SystemClock
from accord.engine.ports import (
    Clock,
    Commit,
    OutboxEntry,
    ShardLease,
    StoredRun,
    Timer,
    shard_of,
)
from accord.errors import ConflictError, ImmutableArtefactError, OwnershipLost, StoreError

__all__ = ["MemoryStore"]


@dataclass(slots=True)
class _Run:
    version: int
    state: str
    columns: dict[str, str | None]
    labels: dict[str, str]
    updated_at: int
    history: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Leased:
    """An outbox entry or a timer plus its lease; ``order`` breaks ``avail_at`` ties."""

    item: tuple[Any, ...]  # (id, run_id, topic-or-due, payload text, created_at?)
    avail_at: int
    order: int
    owner: str | None = None


class MemoryStore:
    """:class:`~accord.engine.ports.Store` in process memory (see the module docstring)."""

    def __init__(self, clock: Clock | None = None, *, shards: int = 1) -> None:
        if not 1 <= shards <= rules.MAX_SHARDS:
            raise ValueError(f"shards must be from 1 to {rules.MAX_SHARDS}, not {shards}")
        self.clock: Clock = clock or SystemClock()
        self._shard_count = shards
        self._engines: dict[str, int] = {}  # engine id -> beat expiry
        self._leases: dict[int, ShardLease] = {}
        self._lock = asyncio.Lock()
        self._runs: dict[str, _Run] = {}
        self._outbox: dict[str, _Leased] = {}
        self._timers: dict[str, _Leased] = {}
        self._plans: dict[str, str] = {}
        self._activations: dict[str, list[tuple[str, int]]] = {}
        self._capabilities: dict[str, tuple[tuple[str, ...], int]] = {}
        self._order = itertools.count()

    @classmethod
    def from_url(cls, url: str, clock: Clock | None = None) -> MemoryStore:
        """``memory://`` or ``memory://?shards=N``."""
        options = dict(parse_qsl(urlsplit(url).query, keep_blank_values=True))
        unknown = sorted(set(options) - {"shards"})
        if unknown:
            raise ValueError(f"unknown option(s) {unknown}; known: ['shards']")
        return cls(clock, shards=rules.shard_count_option(options, 1))

    async def load(self, run_id: str) -> StoredRun | None:
        run = self._runs.get(run_id)
        return None if run is None else StoredRun(run_id, run.version, json.loads(run.state))

    async def commit(self, commit: Commit) -> int:
        encoded = rules.encode_commit(commit, self.clock.now_ms())
        state, history = encoded.state, encoded.history
        outbox, timers = encoded.outbox, encoded.timers
        cols, labels, updated_at = encoded.columns, encoded.labels, encoded.updated_at
        async with self._lock:
            fence = commit.fence
            if fence is not None:
                held = self._leases.get(fence.shard)
                if held is None or (held.owner, held.epoch) != (fence.owner, fence.epoch):
                    raise OwnershipLost(fence.shard, fence.owner, fence.epoch)
            run = self._runs.get(commit.run_id)
            if commit.expected_version == 0 and run is not None:
                raise ConflictError(f"run {commit.run_id!r} already exists (expected to create it)")
            if commit.expected_version and (run is None or run.version != commit.expected_version):
                raise ConflictError(
                    f"run {commit.run_id!r} is not at version {commit.expected_version}"
                )
            ids = [o[0] for o in outbox]
            duplicate = next(
                (i for n, i in enumerate(ids) if i in self._outbox or i in ids[:n]), None
            )
            if duplicate is not None:
                raise StoreError(f"commit failed: outbox entry id {duplicate!r} is not unique")
            # validated: from here on nothing can fail, so the commit lands whole
            if run is None:
                run = _Run(0, state, dict(zip(rules.COLUMNS, cols, strict=True)), {}, updated_at)
                self._runs[commit.run_id] = run
            run.version += 1
            run.state = state
            run.history.extend(history)
            run.updated_at = updated_at
            run.columns.update(
                {k: v for k, v in zip(rules.COLUMNS, cols, strict=True) if v is not None}
            )
            run.labels.update(labels)
            for entry in outbox:
                self._outbox[entry[0]] = _Leased(entry, 0, next(self._order))
            for timer_id in commit.timers_cancel:
                self._timers.pop(timer_id, None)
            for timer in timers:
                self._timers[timer[0]] = _Leased(timer, timer[2], next(self._order))
            return run.version

    async def history(self, run_id: str) -> list[dict[str, Any]]:
        run = self._runs.get(run_id)
        return [] if run is None else [json.loads(h) for h in run.history]

    def _claim(
        self,
        rows: dict[str, _Leased],
        now: int,
        limit: int,
        owner: str,
        lease_ms: int,
        *,
        shards: Collection[int] | None,
    ) -> list[_Leased]:
        count, wanted = self._shard_count, None if shards is None else set(shards)
        due = sorted(
            (
                r
                for r in rows.values()
                if r.avail_at <= now and (wanted is None or shard_of(r.item[1], count) in wanted)
            ),
            key=lambda r: (r.avail_at, r.order),
        )
        for row in due[:limit]:
            row.avail_at, row.owner = now + lease_ms, owner
        return due[:limit]

    async def claim_timers(
        self,
        now_ms: int,
        limit: int,
        owner: str,
        lease_ms: int,
        shards: Collection[int] | None = None,
    ) -> list[Timer]:
        async with self._lock:
            claimed = self._claim(self._timers, now_ms, limit, owner, lease_ms, shards=shards)
        timers = [Timer(i[0], i[1], i[2], json.loads(i[3])) for i in (r.item for r in claimed)]
        return sorted(timers, key=lambda t: (t.due_at_ms, t.timer_id))

    async def claim_outbox(
        self, limit: int, owner: str, lease_ms: int, shards: Collection[int] | None = None
    ) -> list[OutboxEntry]:
        async with self._lock:
            now = self.clock.now_ms()
            claimed = self._claim(self._outbox, now, limit, owner, lease_ms, shards=shards)
        claimed.sort(key=lambda r: r.order)
        return [
            OutboxEntry(i[0], i[1], i[2], json.loads(i[3]), i[4]) for i in (r.item for r in claimed)
        ]

    async def outbox_done(self, entry_ids: Sequence[str]) -> None:
        for entry_id in entry_ids:
            self._outbox.pop(entry_id, None)

    async def list_runs(self, limit: int = 100, **filters: str) -> list[StoredRun]:
        hits = [
            (-run.updated_at, run_id, run)
            for run_id, run in self._runs.items()
            if rules.matches(run.columns, run.labels, **filters)
        ]
        hits.sort(key=lambda h: (h[0], h[1]))
        return [StoredRun(rid, run.version, json.loads(run.state)) for _, rid, run in hits[:limit]]

    async def prune(self, ended_before_ms: int, limit: int) -> int:
        """Remove up to ``limit`` ended runs last committed before ``ended_before_ms`` (see
        :meth:`~accord.engine.ports.Store.prune`), :data:`~accord.adapters._store_rules.PRUNE_STEP`
        at a time, yielding to the loop between steps."""
        removed = 0
        while removed < limit:
            async with self._lock:
                ended = sorted(
                    (run.updated_at, run_id)
                    for run_id, run in self._runs.items()
                    if run.columns.get("status") in rules.ENDED and run.updated_at < ended_before_ms
                )[: min(rules.PRUNE_STEP, limit - removed)]
                gone = {run_id for _, run_id in ended}
                for run_id in gone:
                    del self._runs[run_id]
                for rows in (self._timers, self._outbox):
                    for item_id in [i for i, row in rows.items() if row.item[1] in gone]:
                        del rows[item_id]
            removed += len(gone)
            if len(gone) < rules.PRUNE_STEP:
                break
            await asyncio.sleep(0)
        return removed

    async def put_plan(self, digest: str, document: dict[str, Any]) -> None:
        text = rules.dump(document, "plan")
        known = self._plans.setdefault(digest, text)
        if known != text:
            raise ImmutableArtefactError(rules.plan_changed(digest))

    async def get_plan(self, digest: str) -> dict[str, Any] | None:
        text = self._plans.get(digest)
        return None if text is None else dict(json.loads(text))

    async def set_active(self, workflow: str, digest: str) -> None:
        if digest not in self._plans:
            raise StoreError(rules.unknown_plan(workflow, digest))
        self._activations.setdefault(workflow, []).append((digest, self.clock.now_ms()))

    async def get_active(self, workflow: str) -> str | None:
        rows = self._activations.get(workflow)
        return rows[-1][0] if rows else None

    async def plan_versions(self, workflow: str) -> list[dict[str, Any]]:
        """Every activation of ``workflow``, oldest first (see ``SqliteStore.plan_versions``)."""
        return rules.activation_rows(list(self._activations.get(workflow, [])))

    async def announce(
        self, worker_id: str, capabilities: Sequence[str], expires_at_ms: int
    ) -> None:
        self._capabilities[worker_id] = (tuple(dict.fromkeys(capabilities)), expires_at_ms)

    async def live_capabilities(self, now_ms: int) -> dict[str, list[str]]:
        live: dict[str, list[str]] = {}
        for worker_id, (caps, expires_at) in sorted(self._capabilities.items()):
            if expires_at > now_ms:
                for capability in caps:
                    live.setdefault(capability, []).append(worker_id)
        return dict(sorted(live.items()))

    # -- shards (accord.engine.ports.Shards) ------------------------------------------------

    @property
    def shard_count(self) -> int:
        return self._shard_count

    async def beat(self, engine: str, ttl_ms: int) -> list[str]:
        now = self.clock.now_ms()
        self._engines[engine] = now + ttl_ms
        return sorted(e for e, until in self._engines.items() if until > now)

    async def leave(self, engine: str) -> None:
        self._engines.pop(engine, None)
        await self.release_shards(engine, list(self._leases))

    async def hold_shards(self, engine: str, shards: Sequence[int], ttl_ms: int) -> dict[int, int]:
        now, held = self.clock.now_ms(), {}
        for shard in rules.check_shards(shards, self._shard_count):
            lease = self._leases.get(shard)
            if lease is not None and lease.expires_at_ms > now and lease.owner != engine:
                continue
            mine = lease is not None and lease.owner == engine and lease.expires_at_ms > now
            epoch = lease.epoch if mine and lease else (lease.epoch + 1 if lease else 1)
            self._leases[shard] = ShardLease(shard, engine, epoch, now + ttl_ms)
            held[shard] = epoch
        return held

    async def release_shards(self, engine: str, shards: Sequence[int]) -> None:
        now = self.clock.now_ms()
        for shard in shards:
            lease = self._leases.get(shard)
            if lease is not None and lease.owner == engine and lease.expires_at_ms > now:
                self._leases[shard] = ShardLease(shard, engine, lease.epoch, now)

    async def shard_leases(self) -> list[ShardLease]:
        return [self._leases[s] for s in sorted(self._leases)]

    async def close(self) -> None:
        return None
