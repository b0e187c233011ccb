"""The table of legal run, stage and attempt status changes, checked by every draft.

The rules they serve are set out in the package docstring of :mod:`accord.engine.machine`.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "ATTEMPT_TRANSITIONS",
    "RUN_TRANSITIONS",
    "STAGE_TRANSITIONS",
    "IllegalTransition",
    "check_stage",
]

_FAILED_LIKE = frozenset({"failed", "timed-out", "quarantined", "cancelled"})

STAGE_TRANSITIONS: Mapping[str, frozenset[str]] = {
    # decision/fork/join resolve instantly; a binding error fails a task before dispatch
    # ``skipped``: a decision or gate chose a route no longer leading to the stage
    "pending": frozenset(
        {"queued", "running", "completed", "failed", "cancelled", "waiting", "skipped"}
    ),
    # an approval gate: approved, rejected, timed out, or cancelled with its run
    "waiting": frozenset({"completed", "failed", "timed-out", "cancelled"}),
    "queued": frozenset({"running", "completed", "failed", "retry-scheduled"} | _FAILED_LIKE),
    "running": frozenset({"completed", "retry-scheduled"} | _FAILED_LIKE),
    # a retry whose inputs no longer bind (a migration removed what they named) fails before
    # dispatch, like a first attempt would
    "retry-scheduled": frozenset({"queued", "running", "failed", "cancelled"}),
    "completed": frozenset(),
    # operator re-drive: a new fenced attempt (or a new binding error)
    "failed": frozenset({"queued", "running", "failed"}),
    "timed-out": frozenset({"queued", "running", "failed"}),
    "quarantined": frozenset({"queued", "running", "failed"}),
    "cancelled": frozenset({"queued", "running", "failed"}),
    "skipped": frozenset(),
}

ATTEMPT_TRANSITIONS: Mapping[str, frozenset[str]] = {
    "queued": frozenset(
        {"running", "succeeded", "failed", "timed-out", "cancelled", "quarantined"}
    ),
    "running": frozenset({"succeeded", "failed", "timed-out", "cancelled", "quarantined"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "timed-out": frozenset(),
    "cancelled": frozenset(),
    "quarantined": frozenset(),
}

RUN_TRANSITIONS: Mapping[str, frozenset[str]] = {
    "running": frozenset({"finalising"}),
    "finalising": frozenset({"completed", "failed", "cancelled"}),
    "completed": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}


class IllegalTransition(AssertionError):
    """The machine tried a change the table forbids: a bug in the machine, never a domain
    outcome (those come back as recorded rejections)."""


def check_stage(name: str, old: str, new: str) -> None:
    if old != new and new not in STAGE_TRANSITIONS[old]:
        raise IllegalTransition(f"stage {name!r}: {old} -> {new} is not a legal transition")


def check_attempt(name: str, old: str, new: str) -> None:
    if old != new and new not in ATTEMPT_TRANSITIONS[old]:
        raise IllegalTransition(f"attempt of {name!r}: {old} -> {new} is not a legal transition")


def check_run(run_id: str, old: str, new: str) -> None:
    if old != new and new not in RUN_TRANSITIONS[old]:
        raise IllegalTransition(f"run {run_id!r}: {old} -> {new} is not a legal transition")
