"""Approval gates: decisions, the timeout, and what they refuse.

A waiting gate (:mod:`accord.engine.machine.kinds.approval`) counts decisions. Each decision is
checked in this order, and the first rule it breaks refuses it (recorded, changing nothing):

- the stage is an approval gate of the plan (``invalid``), the run has no terminal intent
  (``late``), and the gate was reached (``invalid``);
- the gate has not timed out — its timer fired, or the decision came at or after its due time
  (``late``) — and was not decided already (``duplicate``);
- the decision is one of the gate's options (``invalid``);
- the approver is eligible (``forbidden``): role at least the gate's, one of their tenants the
  run's when ``tenant_scoped``, not the run's requester when ``exclude_requester``;
- the approver has not decided this gate before (``duplicate``);
- the form data satisfied the form contract, as the shell found (``invalid``), and there is none
  when the gate has no form (``invalid``).

An accepted decision is added to the gate's ``decisions`` (principal, role, time, comment, form).
One rejection rejects the gate; ``approvers.min`` approvals approve it. The gate then stops its
timer and leaves along ``on_approve`` (``completed``) or ``on_reject`` (``failed``, error
``approval-rejected``). When the timer fires first the gate is ``timed-out`` (error
``approval-timeout``) and leaves along ``on_timeout``. A cancelled run, or any terminal intent,
cancels a waiting gate with the run's other live work (:func:`~accord.engine.machine.finalise.
fence_live`).
"""

from __future__ import annotations

from typing import Any

from accord.engine.machine import ids
from accord.engine.machine.draft import Draft
from accord.engine.machine.effects import CancelTimer
from accord.engine.machine.events import ApprovalDecided, TimerFired
from accord.engine.machine.flow import route
from accord.engine.machine.kinds.approval import due_at, leave
from accord.engine.machine.outcomes import Refusal
from accord.engine.machine.state import WAITING, StageState, evolve
from accord.workflow.kinds.approval import role_at_least
from accord.workflow.plan import ApprovalStage

__all__ = ["on_decision", "on_timer"]


def _gate(d: Draft, name: str) -> ApprovalStage | None:
    stage = d.plan.stage(name) if d.plan.has_stage(name) else None
    return stage if isinstance(stage, ApprovalStage) else None


def on_decision(d: Draft, ev: ApprovalDecided) -> Refusal | None:
    stage = _gate(d, ev.stage)
    if stage is None:
        return Refusal("invalid", f"{ev.stage!r} is not an approval gate of this plan")
    if d.intent is not None:
        return Refusal("late", f"run already has terminal intent {d.intent}")
    st = d.stages[ev.stage]
    refusal = _check(d, stage, st, ev)
    if refusal is not None:
        return refusal
    result: dict[str, Any] = dict(st.result or {})
    record = {
        "decision": ev.decision,
        "by": ev.by,
        "role": ev.role,
        "at_ms": ev.at_ms,
        "comment": ev.comment,
        "form": ev.form,
    }
    result["decisions"] = [*result.get("decisions", ()), record]
    approvals = sum(1 for x in result["decisions"] if x["decision"] == "approve")
    d.notes.append(f"{ev.decision} by {ev.by}")
    if ev.decision == "reject":
        _conclude(d, stage, "reject", result, {"code": "approval-rejected", "by": ev.by})
    elif approvals >= stage.approvers.min:
        _conclude(d, stage, "approve", result, None)
    else:
        d.put(evolve(st, result=result))
        d.telemetry("approval.recorded", ev.stage, by=ev.by, approvals=approvals)
    return None


def _check(d: Draft, stage: ApprovalStage, st: StageState, ev: ApprovalDecided) -> Refusal | None:
    if st.status == "pending":
        return Refusal("invalid", f"gate {ev.stage!r} has not been reached")
    if st.status == "timed-out" or (st.status == WAITING and ev.at_ms >= due_at(d, ev.stage)):
        return Refusal("late", f"gate {ev.stage!r} timed out at {due_at(d, ev.stage)}")
    if st.status != WAITING:
        return Refusal("duplicate", f"gate {ev.stage!r} was already decided ({st.status})")
    if ev.decision not in stage.options:
        return Refusal("invalid", f"{ev.decision!r} is not one of the gate's {stage.options}")
    a = stage.approvers
    if not role_at_least(ev.role, a.role):
        return Refusal("forbidden", f"{ev.by}: role {ev.role!r} is below the gate's {a.role!r}")
    if a.tenant_scoped and d.base.tenant not in ev.tenants:
        return Refusal("forbidden", f"{ev.by} is not of the run's tenant {d.base.tenant!r}")
    if a.exclude_requester and d.base.requested_by and ev.by == d.base.requested_by:
        return Refusal("forbidden", f"{ev.by} requested the run and may not decide its gate")
    if any(x.get("by") == ev.by for x in (st.result or {}).get("decisions", ())):
        return Refusal("duplicate", f"{ev.by} already decided gate {ev.stage!r}")
    if ev.form_problems:
        return Refusal("invalid", f"form {stage.form}: " + "; ".join(ev.form_problems))
    if stage.form is None and ev.form:
        return Refusal("invalid", f"gate {ev.stage!r} takes no form data")
    return None


def on_timer(d: Draft, ev: TimerFired) -> Refusal | None:
    """The gate's timeout: a gate still waiting times out; any other firing is a no-op."""
    drop = (CancelTimer(timer_id=ev.timer_id),)
    stage = _gate(d, ev.stage)
    st = d.stages.get(ev.stage)
    if stage is None or st is None:
        return Refusal("unknown-attempt", f"{ev.stage!r} is not an approval gate", drop)
    if ev.attempt != st.attempt or ev.fence != st.fence:
        return Refusal("stale", "approval timer of another wait", drop)
    if st.status != WAITING:
        return Refusal("stale", f"gate is {st.status}", drop)
    if ev.at_ms < due_at(d, ev.stage):
        return Refusal("stale", "approval timer not yet due")
    error = {"code": "approval-timeout", "timeoutMs": stage.timeout_ms}
    _conclude(d, stage, "timeout", dict(st.result or {}), error)
    return None


def _conclude(
    d: Draft,
    stage: ApprovalStage,
    outcome: str,
    result: dict[str, Any],
    error: dict[str, Any] | None,
) -> None:
    d.emit(CancelTimer(timer_id=ids.timer_id(d.run_id, stage.name, 1, "approval")))
    status = {"approve": "completed", "reject": "failed"}.get(outcome, "timed-out")
    result = {**result, "decision": outcome}
    d.put(evolve(d.stages[stage.name], status=status, result=result, error=error, released=True))
    d.telemetry("approval.decided", stage.name, outcome=outcome)
    for target, state in leave(stage, outcome):
        route(d, stage.name, target, state)
    d.rerouted = True
