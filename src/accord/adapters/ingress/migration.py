"""Run migration and canary activation over HTTP (author role).

``POST /v1/runs/{run_id}/migrate`` takes ``{to, map, reason}``: ``to`` a stored plan digest,
``map`` explicit stage renames (old → new). It runs the proof and records the decision
(:func:`accord.engine.runtime.migration.migrate_run`, as the principal's id) and answers the
run's summary with the map, or 409 ``migration-refused`` with each refusal (code, stage,
message) — recorded in the run's history either way. A run of a tenant the principal cannot see
is 404; a bad map or an unknown plan is 422.

``/v1/workflows/{name}/canary``: ``GET`` the split, both versions' recorded outcomes and the
verdict; ``POST {digest, share, max_increase, min_runs, reason}`` begins a canary of a stored
plan; ``POST …/promote {auto, reason}`` and ``POST …/abort {reason}`` decide (see
:mod:`accord.engine.runtime.canary`). Every call is in the audit log.

``POST /v1/workflows/{name}/shadow`` takes ``{source, filename, where, limit}``: the definition
is compiled (nothing is stored or activated) and the newest ``limit`` recorded runs of the
principal's tenants that ``where`` chooses (the terms of ``accord runs search``; default the
completed runs of the active version) are replayed through it with every effect off
(:func:`accord.engine.runtime.shadow.shadow`), answering the report as ``accord workflow shadow
--json`` prints it. A definition that does not compile is 422 ``workflow-refused``; one of
another workflow 422 ``shadow-wrong-workflow``; a query term it cannot answer 422
``shadow-bad-query`` naming the term; a ``tenant:`` term naming another tenant 403.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from pydantic import BaseModel, ConfigDict, Field

from accord.adapters.ingress.auth import Principal, authorizer, tenants_of
from accord.adapters.ingress.manage import compiled_plan
from accord.adapters.ingress.plane import PLATFORM_TENANT, plane
from accord.adapters.ingress.problems import Problem
from accord.adapters.ingress.runs import summary
from accord.engine.runtime import canary as canaries
from accord.engine.runtime.migration import migrate_run
from accord.engine.runtime.shadow import parse_where
from accord.engine.runtime.shadow import shadow as shadow_runs
from accord.errors import EngineError
from accord.workflow.activation import ActivationError, load_plan
from accord.workflow.canary import CanaryError, Criteria, Split, parse_share, share_text
from accord.workflow.migration import MigrationError

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["migration"])
author = Depends(authorizer("author"))
RunId = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]
Name = Annotated[str, Path(min_length=1, max_length=200)]
Digest = r"^sha256:[0-9a-f]{64}$"
StageName = Annotated[str, Field(min_length=1, max_length=128)]


class Migrate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    to: str = Field(pattern=Digest, description="the stored plan to move the run to")
    map: dict[StageName, StageName] = Field(
        default_factory=dict, max_length=256, description="explicit stage renames, old → new"
    )
    reason: str = Field("", max_length=2000, description="why: recorded with the decision")


class BeginCanary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    digest: str = Field(pattern=Digest, description="the stored plan to send a share of runs to")
    share: str = Field(min_length=1, max_length=16, description="e.g. 10%")
    max_increase: float | None = Field(None, ge=0, le=100, description="percentage points")
    min_runs: int | None = Field(None, ge=1, le=1_000_000)
    reason: str = Field("", max_length=2000)


class Shadow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = Field(min_length=1, max_length=1_000_000, description="the new version's YAML")
    filename: str = Field("workflow.yaml", min_length=1, max_length=200)
    where: str | None = Field(
        None, max_length=2000, description="which recorded runs, in the terms of runs search"
    )
    limit: int = Field(100, ge=1, le=500, description="how many recorded runs to replay")


class Decide(BaseModel):
    model_config = ConfigDict(extra="forbid")

    auto: bool = Field(False, description="promote: apply the criteria's verdict instead")
    reason: str = Field("", max_length=2000)


@router.post("/runs/{run_id}/migrate", summary="Move a live run to another plan version")
async def migrate(
    run_id: RunId, body: Migrate, request: Request, principal: Principal = author
) -> dict[str, Any]:
    p = plane(request)
    run = await p.visible_run(principal, run_id)
    try:
        done = await migrate_run(
            p.engine,
            run_id,
            body.to,
            renames=body.map,
            by=principal.id,
            reason=body.reason,
            catalog=p.catalog,
        )
    except MigrationError as exc:
        raise Problem(422, exc.code, str(exc), run_id=run_id) from None
    doc = done.to_json()
    p.audit(
        request,
        principal,
        run.tenant,
        "run.migrate",
        run_id,
        to=body.to,
        accepted=done.moved,
        reason=body.reason,
    )
    if not done.moved:
        raise Problem(
            409,
            "migration-refused",
            f"run {run_id!r} cannot move to {body.to}",
            refusals=doc["refusals"],
            machine=doc["machine"],
        )
    after = done.delivered.run or run
    return {**summary(after), "map": doc["map"]}


def _split_json(split: Split) -> dict[str, Any]:
    return {**split.to_json(), "share": share_text(split.share), "criteria": str(split.criteria)}


def _problem(exc: CanaryError | ActivationError) -> Problem:
    status = 404 if exc.code in ("canary-none", "activation-unknown-plan") else 409
    return Problem(status, exc.code, str(exc))


@router.get("/workflows/{name}/canary", summary="A workflow's canary, outcomes and verdict")
async def canary_status(
    name: Name, request: Request, principal: Principal = author
) -> dict[str, Any]:
    try:
        split, stable, new, verdict = await canaries.status(plane(request).store, name)
    except CanaryError as exc:
        raise _problem(exc) from None
    return {
        "canary": _split_json(split),
        "stable_outcomes": stable.to_json(),
        "canary_outcomes": new.to_json(),
        "verdict": {"decision": verdict.decision, "why": verdict.why},
    }


@router.post("/workflows/{name}/canary", status_code=201, summary="Begin a canary of a plan")
async def begin_canary(
    name: Name, body: BeginCanary, request: Request, principal: Principal = author
) -> dict[str, Any]:
    p = plane(request)
    try:
        share = parse_share(body.share)
    except CanaryError as exc:
        raise Problem(422, exc.code, str(exc)) from None
    criteria = None
    if body.max_increase is not None or body.min_runs is not None:
        base = Criteria()
        criteria = Criteria(
            base.max_increase if body.max_increase is None else body.max_increase / 100,
            base.min_runs if body.min_runs is None else body.min_runs,
        )
    try:
        plan = await load_plan(p.store, body.digest)
        if plan.name != name:
            raise Problem(422, "canary-wrong-workflow", f"{body.digest} is a plan of {plan.name}")
        split = await canaries.begin(
            p.store,
            plan,
            share,
            criteria=criteria,
            by=principal.id,
            reason=body.reason,
            now_ms=p.engine.clock.now_ms(),
        )
    except (CanaryError, ActivationError) as exc:
        raise _problem(exc) from None
    p.audit(
        request,
        principal,
        PLATFORM_TENANT,
        "workflow.canary",
        name,
        digest=body.digest,
        share=share_text(share),
    )
    return {"canary": _split_json(split)}


async def _decide(name: str, action: str, body: Decide, request: Request, who: Principal) -> Any:
    p = plane(request)
    now = p.engine.clock.now_ms()
    decision: str = action
    try:
        if action == "promote" and body.auto:
            split, verdict = await canaries.settle(p.store, name, by=who.id, now_ms=now)
            decision = verdict.decision
        else:
            act = canaries.promote if action == "promote" else canaries.abort
            why = body.reason or f"{action} by hand"
            split = await act(p.store, name, by=who.id, why=why, now_ms=now)
    except (CanaryError, ActivationError) as exc:
        raise _problem(exc) from None
    p.audit(request, who, PLATFORM_TENANT, f"workflow.canary.{action}", name, decision=decision)
    return {"decision": decision, "canary": _split_json(split)}


@router.post("/workflows/{name}/canary/promote", summary="Promote a canary (or apply its verdict)")
async def promote(
    name: Name, request: Request, body: Decide | None = None, principal: Principal = author
) -> dict[str, Any]:
    result: dict[str, Any] = await _decide(
        name, "promote", body or Decide(auto=False, reason=""), request, principal
    )
    return result


@router.post("/workflows/{name}/canary/abort", summary="Abort a canary")
async def abort(
    name: Name, request: Request, body: Decide | None = None, principal: Principal = author
) -> dict[str, Any]:
    result: dict[str, Any] = await _decide(
        name, "abort", body or Decide(auto=False, reason=""), request, principal
    )
    return result


@router.post("/workflows/{name}/shadow", summary="Replay recorded runs through a new definition")
async def shadow(
    name: Name, body: Shadow, request: Request, principal: Principal = author
) -> dict[str, Any]:
    p = plane(request)
    plan, _ = compiled_plan(p, body.source, body.filename)
    if plan.name != name:
        raise Problem(422, "shadow-wrong-workflow", f"{body.filename}: a version of {plan.name}")
    now = p.engine.clock.now_ms()
    text = body.where or ""
    try:
        named = parse_where(text, name, now).tenants or ()
        query = parse_where(text, name, now, tenants=principal.tenants)
    except ValueError as exc:
        raise Problem(422, "shadow-bad-query", f"where: {exc}", where=text) from None
    tenants_of(principal, named)  # a tenant: term naming another tenant is 403
    if not query.version and await p.store.get_active(name) is None:
        raise Problem(422, "workflow-not-active", f"{name} has no active version to shadow")
    try:
        report = await shadow_runs(p.store, plan, body.limit, where=query)
    except (EngineError, ActivationError) as exc:
        raise Problem(409, "shadow-unreplayable", f"{name}: {exc}") from None
    return {**report.to_json(), "where": body.where}
