"""Explaining a run from its history alone: one plain line per recorded event.

The history is the run's whole story (accepted and refused events, in order), so an operator's
question "why is this run failed?" is answered by reading it, never by guessing from logs. This
module is pure: it formats history entries; it decides nothing.

A migration (``run-migrated``) is told in full: from which plan digest to which (and the new
definition's version), when, by whom and why, then a line with the stage map the move applied —
which stages were *kept* as they were (state and result carried over), *renamed* (carried over
under their new name), *retyped* (pending stages that take the new plan's kind), *added* (new,
pending) and *removed* (dropped with their state). A refused migration names what the proof
found (``problems``). :func:`migrations` gives the same as JSON documents.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from accord.engine.machine.finalise import needs_reconciliation
from accord.engine.machine.state import HistoryEntry, RunState

__all__ = ["describe_event", "explain_history", "migrations", "reconciliation"]


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


def _iso(at_ms: int) -> str:
    return datetime.fromtimestamp(at_ms / 1000, UTC).isoformat(timespec="seconds")[:-6] + "Z"


def migrations(run: RunState, entries: Sequence[HistoryEntry]) -> list[dict[str, Any]]:
    """Each recorded migration of the run (accepted or refused), oldest first: ``from``, ``to``,
    ``version``, ``at_ms``, ``at``, ``by``, ``reason``, ``accepted`` and, for a refused one,
    ``refused`` and ``problems``; the map as ``renamed``, ``retyped``, ``added``, ``removed`` and,
    for an accepted one, ``kept`` (worked back from the run's stages now)."""
    found: list[dict[str, Any]] = []
    for h in entries:
        ev = h.event
        if ev.get("kind") != "run-migrated":
            continue
        doc: dict[str, Any] = {
            "seq": h.seq,
            "from": ev.get("from_digest", ""),
            "to": ev.get("to_digest", ""),
            "version": ev.get("to_version", ""),
            "at_ms": h.at_ms,
            "at": _iso(h.at_ms),
            "by": ev.get("by", ""),
            "reason": ev.get("reason", ""),
            "accepted": h.accepted,
            "renamed": dict(ev.get("renamed") or {}),
            "retyped": dict(ev.get("retyped") or {}),
            "added": dict(ev.get("added") or {}),
            "removed": list(ev.get("removed") or ()),
        }
        if not h.accepted:
            doc["refused"] = h.reason
            doc["problems"] = list(ev.get("problems") or ())
        found.append(doc)
    after = {n for n in run.stages if not n.startswith("@")}  # the stages after the latest
    for m in reversed([m for m in found if m["accepted"]]):  # walk back through each move
        renamed: dict[str, str] = m["renamed"]
        kept = after - set(m["added"]) - set(renamed.values())
        m["kept"] = sorted(kept - set(m["retyped"]))
        after = kept | set(renamed) | set(m["removed"])
    return found


def _migration_lines(m: dict[str, Any]) -> list[str]:
    version = f" (version {m['version']})" if m["version"] else ""
    why = f": {m['reason']}" if m["reason"] else ""
    head = f"#{m['seq']} migration from {m['from']} to {m['to']}{version} at {m['at']} by {m['by']}"
    if not m["accepted"]:
        problems = "; ".join(m["problems"]) or "no problems recorded"
        return [f"{head}{why}  -> refused: {m['refused']} ({problems})"]
    parts = []
    parts.append(f"kept {', '.join(m['kept']) or 'none'}")
    if m["renamed"]:
        parts.append("renamed " + ", ".join(f"{o} -> {n}" for o, n in m["renamed"].items()))
    if m["retyped"]:
        parts.append(
            "retyped (pending) " + ", ".join(f"{n} -> {t}" for n, t in m["retyped"].items())
        )
    if m["added"]:
        parts.append("added (pending) " + ", ".join(f"{n} ({t})" for n, t in m["added"].items()))
    if m["removed"]:
        parts.append(f"removed {', '.join(m['removed'])}")
    return [f"{head}{why}", f"   stage map: {'; '.join(parts) or 'unchanged'}"]


def explain_history(run: RunState, entries: Sequence[HistoryEntry]) -> list[str]:
    lines = []
    moved = {m["seq"]: m for m in migrations(run, entries)}
    for h in entries:
        if h.seq in moved:
            lines += _migration_lines(moved[h.seq])
            continue
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
