"""Replay: fold a run's recorded history from nothing (I12).

The machine is pure and every input it used — time, entropy, the event itself — is in the
history entry, so applying the recorded events in order to an empty run rebuilds the stored record
exactly, rejections included (a rejection still advances ``seq``). Replay also checks that each
event is accepted or refused as it was when recorded; a different verdict means the stored history
and this engine disagree, which the reconciler reports as divergence rather than guessing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from accord.engine.machine import apply
from accord.engine.machine.events import event_from_json
from accord.engine.machine.state import HistoryEntry, RunState
from accord.errors import EngineError
from accord.workflow.plan import Plan

__all__ = ["ReplayDivergence", "replay"]


class ReplayDivergence(EngineError):
    """The recorded history does not replay to the same verdicts."""

    def __init__(self, seq: int, message: str) -> None:
        self.seq = seq
        super().__init__(f"history entry {seq}: {message}")


def replay(plan: Plan, history: Sequence[HistoryEntry | Mapping[str, Any]]) -> RunState | None:
    """The run record that ``history`` produces; ``None`` for an empty history."""
    run: RunState | None = None
    for item in history:
        entry = item if isinstance(item, HistoryEntry) else HistoryEntry.from_json(item)
        transition = apply(plan, run, event_from_json(entry.event))
        (got,) = transition.history
        if got.seq != entry.seq or got.accepted != entry.accepted or got.reason != entry.reason:
            raise ReplayDivergence(
                entry.seq,
                f"recorded seq={entry.seq} accepted={entry.accepted} reason={entry.reason}, "
                f"replayed seq={got.seq} accepted={got.accepted} reason={got.reason}",
            )
        run = transition.run
    return run
