"""Explaining a run from its history alone: one plain line per recorded event.

The history is the run's whole story (accepted and refused events, in order), so an operator's
question "why is this run failed?" is answered by reading it, never by guessing from logs. This
module is pure: it formats history entries; it decides nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from accord.engine.machine.finalise import needs_reconciliation
from accord.engine.machine.state import HistoryEntry, RunState

__all__ = ["describe_event", "explain_history", "reconciliation"]


def reconciliation(run: RunState) -> list[str]:
    """One line per completed stage whose compensation did not succeed after its retries: the
    effect it made may still stand, and someone must reconcile it."""
    lines = []
    for name in needs_reconciliation(run.stages, run.compensations):
        comp = run.stages[f"@compensate/{name}"]
        code = (comp.error or {}).get("code", comp.status)
        lines.append(
            f"needs reconciliation: the compensation of {name!r} ended {comp.status} ({code}) "
            f"after {comp.attempt} attempt(s); its effect may still stand"
        )
    return lines


def describe_event(event: dict[str, Any]) -> str:
    kind = str(event.get("kind", "?"))
    stage = event.get("stage") or ""
    where = f" {stage!r} attempt {event.get('attempt')}" if stage else ""
    if kind == "run-started":
        return f"run started: {event.get('workflow')} ({event.get('plan_digest')})"
    if kind == "stage-failed":
        how = "retryable" if event.get("retryable") else "terminal"
        return f"stage{where} failed ({how}, {event.get('code')}): {event.get('message', '')}"
    if kind == "timer-fired":
        return f"{event.get('timer')} timer fired{where}"
    if kind == "cancel-requested":
        return f"cancel requested by {event.get('by')}: {event.get('reason', '')}"
    if kind == "redrive-requested":
        return f"re-drive of {stage!r} requested by {event.get('by')}"
    if kind == "poison-reported":
        return f"poison reported{where}: {event.get('reason')}"
    if kind == "approval-decided":
        comment = f": {event['comment']}" if event.get("comment") else ""
        return (
            f"{event.get('decision')} of gate {stage!r} by {event.get('by')} "
            f"(role {event.get('role')}){comment}"
        )
    return f"{kind.replace('-', ' ')}{where}"


def explain_history(run: RunState, entries: Sequence[HistoryEntry]) -> list[str]:
    lines = []
    for h in entries:
        verdict = "" if h.accepted else f"  -> refused: {h.reason}"
        note = f"  ({h.note})" if h.note else ""
        lines.append(f"#{h.seq} {describe_event(h.event)}{verdict}{note}")
    for name, st in run.stages.items():
        if st.status == "waiting":
            done = len((st.result or {}).get("decisions", ()))
            due = (st.result or {}).get("due_at_ms")
            lines.append(f"gate {name!r} is waiting for approval ({done} decided, due at {due})")
    skipped = [n for n, st in run.stages.items() if st.status == "skipped"]
    if skipped:
        lines.append(f"skipped (no route reaches them): {', '.join(skipped)}")
    lines += reconciliation(run)
    ending = f"now {run.status}"
    if run.intent:
        ending += f", terminal intent {run.intent}"
    if run.error:
        ending += f", error {run.error.get('code', run.error)}"
    lines.append(ending)
    return lines
