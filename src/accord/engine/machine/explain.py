"""Explaining a run from its history alone: one plain line per recorded event.

The history is the run's whole story (accepted and refused events, in order), so an operator's
question "why is this run failed?" is answered by reading it, never by guessing from logs. This
module is pure: it formats history entries; it decides nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from accord.engine.machine.state import HistoryEntry, RunState

__all__ = ["describe_event", "explain_history"]


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
    return f"{kind.replace('-', ' ')}{where}"


def explain_history(run: RunState, entries: Sequence[HistoryEntry]) -> list[str]:
    lines = []
    for h in entries:
        verdict = "" if h.accepted else f"  -> refused: {h.reason}"
        note = f"  ({h.note})" if h.note else ""
        lines.append(f"#{h.seq} {describe_event(h.event)}{verdict}{note}")
    ending = f"now {run.status}"
    if run.intent:
        ending += f", terminal intent {run.intent}"
    if run.error:
        ending += f", error {run.error.get('code', run.error)}"
    lines.append(ending)
    return lines
