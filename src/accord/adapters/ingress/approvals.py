"""Approval gates over HTTP: decide a waiting gate, and list the gates waiting for you.

``POST /v1/runs/{run_id}/stages/{stage}/approve`` and ``…/reject`` take ``{comment, form}``. The
route checks the form data against the gate's form contract, then hands the decision to the run
(:class:`~accord.engine.machine.events.ApprovalDecided`, stamped with the principal's id, role and
tenants). The run's rules decide whether it counts (:mod:`accord.engine.machine.gates`): a refused
decision is recorded in the run's history and in the audit log, and answered 403 (``forbidden``:
role, tenant, requester), 409 (``duplicate``, ``late``) or 422 (``invalid``: the option, the form).
A principal that cannot see the run's tenant is answered 404 whatever the run decided, so a run
of another tenant is not said to exist.

``GET /v1/approvals`` lists the waiting gates of runs in the principal's tenants that the
principal may decide: role high enough, not the requester when the gate excludes them, not
decided by them already.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from accord.adapters.ingress.auth import Principal, authorizer, tenants_of
from accord.adapters.ingress.plane import Plane, plane
from accord.adapters.ingress.problems import Problem
from accord.adapters.ingress.runs import summary
from accord.engine.machine.events import ApprovalDecided
from accord.engine.machine.state import RunState, StageState
from accord.workflow.kinds.approval import form_problems, role_at_least
from accord.workflow.plan import ApprovalStage, Plan

__all__ = ["Decision", "router"]

router = APIRouter(prefix="/v1", tags=["approvals"])

viewer = Depends(authorizer("viewer"))
RunId = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]
StageName = Annotated[str, Path(min_length=1, max_length=128)]
_STATUS = {"forbidden": 403, "duplicate": 409, "late": 409, "invalid": 422}


class Decision(BaseModel):
    model_config = ConfigDict(extra="forbid")

    comment: str = Field("", max_length=2000, description="recorded with the decision")
    form: dict[str, Any] = Field(
        default_factory=dict, description="the approver's input, checked against the gate's form"
    )


async def _gate(p: Plane, principal: Principal, run_id: str, stage: str) -> tuple[RunState, Plan]:
    run = await p.engine.load(run_id)
    if run is None:
        raise Problem(404, "run-not-found", f"no run {run_id!r}", run_id=run_id)
    plan = await p.engine.plan(run.plan_digest)
    gate = plan.stage(stage) if plan.has_stage(stage) else None
    if not isinstance(gate, ApprovalStage):
        if not principal.can_see(run.tenant):
            raise Problem(404, "run-not-found", f"no run {run_id!r}", run_id=run_id)
        raise Problem(
            404, "gate-not-found", f"run {run_id!r} has no approval gate {stage!r}", stage=stage
        )
    return run, plan


async def _decide(
    decision: Literal["approve", "reject"],
    *,
    run_id: str,
    stage: str,
    request: Request,
    body: Decision | None,
    principal: Principal,
) -> dict[str, Any]:
    p = plane(request)
    asked = body or Decision(comment="")
    run, plan = await _gate(p, principal, run_id, stage)
    gate = plan.stage(stage)
    assert isinstance(gate, ApprovalStage)
    problems = form_problems(gate, p.catalog, asked.form)
    done = await p.engine.deliver(
        ApprovalDecided(
            run_id=run_id,
            stage=stage,
            decision=decision,
            by=principal.id,
            role=principal.role,
            tenants=principal.tenants,
            comment=asked.comment,
            form=asked.form,
            form_problems=problems,
        )
    )
    refused = [h for h in done.history if not h.accepted]
    reason = refused[0].reason if refused else None
    p.audit(request, principal, run.tenant, f"approval.{decision}", f"{run_id}/{stage}",
            accepted=not refused, reason=reason, comment=asked.comment)  # fmt: skip
    if refused:
        if not principal.can_see(run.tenant):
            raise Problem(404, "run-not-found", f"no run {run_id!r}", run_id=run_id)
        h = refused[0]
        raise Problem(
            _STATUS.get(h.reason or "", 409), f"approval-{h.reason}",
            f"refused by the gate's rules: {h.reason} ({h.note})",
            reason=h.reason, run_id=run_id, stage=stage,
        )  # fmt: skip
    after = done.run or run
    st = after.stages[stage]
    return {**summary(after), "stage": stage, "gate": _gate_view(st, gate)}


def _gate_view(st: StageState, gate: ApprovalStage) -> dict[str, Any]:
    result = st.result or {}
    return {
        "status": st.status,
        "decision": result.get("decision"),
        "decisions": list(result.get("decisions", ())),
        "needed": gate.approvers.min,
        "waiting_since_ms": result.get("waiting_since_ms"),
        "due_at_ms": result.get("due_at_ms"),
    }


@router.post(
    "/runs/{run_id}/stages/{stage}/approve", summary="Approve a waiting gate (recorded with who)"
)
async def approve(
    run_id: RunId,
    stage: StageName,
    request: Request,
    body: Decision | None = None,
    principal: Principal = viewer,
) -> dict[str, Any]:
    return await _decide(
        "approve", run_id=run_id, stage=stage, request=request, body=body, principal=principal
    )


@router.post(
    "/runs/{run_id}/stages/{stage}/reject", summary="Reject a waiting gate (recorded with who)"
)
async def reject(
    run_id: RunId,
    stage: StageName,
    request: Request,
    body: Decision | None = None,
    principal: Principal = viewer,
) -> dict[str, Any]:
    return await _decide(
        "reject", run_id=run_id, stage=stage, request=request, body=body, principal=principal
    )


def _may_decide(principal: Principal, run: RunState, st: StageState, gate: ApprovalStage) -> bool:
    a = gate.approvers
    if not role_at_least(principal.role, a.role):
        return False
    if a.exclude_requester and run.requested_by and run.requested_by == principal.id:
        return False
    decided = (st.result or {}).get("decisions", ())
    return not any(d.get("by") == principal.id for d in decided)


@router.get("/approvals", summary="Gates waiting for a decision the principal may make")
async def pending(
    request: Request,
    principal: Principal = viewer,
    tenant: Annotated[list[str] | None, Query(max_length=63)] = None,
) -> dict[str, Any]:
    p = plane(request)
    plans: dict[str, Plan] = {}
    found: list[dict[str, Any]] = []
    for t in tenants_of(principal, tenant):
        for stored in await p.store.list_runs(p.limits.scan_max, tenant=t, status="running"):
            run = RunState.from_json(stored.state)
            for name, st in run.stages.items():
                if st.status != "waiting":
                    continue
                if run.plan_digest not in plans:
                    plans[run.plan_digest] = await p.engine.plan(run.plan_digest)
                gate = plans[run.plan_digest].stage(name)
                if not isinstance(gate, ApprovalStage) or not _may_decide(principal, run, st, gate):
                    continue
                found.append(
                    {
                        "run_id": run.run_id,
                        "workflow": run.workflow,
                        "tenant": run.tenant,
                        "stage": name,
                        "role": gate.approvers.role,
                        "options": list(gate.options),
                        "form": gate.form,
                        **_gate_view(st, gate),
                    }
                )
    found.sort(key=lambda g: (g["due_at_ms"] or 0, g["run_id"], g["stage"]))
    return {"approvals": found}
