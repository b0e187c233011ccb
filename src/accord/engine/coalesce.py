"""Coalescing deliveries for one run into one commit.

Under load, several events for the same run are often waiting at once: a worker's ``accepted``
and ``succeeded`` arrive a fraction of a millisecond apart, both join branches finish together.
Committing them one by one costs a store round trip each and makes the second wait for the
first. :class:`Mailboxes` lets the first delivery for a run become the run's *leader*: it yields
once so that deliveries already scheduled can join, then hands everything queued for the run to
``run_batch`` (which applies the events in arrival order and commits once), and repeats while
more arrived during the commit. Every delivery gets its own result (or the batch's exception).

Nothing changes for a delivery that is alone: it is a batch of one. Order is kept: a run's
events are applied in the order their deliveries reached the engine, as with per-run locks.
Events that must commit alone (a fired timer names the timer its commit removes) are submitted
with ``alone=True``: they wait for the run's lock like before and never join a batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Generic, TypeVar

__all__ = ["Mailboxes"]

T = TypeVar("T")
R = TypeVar("R")


class Mailboxes(Generic[T, R]):
    def __init__(self, lock: Callable[[str], AbstractAsyncContextManager[None]]) -> None:
        self._lock = lock  # the per-run lock the rest of the shell (reconciler) also takes
        self._boxes: dict[str, list[tuple[T, asyncio.Future[R]]]] = {}
        self.batches = 0
        self.coalesced = 0  # deliveries that rode another delivery's commit

    async def submit(
        self,
        key: str,
        item: T,
        run_batch: Callable[[list[T]], Awaitable[list[R]]],
        *,
        alone: bool = False,
    ) -> R:
        box = self._boxes.get(key)
        if box is not None and not alone:  # a leader is at work for this run: ride along
            waiter: asyncio.Future[R] = asyncio.get_running_loop().create_future()
            box.append((item, waiter))
            self.coalesced += 1
            return await waiter
        async with self._lock(key):
            if alone:
                return (await run_batch([item]))[0]
            box = self._boxes[key] = []
            try:
                await asyncio.sleep(0)  # deliveries already scheduled for this run join now
                batch, waiters = [item], []
                for queued, waiter in box:
                    batch.append(queued)
                    waiters.append(waiter)
                del box[:]
                mine = await self._settle(run_batch, batch, waiters)
                while box:  # arrived during the commit: the next batch
                    pending = list(box)
                    del box[:]
                    await self._settle(run_batch, [i for i, _ in pending], [w for _, w in pending])
                return mine
            finally:
                del self._boxes[key]
                for _, waiter in box:  # only left when the leader itself was cancelled
                    if not waiter.done():
                        waiter.cancel()

    async def _settle(
        self,
        run_batch: Callable[[list[T]], Awaitable[list[R]]],
        batch: list[T],
        waiters: list[asyncio.Future[R]],
    ) -> R:
        """Run one batch; the followers' waiters get their results, the first result (the
        leader's, when it is in the batch) is returned. Errors reach every waiter."""
        self.batches += 1
        offset = len(batch) - len(waiters)
        try:
            results = await run_batch(batch)
        except BaseException as exc:
            for waiter in waiters:
                if not waiter.done():
                    if isinstance(exc, asyncio.CancelledError):
                        waiter.cancel()
                    else:
                        waiter.set_exception(exc)
            if offset or isinstance(exc, asyncio.CancelledError):
                raise
            return None  # type: ignore[return-value]  # nobody reads a follower batch's result
        for waiter, result in zip(waiters, results[offset:], strict=True):
            if not waiter.done():
                waiter.set_result(result)
        return results[0]
