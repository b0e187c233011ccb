"""Replay: fold a run's recorded history from nothing (I12).

The machine is pure and every input it used — time, entropy, the event itself — is in the
history entry, so applying the recorded events in order to an empty run rebuilds the stored record
exactly, rejections included (a rejection still advances ``seq``). Replay also checks that each
event is accepted or refused as it was when recorded; a different verdict means the stored history
and this engine disagree, which the reconciler reports as divergence rather than guessing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from accord.engine.machine import apply
from accord.engine.machine.events import event_from_json
from accord.engine.machine.state import HistoryEntry, RunState
from accord.errors import EngineError
from accord.workflow.plan import Plan

__all__ = ["ReplayDivergence", "replay", "replay_across"]


class ReplayDivergence(EngineError):
    """The recorded history does not replay to the same verdicts."""

    def __init__(self, seq: int, message: str) -> None:
        self.seq = seq
        super().__init__(f"history entry {seq}: {message}")


def replay(plan: Plan, history: Sequence[HistoryEntry | Mapping[str, Any]]) -> RunState | None:
    """The run record that ``history`` produces; ``None`` for an empty history."""
    return _fold(lambda _run, _event: plan, history)


def replay_across(
    plans: Mapping[str, Plan], history: Sequence[HistoryEntry | Mapping[str, Any]]
) -> RunState | None:
    """:func:`replay` for a run that may have migrated: each event is applied with the plan the
    run is pinned to at that point, looked up in ``plans`` by digest (every version the run has
    been on must be there)."""

    def plan_at(run: RunState | None, event: Mapping[str, Any]) -> Plan:
        digest = run.plan_digest if run is not None else str(event.get("plan_digest", ""))
        found = plans.get(digest)
        if found is None:
            raise EngineError(f"plan {digest} is not among the plans")
        return found

    return _fold(plan_at, history)


def _fold(
    plan_at: Callable[[RunState | None, Mapping[str, Any]], Plan],
    history: Sequence[HistoryEntry | Mapping[str, Any]],
) -> RunState | None:
    run: RunState | None = None
    for item in history:
        entry = item if isinstance(item, HistoryEntry) else HistoryEntry.from_json(item)
        try:
            plan = plan_at(run, entry.event)
        except EngineError as exc:
            raise EngineError(f"history entry {entry.seq}: {exc}") from None
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
