"""Shard ownership: which of the store's shards this engine owns, under epoch-fenced leases.

Runs hash to a fixed number of shards (:func:`~accord.engine.ports.shard_of`, the count
recorded in the store). Each engine beats into the store every ``beat_ms`` and, from the live
engines the beat returns, computes the same assignment every other engine computes
(:func:`assign`: rendezvous hashing with bounded load, so each engine gets its even share,
``shards // engines`` or one more). It then holds the
leases of its assigned shards (:meth:`~accord.engine.ports.Shards.hold_shards`, renewing the
ones it has at the same epoch) and gives up the ones no longer assigned to it.

What owning a shard means here:

- its outcome queue (:meth:`ShardKeeper.queue`) is consumed by this engine alone, and every job
  of its runs names that queue as ``replyTo``; the shared outcome queue is consumed by every
  engine owning anything, which forwards what belongs to another owner (``intake.py``);
- its timers and stranded outbox entries are claimed, and its runs reconciled, by this engine;
- every commit of its runs carries the lease's :class:`~accord.engine.ports.Fence`, checked by
  the store in the same atomic step as the run's version. A commit refused with
  :class:`~accord.errors.OwnershipLost` makes this engine drop the shard at once (:meth:`lost`):
  nothing it did after losing the lease lands, and the delivery goes back to its queue, which
  the new owner reads. The work in hand of a shard let go (handed over, lapsed, refused) goes
  on committing under the shard's last epoch until it is done, never unfenced: it lands while
  the lease is still this engine's and is refused once another engine took the shard.

Handing a shard over is graceful when the owner is alive: it stops taking the shard's work,
lets what it holds finish (listeners are awaited), and only then releases the lease, so the next
owner's first commit meets no stale cache. An owner that dies or stalls loses the shard when its
lease lapses (``lease_ms``); another engine takes it at the next epoch. An engine that cannot
renew for ``lease_ms`` (the store away, the process stopped) drops its shards by itself before
it would commit again; its stale commits would be refused anyway.

A store that is not a :class:`~accord.engine.ports.Shards` (a wrapper in a test) gives the
engine every run, unfenced, as before shards existed: the run's version alone decides; so does
an engine that was never started (driven by hand, ``Engine.pump``), which holds no lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from accord.engine.ports import Clock, Fence, Shards, shard_of

__all__ = ["ShardKeeper", "assign", "shard_queue"]

log = logging.getLogger("accord.engine.shards")

Listener = Callable[[frozenset[int], frozenset[int]], Awaitable[None]]  # (gained, lost)


def shard_queue(base: str, shard: int, count: int) -> str:
    """The outcome queue of ``shard``: ``base`` itself when the store has one shard."""
    return base if count == 1 else f"{base}.s{shard}"


def _score(engine: str, shard: int) -> bytes:
    return hashlib.blake2b(f"{engine}\0{shard}".encode(), digest_size=8).digest()


def assign(count: int, engines: Sequence[str]) -> dict[str, frozenset[int]]:
    """Every live engine's shards: each shard, in order, goes to the engine that ranks it highest
    (rendezvous hashing) among those with room, room being ``count // engines`` shards each and
    one more for the first ``count % engines`` engines to fill up, so every engine gets its
    even share. Pure and deterministic: every engine that sees the same live set computes the
    same answer."""
    live = sorted(set(engines))
    if not live:
        return {}
    base, extra = divmod(count, len(live))
    mine: dict[str, set[int]] = {e: set() for e in live}
    for shard in range(count):
        for engine in sorted(live, key=lambda e: _score(e, shard), reverse=True):
            held = len(mine[engine])
            if held < base or (held == base and extra > 0):
                extra -= held == base
                mine[engine].add(shard)
                break
    return {e: frozenset(s) for e, s in mine.items()}


class ShardKeeper:
    def __init__(
        self,
        store: Any,
        clock: Clock,
        owner: str,
        *,
        base_queue: str,
        lease_ms: int = 10_000,
        beat_ms: int | None = None,
    ) -> None:
        self._store: Shards | None = store if isinstance(store, Shards) else None
        self.count = self._store.shard_count if self._store is not None else 1
        self.clock, self.owner, self.base_queue = clock, owner, base_queue
        self.lease_ms = lease_ms
        self.beat_ms = beat_ms or max(lease_ms // 4, 10)
        self.owned: dict[int, int] = {}  # shard -> epoch
        # shards just given up or lost whose work in hand is finishing -> their last epoch (fence)
        self._leaving: dict[int, int] = {}
        self.listeners: list[Listener] = []
        self._renewed_at: int | None = None
        self._started = False  # stepped once: from then on only owned shards are this engine's
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.live: list[str] = [owner]
        self.gained = 0  # shards taken (each takeover or first acquisition)
        self.handed_over = 0  # shards given up because another engine was assigned them
        self.lost_leases = 0  # shards lost without handing over (refused commit, lapsed lease)

    @property
    def fenced(self) -> bool:
        """Whether commits carry fences (the store keeps shard leases)."""
        return self._store is not None

    def shard(self, run_id: str) -> int:
        return shard_of(run_id, self.count)

    def queue(self, shard: int) -> str:
        return shard_queue(self.base_queue, shard, self.count)

    def reply_to(self, run_id: str) -> str | None:
        """What a job of ``run_id`` names as ``replyTo`` (None: the shared queue, one shard)."""
        return None if self.count == 1 else self.queue(self.shard(run_id))

    def owns(self, run_id: str) -> bool:
        return self._store is None or not self._started or self.shard(run_id) in self.owned

    def fence(self, run_id: str) -> Fence | None:
        """The fence of ``run_id``'s commits, or None (unfenced store, or a shard not ours). A
        shard being let go keeps its last epoch until the work in hand is done: those commits
        land while the lease is still this engine's and are refused once another took it."""
        if self._store is None:
            return None
        shard = self.shard(run_id)
        epoch = self.owned.get(shard, self._leaving.get(shard))
        return None if epoch is None else Fence(shard, self.owner, epoch)

    def claim_shards(self) -> list[int] | None:
        """The shards whose timers and outbox this engine claims (None: every one)."""
        return None if self._store is None or not self._started else sorted(self.owned)

    # -- taking and giving up --------------------------------------------------------------

    async def step(self) -> None:
        """One beat: renew, take what is assigned and free, give up what is not assigned."""
        async with self._lock:
            if self._store is None:
                if not self.owned:
                    self.owned = {0: 0}
                    await self._tell(frozenset({0}), frozenset())
                return
            await self._step(self._store)

    async def _step(self, store: Shards) -> None:
        self._started = True
        now = self.clock.now_ms()
        if self.owned and self._renewed_at is not None and now - self._renewed_at >= self.lease_ms:
            gone = dict(self.owned)  # not renewed for a lease: another may own them now
            log.warning("shard leases not renewed for %d ms: dropping %s", now - self._renewed_at,
                        sorted(gone))  # fmt: skip
            self.owned.clear()
            self.lost_leases += len(gone)
            await self._let_go(gone)
        self.live = await store.beat(self.owner, self.lease_ms)
        mine = assign(self.count, [*self.live, self.owner]).get(self.owner, frozenset())
        give = {s: e for s, e in self.owned.items() if s not in mine}
        if give:  # stop taking their work and let it finish before the next owner starts
            for shard in give:
                del self.owned[shard]
            self.handed_over += len(give)
            await self._let_go(give)
            await store.release_shards(self.owner, sorted(give))
        held = await store.hold_shards(self.owner, sorted(mine), self.lease_ms)
        self._renewed_at = now
        changed = frozenset(s for s, e in held.items() if s in self.owned and self.owned[s] != e)
        dropped = frozenset(s for s in self.owned if s not in held) | changed
        lost = {s: self.owned.pop(s) for s in dropped}
        self.lost_leases += len(lost)
        if lost:  # the lease lapsed while this beat was on its way: another engine took them
            log.warning("engine %s lost shard(s) %s: its lease lapsed before the renewal",
                        self.owner, sorted(lost))  # fmt: skip
            await self._let_go(lost)
        gained = frozenset(s for s in held if s not in self.owned)
        self.owned.update(held)
        self.gained += len(gained)
        if gained:
            log.info("engine %s took shard(s) %s", self.owner, sorted(gained))
            await self._tell(gained, frozenset())

    def lost(self, shard: int, epoch: int) -> None:
        """A commit under ``shard``'s lease at ``epoch`` was refused: the shard is not ours."""
        if self.owned.get(shard) != epoch:
            return  # already dropped (or taken again at another epoch)
        del self.owned[shard]
        self._leaving[shard] = epoch  # at once: what is in hand commits fenced, and is refused
        self.lost_leases += 1
        log.warning("engine %s lost shard %d (epoch %d): another engine owns it", self.owner,
                    shard, epoch)  # fmt: skip
        asyncio.get_running_loop().create_task(self._told({shard: epoch}))

    async def _told(self, lost: dict[int, int]) -> None:
        async with self._lock:
            await self._let_go(lost)

    async def _let_go(self, shards: dict[int, int]) -> None:
        """Tell the listeners ``shards`` (shard → last epoch) are no longer this engine's; they
        return once the work they held of them is done, and until then its commits still carry
        the last epoch (:meth:`fence`), never none: nothing of it lands under another owner."""
        self._leaving.update(shards)
        try:
            await self._tell(frozenset(), frozenset(shards))
        finally:
            for shard, epoch in shards.items():
                if self._leaving.get(shard) == epoch:
                    del self._leaving[shard]

    async def _tell(self, gained: frozenset[int], lost: frozenset[int]) -> None:
        for listen in self.listeners:
            try:
                await listen(gained, lost)
            except Exception:
                log.exception("shard listener failed (gained %s, lost %s)", sorted(gained),
                              sorted(lost))  # fmt: skip

    # -- the loop --------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._stop.clear()
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.beat_ms / 1000)
            if self._stop.is_set():
                break
            try:
                await self.step()
            except Exception as exc:  # the store away: the next beat tries again
                log.warning("shard beat failed: %s", exc)

    async def stop(self, *, leave: bool = True) -> None:
        """Stop beating; with ``leave``, give every lease up so others take them at once."""
        if self._task is not None:
            self._stop.set()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        async with self._lock:
            if self.owned:
                gone = dict(self.owned)
                self.owned.clear()
                await self._let_go(gone)
            if leave and self._store is not None:
                try:
                    await self._store.leave(self.owner)
                except Exception as exc:  # the leases lapse by themselves
                    log.warning("could not leave the store's engines: %s", exc)
