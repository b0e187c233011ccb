"""Coalescing deliveries for one run into one commit.

Under load, several events for the same run are often waiting at once: a worker's ``accepted``
and ``succeeded`` arrive a fraction of a millisecond apart, both join branches finish together.
Committing them one by one costs a store round trip each and makes the second wait for the
first. :class:`Mailboxes` lets the first delivery for a run become the run's *leader*: it yields
once so that deliveries already scheduled can join, then hands everything queued for the run to
``run_batch`` (which applies the events in arrival order and commits once), and repeats while
more arrived during the commit. Every delivery gets its own result (or the batch's exception).

**One member never sinks the others.** ``run_batch`` may answer a member with :class:`Failed`
instead of its result: that member's waiter gets the error and the others their results (the
engine answers so when a coalesced commit cannot be stored and it commits the members one by one,
so the good ones land and only the bad one fails).

Nothing changes for a delivery that is alone: it is a batch of one. Order is kept: a run's
events are applied in the order their deliveries reached the engine, as with per-run locks.
Events that must commit alone (a fired timer names the timer its commit removes) are submitted
with ``alone=True``: they wait for the run's lock like before and never join a batch.

**Lingering.** A batch made only of items that ``may_wait`` (the engine's: news of an attempt,
``accepted``, a heartbeat, progress, which release and dispatch nothing) waits up to
``linger_s`` for one that may not, and commits with it, while ``busy()`` says other deliveries
are in flight. Under load a worker's ``accepted`` reaches the engine a few milliseconds before
its ``succeeded`` (the worker waits for the first to be confirmed before running the handler),
too late to join by the leader's single yield; lingering makes the two one commit, which takes
a third of the commits off a run of quick tasks. One delivery at a time never lingers, so a lone
run's latency is unchanged; a decisive event never waits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Failed", "Mailboxes"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Failed:
    """A batch member's answer when it alone failed: its waiter is given ``error``."""

    error: Exception


def _unwrap(result: R | Failed) -> R:
    if isinstance(result, Failed):
        raise result.error
    return result


class _Box(list[tuple[T, "asyncio.Future[R]"]]):
    """The deliveries waiting for a run's leader, and how to wake a leader that lingers."""

    __slots__ = ("wake",)

    def __init__(self) -> None:
        super().__init__()
        self.wake: asyncio.Future[None] | None = None

    def add(self, item: T, waiter: asyncio.Future[R]) -> None:
        self.append((item, waiter))
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)


class Mailboxes(Generic[T, R]):
    def __init__(
        self,
        lock: Callable[[str], AbstractAsyncContextManager[None]],
        *,
        may_wait: Callable[[T], bool] | None = None,
        linger_s: float = 0.0,
        busy: Callable[[], bool] | None = None,
    ) -> None:
        self._lock = lock  # the per-run lock the rest of the shell (reconciler) also takes
        self._boxes: dict[str, _Box[T, R]] = {}
        # a batch of nothing but items that may wait waits up to linger_s (while busy) for one
        # that may not, and commits with it
        self._may_wait, self._linger_s, self._busy = may_wait, linger_s, busy
        self.batches = 0
        self.coalesced = 0  # deliveries that rode another delivery's commit
        self.lingered = 0  # batches that waited

    async def submit(
        self,
        key: str,
        item: T,
        run_batch: Callable[[list[T]], Awaitable[Sequence[R | Failed]]],
        *,
        alone: bool = False,
    ) -> R:
        box = self._boxes.get(key)
        if box is not None and not alone:  # a leader is at work for this run: ride along
            waiter: asyncio.Future[R] = asyncio.get_running_loop().create_future()
            box.add(item, waiter)
            self.coalesced += 1
            return await waiter
        async with self._lock(key):
            if alone:
                return _unwrap((await run_batch([item]))[0])
            box = self._boxes[key] = _Box()
            try:
                await asyncio.sleep(0)  # deliveries already scheduled for this run join now
                await self._linger(item, box)
                mine = (await self._settle(run_batch, [(item, None), *_take(box)]))[0]
                while box:  # arrived during the commit: the next batch
                    with contextlib.suppress(Exception):  # its waiters have the error
                        await self._settle(run_batch, _take(box))
                return _unwrap(mine)
            finally:
                del self._boxes[key]
                for _, waiter in box:  # only left when the leader itself was cancelled
                    if not waiter.done():
                        waiter.cancel()

    async def _linger(self, item: T, box: _Box[T, R]) -> None:
        """While every item of the batch may wait and the engine is busy, wait (up to
        ``linger_s`` in all) for one that may not."""
        may_wait, busy = self._may_wait, self._busy
        if may_wait is None or self._linger_s <= 0 or (busy is not None and not busy()):
            return
        if not may_wait(item) or not all(may_wait(queued) for queued, _ in box):
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._linger_s
        self.lingered += 1
        while (left := deadline - loop.time()) > 0:
            box.wake = loop.create_future()
            try:
                await asyncio.wait_for(box.wake, left)
            except TimeoutError:
                return
            finally:
                box.wake = None
            if not all(may_wait(queued) for queued, _ in box):
                return

    async def _settle(
        self,
        run_batch: Callable[[list[T]], Awaitable[Sequence[R | Failed]]],
        entries: list[tuple[T, asyncio.Future[R] | None]],
    ) -> Sequence[R | Failed]:
        """Run one batch and answer its waiters (``None``: the leader, who reads the returned
        results); an error reaches every waiter and is raised."""
        self.batches += 1
        try:
            results = await run_batch([item for item, _ in entries])
        except BaseException as exc:
            for _, waiter in entries:
                if waiter is not None and not waiter.done():
                    if isinstance(exc, asyncio.CancelledError):
                        waiter.cancel()
                    else:
                        waiter.set_exception(exc)
            raise
        for (_, waiter), result in zip(entries, results, strict=True):
            if waiter is not None and not waiter.done():
                if isinstance(result, Failed):
                    waiter.set_exception(result.error)
                else:
                    waiter.set_result(result)
        return results


def _take(box: _Box[T, R]) -> list[tuple[T, asyncio.Future[R] | None]]:
    """Everything queued in ``box``, which is left empty."""
    taken: list[tuple[T, asyncio.Future[R] | None]] = list(box)
    del box[:]
    return taken
