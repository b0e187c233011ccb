"""Per-process bookkeeping of runs: a small version-tagged cache and per-run locks.

The cache saves a store read per transition: the shell keeps the record and version it last
committed, and commits against that version. It is only ever a guess: if another engine
process moved the run on, the compare-and-set fails and the shell reloads (so a stale entry
costs one retry, never correctness). Terminal runs are dropped; the oldest entries go first.

The locks keep deliveries for one run in this process in arrival order, so the processes'
compare-and-set only arbitrates between processes. A lock's entry lives while anyone holds or
waits for it: replacing a just-released lock that still has waiters would let two deliveries
for one run interleave.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable

from accord.engine.machine.state import RunState

__all__ = ["RunCache"]


class RunCache:
    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._runs: OrderedDict[str, tuple[int, RunState]] = OrderedDict()
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    def get(self, run_id: str) -> tuple[int, RunState] | None:
        return self._runs.get(run_id)

    def remember(self, run_id: str, version: int, run: RunState) -> None:
        if run.terminal:
            self._runs.pop(run_id, None)
            return
        self._runs[run_id] = (version, run)
        self._runs.move_to_end(run_id)
        if len(self._runs) > self._size:
            self._runs.popitem(last=False)

    def forget(self, run_id: str) -> None:
        self._runs.pop(run_id, None)

    def forget_where(self, doomed: Callable[[str], bool]) -> None:
        """Forget every cached run whose id ``doomed`` picks (a shard given up)."""
        for run_id in [r for r in self._runs if doomed(r)]:
            del self._runs[run_id]

    def clear(self) -> None:
        self._runs.clear()

    @contextlib.asynccontextmanager
    async def lock(self, run_id: str) -> AsyncIterator[None]:
        entry = self._locks.get(run_id)
        if entry is None:
            entry = self._locks[run_id] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._locks[run_id]
