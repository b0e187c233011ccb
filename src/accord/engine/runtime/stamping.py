"""Stamping events: the two inputs the pure machine must never produce itself.

Every event gets ``at_ms`` (when the shell observed it) and ``entropy`` (fresh random hex) before
:func:`~accord.engine.machine.apply` sees it. Fences and retry jitter are drawn from the entropy,
so they are unguessable and never repeat (I3), while replaying the recorded events reproduces the
run exactly (I12). An event that already carries both (a recorded one) is left as it is.

Entropy comes from ``os.urandom`` — the source :mod:`secrets` uses — read in 4 KiB slices: one
system call per 256 events instead of one per event. A forked child starts with an empty pool, so
parent and child never hand out the same bytes.
"""

from __future__ import annotations

import os
from dataclasses import replace

from accord.engine.machine.events import Event

__all__ = ["ENTROPY", "Entropy", "stamp"]


class Entropy:
    def __init__(self) -> None:
        self._pool, self._at = b"", 0
        os.register_at_fork(after_in_child=self.reset)

    def reset(self) -> None:
        self._pool, self._at = b"", 0

    def draw(self) -> str:
        """32 fresh hex digits (128 random bits)."""
        if self._at + 16 > len(self._pool):
            self._pool, self._at = os.urandom(4096), 0
        self._at += 16
        return self._pool[self._at - 16 : self._at].hex()


ENTROPY = Entropy()


def stamp(event: Event, now_ms: int) -> Event:
    if event.at_ms and event.entropy:
        return event
    return replace(event, at_ms=event.at_ms or now_ms, entropy=event.entropy or ENTROPY.draw())
