"""History retention: ended runs are removed from the store once they are old enough.

A run's history grows with every event it sees, and an ended run still sees some (late or forged
outcomes are recorded as refusals, a bounded number per attempt). What bounds the store as a
whole is retention: a run that ended (``completed``, ``failed`` or ``cancelled``) and saw no
commit for ``retention_ms`` is removed with its history (:meth:`~accord.engine.ports.Store.prune`).
A live run is never removed, however old.

:class:`Retention` is the engine's background loop: every ``every_ms`` it prunes, in batches of
``batch`` runs with a pause between them, until nothing older than the cutoff is left; so a large
backlog (retention switched on for an old store) is worked off without holding the store, and
several engine processes pruning at once only share the work (a prune is idempotent). A failing
pass is logged on one line and tried again at the next interval.

:func:`parse_duration` reads the durations the command line takes (``30d``, ``12h``, ``15m``,
``45s``, ``500ms``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re

from accord.engine.ports import Clock, Store

__all__ = ["DEFAULT_RETENTION_MS", "Retention", "parse_duration", "prune_all"]

log = logging.getLogger("accord.engine.retention")

DAY_MS = 86_400_000
DEFAULT_RETENTION_MS = 30 * DAY_MS
BATCH = 500  # runs per prune call
PAUSE_MS = 10  # between two batches of one pass: other work gets the store in between
_UNITS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": DAY_MS, "w": 7 * DAY_MS}
_DURATION = re.compile(r"(\d{1,12})(ms|s|m|h|d|w)\Z")


def parse_duration(text: str) -> int:
    """Milliseconds of ``text`` (a whole number and a unit: ``ms``, ``s``, ``m``, ``h``, ``d``,
    ``w``); ``ValueError`` saying what is expected otherwise."""
    match = _DURATION.match(text.strip().lower())
    if match is None:
        raise ValueError(
            f"duration {text!r}: expected a whole number and a unit (ms, s, m, h, d, w),"
            " e.g. 30d, 12h, 15m"
        )
    return int(match.group(1)) * _UNITS[match.group(2)]


async def prune_all(
    store: Store,
    ended_before_ms: int,
    *,
    batch: int = BATCH,
    pause_ms: int = PAUSE_MS,
    stop: asyncio.Event | None = None,
) -> int:
    """Prune every ended run last committed before ``ended_before_ms``, ``batch`` at a time
    (until ``stop`` is set, if given); returns how many were removed."""
    total = 0
    while True:
        removed = await store.prune(ended_before_ms, batch)
        total += removed
        if removed < batch or (stop is not None and stop.is_set()):
            return total
        await asyncio.sleep(pause_ms / 1000)


class Retention:
    """The background prune loop of one engine (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        retention_ms: int,
        *,
        every_ms: int = 3_600_000,
        batch: int = BATCH,
    ) -> None:
        if retention_ms <= 0:
            raise ValueError("Retention: retention_ms must be positive (0 or None keeps forever)")
        self._store, self._clock = store, clock
        self.retention_ms, self.every_ms, self.batch = retention_ms, max(every_ms, 1), batch
        self.pruned = 0  # runs removed by this process

    async def run_once(self, stop: asyncio.Event | None = None) -> int:
        """One pass: every ended run older than the retention period goes (a pass cut short by
        ``stop`` is finished by the next one)."""
        cutoff = self._clock.now_ms() - self.retention_ms
        removed = await prune_all(self._store, cutoff, batch=self.batch, stop=stop)
        self.pruned += removed
        if removed:
            log.info("retention: removed %d ended runs last changed before %d", removed, cutoff)
        return removed

    async def run(self, stop: asyncio.Event) -> None:
        """A pass now, then one every ``every_ms``, until ``stop`` is set."""
        while not stop.is_set():
            try:
                await self.run_once(stop)
            except Exception as exc:  # the store is away: try again at the next interval
                why = " ".join(str(exc).split()) or type(exc).__name__
                log.warning("retention pass failed: %s", why)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every_ms / 1000)
