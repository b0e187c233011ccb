"""Approval gates at run time: reaching one dispatches nothing; the gate waits.

The gate's record goes ``waiting`` with a fence of its own, and one durable ``approval`` timer is
armed for its ``timeout_ms`` (in the same commit, like every clock), so a gate outlives any engine
restart. What happens next — decisions, the timeout, cancellation — is
:mod:`accord.engine.machine.gates`, which leaves the gate along the edges :func:`leave` names.
"""

from __future__ import annotations

from typing import Any

from accord.engine.machine import ids
from accord.engine.machine.draft import Draft
from accord.engine.machine.kinds.base import Handler, Moves, pending
from accord.engine.machine.state import WAITING, evolve
from accord.workflow.plan import ApprovalStage

__all__ = ["HANDLER", "due_at", "leave"]


def reached(d: Draft, stage: ApprovalStage, source: str, state: str) -> Moves:
    if not pending(d, stage.name):
        return ()
    fence = ids.fence_for(d.entropy, d.run_id, stage.name, 1, d.seq)
    due = d.at_ms + stage.timeout_ms
    waiting: dict[str, Any] = {"waiting_since_ms": d.at_ms, "due_at_ms": due, "decisions": []}
    d.put(evolve(d.stages[stage.name], status=WAITING, attempt=1, fence=fence, result=waiting))
    d.timer("approval", due, stage.name, 1, fence)
    d.telemetry("approval.waiting", stage.name, role=stage.approvers.role, dueAt=due)
    return ()


def due_at(d: Draft, name: str) -> int:
    """When the waiting gate ``name`` times out."""
    result = d.stages[name].result or {}
    return int(result.get("due_at_ms", 0))


def leave(stage: ApprovalStage, outcome: str) -> Moves:
    """The edge a gate leaves along: ``approve``, ``reject`` or ``timeout``."""
    if outcome == "approve":
        return ((stage.on_approve, "completed"),)
    if outcome == "reject":
        return ((stage.on_reject, "failed"),)
    return ((stage.on_timeout, "timed-out"),)


HANDLER: Handler[ApprovalStage] = Handler("approval", ApprovalStage, reached)
