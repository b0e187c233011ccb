"""The engine's background loops, and how they start and stop.

Started: the timer service, housekeeping (flush done-marks every poll, sweep stranded outbox
entries every grace period, reconcile fully every ``reconcile_every_ms``), outcome intake, and —
when a sink is configured — the telemetry consumer. A reconciliation pass runs first, so what a
crashed predecessor left behind is repaired before new work arrives. That pass is also where a
store that does not answer refuses the start; a transport that fails during it with a retryable
error (it was reached just before: the broker restarting) lets the engine start anyway, and
housekeeping runs the pass again at its next poll, until one succeeds.
Beside housekeeping, when given, the canary pass settles running canaries every
``canary_every_ms`` (:class:`accord.engine.runtime.canary.Keeper`).

Stopping is graceful, in dependency order: no new work is taken (intake is cancelled only
between two outcomes, timers and housekeeping finish their pass), then in-flight actions and
deliveries finish and commit, done-marks are flushed, and finally the owned ports close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from accord.engine.runtime.actions import ActionExecutor
from accord.engine.runtime.dispatcher import Dispatcher
from accord.engine.runtime.intake import Intake
from accord.engine.runtime.timers import TimerService
from accord.errors import StoreError, TransportError

__all__ = ["Loops"]

log = logging.getLogger("accord.engine")


class Loops:
    def __init__(
        self,
        *,
        dispatcher: Dispatcher,
        timers: TimerService,
        intake: Intake,
        executor: ActionExecutor,
        reconcile: Callable[[], Awaitable[object]],
        quiesce: Callable[[], Awaitable[object]],
        poll_ms: int,
        reconcile_every_ms: int,
        canaries: Callable[[], Awaitable[object]] | None = None,
        canary_every_ms: int = 0,
    ) -> None:
        self._dispatcher, self._timers, self._intake = dispatcher, timers, intake
        self._executor, self._reconcile, self._quiesce = executor, reconcile, quiesce
        self._poll_ms, self._reconcile_every_ms = poll_ms, reconcile_every_ms
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._intake_task: asyncio.Task[None] | None = None
        self._reconcile_due = False
        self._canaries, self._canary_every_ms = canaries, canary_every_ms

    async def start(self, *, intake: bool = True, reconcile_first: bool = True) -> None:
        self._stop.clear()
        self._reconcile_due = False
        if reconcile_first:
            try:
                await self._reconcile()
            except TransportError as exc:
                if not exc.retryable:
                    raise
                log.warning("first reconciliation deferred to housekeeping: %s", exc)
                self._reconcile_due = True
        spawn = asyncio.get_running_loop().create_task
        self._tasks = [spawn(self._timers.run(self._stop)), spawn(self._housekeeping())]
        if intake:
            self._intake_task = spawn(self._intake.run(self._stop.is_set))
        if self._dispatcher.has_sink:
            self._tasks.append(spawn(self._dispatcher.run_telemetry(self._stop)))
        if self._canaries is not None and self._canary_every_ms > 0:
            self._tasks.append(spawn(self._canary_loop(self._canaries)))

    async def _canary_loop(self, settle: Callable[[], Awaitable[object]]) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self._canary_every_ms / 1000)
            if self._stop.is_set():
                break
            try:
                await settle()
            except (StoreError, TransportError) as exc:  # away for a moment: the next pass
                if not exc.retryable:
                    log.exception("canary pass failed")
                else:
                    log.warning("canary pass deferred: %s", exc)
            except Exception:
                log.exception("canary pass failed")

    async def _housekeeping(self) -> None:
        since_sweep = since_reconcile = 0
        sweep_every = max(self._dispatcher.grace_ms, self._poll_ms, 100)
        while not self._stop.is_set():
            try:
                await self._dispatcher.flush()
                since_sweep += self._poll_ms
                since_reconcile += self._poll_ms
                if self._reconcile_due or since_reconcile >= self._reconcile_every_ms:
                    since_reconcile = since_sweep = 0
                    await self._reconcile()
                    self._reconcile_due = False
                elif since_sweep >= sweep_every:
                    since_sweep = 0
                    await self._dispatcher.sweep()
            except Exception:
                log.exception("housekeeping pass failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self._poll_ms / 1000)

    async def stop(self) -> None:
        self._stop.set()
        if self._intake_task is not None:  # it waits on the transport: cancel between items
            await self._intake.wait_idle()
            self._intake_task.cancel()
            await asyncio.gather(self._intake_task, return_exceptions=True)
            self._intake_task = None
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self._executor.wait_idle()
        await self._quiesce()
        await self._dispatcher.flush()
