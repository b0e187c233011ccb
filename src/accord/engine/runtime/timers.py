"""The timer service: due timers become ``TimerFired`` events (I6).

Timers are durable rows written by the same commit as the transition that armed them (queue,
execution, heartbeat, run and retry clocks). :meth:`Store.claim_timers` leases due timers to one
owner, so with several engine processes each timer has one claimant at a time; the commit of the
transition the firing causes removes the timer (the orchestrator adds that removal even when the
machine records the firing as a stale no-op). If the claimant dies first, the lease lapses and
another process fires it: a timer that passed while every engine was down fires at the next
claim, and a double firing is recorded by the machine as a no-op for an already-fenced attempt.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from accord.engine.machine.events import Event, TimerFired, TimerKind
from accord.engine.ports import Clock, JsonValue, Store, Timer
from accord.errors import EngineError

__all__ = ["TimerService", "event_for"]

log = logging.getLogger("accord.engine.runtime.timers")


_KINDS: dict[JsonValue, TimerKind] = {
    "queue": "queue",
    "execution": "execution",
    "heartbeat": "heartbeat",
    "run": "run",
    "retry": "retry",
    "approval": "approval",
}


def event_for(timer: Timer) -> TimerFired:
    p = timer.payload
    kind = _KINDS.get(p.get("timer", "run"))
    attempt = p.get("attempt", 0)
    if kind is None or not isinstance(attempt, int):
        raise EngineError(f"timer {timer.timer_id} of run {timer.run_id}: unreadable payload {p}")
    return TimerFired(
        run_id=timer.run_id,
        timer=kind,
        timer_id=timer.timer_id,
        stage=str(p.get("stage", "")),
        attempt=attempt,
        fence=str(p.get("fence", "")),
    )


class TimerService:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        deliver: Callable[[Event], Awaitable[object]],
        *,
        owner: str,
        lease_ms: int = 30_000,
        batch: int = 200,
        poll_ms: int = 50,
        shards: Callable[[], list[int] | None] = lambda: None,
    ) -> None:
        self._store, self._clock, self._deliver = store, clock, deliver
        self._shards = shards  # whose timers this engine claims (None: every shard's)
        self._owner, self._lease_ms, self._batch, self._poll_ms = owner, lease_ms, batch, poll_ms
        self.fired = 0

    async def fire_due(self) -> int:
        """Claim and fire every timer due now; returns how many fired."""
        total = 0
        while True:
            shards = self._shards()
            if shards is not None and not shards:
                break  # owns nothing: another engine fires them
            claimed = await self._store.claim_timers(
                self._clock.now_ms(), self._batch, self._owner, self._lease_ms, shards=shards
            )
            for timer in claimed:
                try:
                    await self._deliver(event_for(timer))
                    total += 1
                except Exception:  # lease lapses and the timer fires again later
                    log.exception("firing timer %s failed", timer.timer_id)
            if len(claimed) < self._batch:
                break
        self.fired += total
        return total

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.fire_due()
            except Exception:
                log.exception("timer claim failed")
            await _sleep_or_stop(self._clock, self._poll_ms, stop)


async def _sleep_or_stop(clock: Clock, ms: int, stop: asyncio.Event) -> None:
    sleeper = asyncio.ensure_future(clock.sleep(ms))
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        sleeper.cancel()
        stopper.cancel()
