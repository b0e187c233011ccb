"""``/v1/workflows``, ``/v1/contracts``, ``/v1/capabilities``, ``/v1/keys`` and ``/v1/audit``.

Activation compiles the definition against the server's contract catalog through the compiler's
five check layers (:func:`~accord.workflow.compiler.compile_workflow`, as ``accord workflow
activate`` does), then runs admission against what is live now (:meth:`Engine.admit
<accord.engine.runtime.orchestrator.Engine.admit>`, as the fleet does before it registers a
plan), then stores and activates it (:mod:`accord.workflow.activation`). Every finding is
returned with its code, file, line, column, path and stage.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from accord.adapters.ingress.auth import Principal, authorizer, tenants_of
from accord.adapters.ingress.control import ROLES
from accord.adapters.ingress.plane import PLATFORM_TENANT, Plane, plane
from accord.adapters.ingress.problems import Problem
from accord.errors import Diagnostic
from accord.workflow import activation
from accord.workflow.compiler import compile_workflow
from accord.workflow.plan import Plan

__all__ = ["router"]

router = APIRouter(prefix="/v1")
viewer = Depends(authorizer("viewer"))
author = Depends(authorizer("author"))
admin = Depends(authorizer("admin"))
Name = Annotated[str, Path(min_length=1, max_length=200)]
Digest = r"^sha256:[0-9a-f]{64}$"
MODES = r"^(backward|forward|full)$"


class Activate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = Field(min_length=1, max_length=1_000_000, description="the workflow YAML")
    filename: str = Field("workflow.yaml", min_length=1, max_length=200)
    admit: bool = Field(True, description="check admission against live capabilities first")


class Rollback(BaseModel):
    model_config = ConfigDict(extra="forbid")

    digest: str | None = Field(None, pattern=Digest, description="default: the previous one")


class NewKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: str = Field(pattern="^(" + "|".join(ROLES) + ")$")
    tenants: list[Annotated[str, Field(min_length=1, max_length=63)]] = Field(
        min_length=1, max_length=64
    )
    name: str = Field("", max_length=200)


def _findings(diagnostics: tuple[Diagnostic, ...] | list[Diagnostic]) -> list[dict[str, object]]:
    return [d.as_dict() for d in diagnostics]


# -- workflows -----------------------------------------------------------------------------------


def compiled_plan(p: Plane, source: str, filename: str) -> tuple[Plan, list[dict[str, object]]]:
    """``source`` compiled against the server's catalog, with the compiler's warnings; 503
    without a catalog, 422 for text that is not UTF-8 or a definition the compiler refuses (its
    diagnostics in the problem)."""
    if p.catalog is None:
        raise Problem(503, "no-contracts", "this server was started without a contract catalog")
    try:
        source.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise Problem(422, "workflow-encoding", f"source: not UTF-8 text: {exc.reason}") from None
    result = compile_workflow(source, filename, p.catalog)
    if result.plan is None:
        raise Problem(
            422, "workflow-refused", f"{filename}: refused, {len(result.errors)} error(s)",
            diagnostics=_findings(result.diagnostics),
        )  # fmt: skip
    return result.plan, _findings(result.warnings)


@router.post("/workflows", status_code=201, tags=["workflows"],
             summary="Compile, admit and activate a workflow definition")  # fmt: skip
async def activate_workflow(
    body: Activate, request: Request, response: Response, principal: Principal = author
) -> dict[str, Any]:
    p = plane(request)
    plan, warnings = compiled_plan(p, body.source, body.filename)
    if body.admit:
        refused = await p.engine.admit(plan)
        if refused:
            raise Problem(
                422, "workflow-not-admitted", "not admitted: " + "; ".join(
                    d.message for d in refused), diagnostics=_findings(refused),
            )  # fmt: skip
    changed = await activation.activate(p.store, plan)
    p.audit(request, principal, PLATFORM_TENANT, "workflow.activate", plan.name,
            digest=plan.digest, changed=changed)  # fmt: skip
    if not changed:
        response.status_code = 200
    return {
        "workflow": plan.name,
        "version": plan.version,
        "digest": plan.digest,
        "changed": changed,
        "warnings": warnings,
    }


@router.get("/workflows", tags=["workflows"], summary="Workflows with an active version")
async def list_workflows(
    request: Request,
    principal: Principal = viewer,
    name: Annotated[list[str] | None, Query(max_length=200)] = None,
) -> dict[str, Any]:
    """The workflows this server activated or has runs of (the store keeps no list of names),
    and any named with ``name``; each with its active digest."""
    p = plane(request)
    names = set(name or [])
    for record in p.control.audit_records(
        [PLATFORM_TENANT], action="workflow.activate", limit=10_000
    ):
        names.add(record.target)
    for stored in await p.store.list_runs(p.limits.page_max):
        workflow = stored.state.get("workflow")
        if isinstance(workflow, str):
            names.add(workflow)
    out = []
    for workflow in sorted(names):
        active = await p.store.get_active(workflow)
        if active is not None:
            out.append({"workflow": workflow, "active": active})
    return {"workflows": out}


async def _versions(p: Plane, workflow: str) -> list[activation.Version]:
    rows = await activation.versions(p.store, workflow)
    if not rows:
        raise Problem(404, "workflow-not-found", f"{workflow} has never been activated")
    return rows


@router.get("/workflows/{workflow}", tags=["workflows"], summary="A workflow's active plan")
async def get_workflow(
    workflow: Name, request: Request, principal: Principal = viewer
) -> dict[str, Any]:
    p = plane(request)
    digest = await p.store.get_active(workflow)
    if digest is None:
        raise Problem(404, "workflow-not-found", f"{workflow}: no active plan")
    plan = await activation.load_plan(p.store, digest)
    return {"workflow": plan.name, "version": plan.version, "digest": plan.digest,
            "plan": plan.to_json()}  # fmt: skip


@router.get("/workflows/{workflow}/versions", tags=["workflows"],
            summary="A workflow's activations, oldest first")  # fmt: skip
async def workflow_versions(
    workflow: Name, request: Request, principal: Principal = viewer
) -> dict[str, Any]:
    rows = await _versions(plane(request), workflow)
    return {
        "workflow": workflow,
        "versions": [
            {
                "digest": v.digest,
                "version": v.version,
                "active": v.active,
                "activated_at_ms": v.activated_at_ms,
            }
            for v in rows
        ],
    }


@router.post("/workflows/{workflow}/rollback", tags=["workflows"],
             summary="Activate an earlier version again (default: the previous one)")  # fmt: skip
async def rollback_workflow(
    workflow: Name, request: Request, body: Rollback | None = None, principal: Principal = author
) -> dict[str, Any]:
    p = plane(request)
    await _versions(p, workflow)
    target = await activation.rollback(p.store, workflow, body.digest if body else None)
    p.audit(request, principal, PLATFORM_TENANT, "workflow.rollback", workflow, digest=target)
    return {"workflow": workflow, "digest": target}


# -- contracts -----------------------------------------------------------------------------------


def _book(p: Plane) -> Any:
    if p.contracts is None:
        raise Problem(503, "no-contracts", "this server was started without a repository root")
    return p.contracts


@router.get("/contracts", tags=["contracts"], summary="Every known contract version")
async def list_contracts(request: Request, principal: Principal = viewer) -> dict[str, Any]:
    from accord.adapters.ingress.contracts import summary  # noqa: PLC0415

    book = _book(plane(request))
    return {"contracts": [summary(c, published) for c, published in book.all()]}


@router.get("/contracts/{name}/versions", tags=["contracts"], summary="A contract's versions")
async def contract_versions(
    name: Name, request: Request, principal: Principal = viewer
) -> dict[str, Any]:
    from accord.adapters.ingress.contracts import summary  # noqa: PLC0415

    found = _book(plane(request)).versions(name)
    if not found:
        raise Problem(404, "contract-not-found", f"no contract named {name!r}")
    return {"name": name, "versions": [summary(c, published) for c, published in found]}


@router.get("/contracts/{name}/versions/{version}", tags=["contracts"],
            summary="One contract version in canonical form")  # fmt: skip
async def contract_version(
    name: Name,
    version: Annotated[int, Path(ge=1, le=1_000_000)],
    request: Request,
    principal: Principal = viewer,
) -> dict[str, Any]:
    book = _book(plane(request))
    found = book.one(name, version)
    if found is None:
        raise Problem(404, "contract-not-found", f"no contract {name}@{version}")
    others = [c.version for c, _ in book.versions(name)]
    doc: dict[str, Any] = book.document(found[0], found[1], others)
    return doc


@router.get("/contracts/{name}/compatibility", tags=["contracts"],
            summary="The compatibility report between two versions")  # fmt: skip
async def compatibility(  # noqa: PLR0917 - FastAPI maps each parameter
    name: Name,
    request: Request,
    principal: Principal = viewer,
    old: Annotated[int | None, Query(alias="from", ge=1, le=1_000_000)] = None,
    new: Annotated[int | None, Query(alias="to", ge=1, le=1_000_000)] = None,
    mode: Annotated[str, Query(pattern=MODES)] = "backward",
) -> dict[str, Any]:
    """``from`` defaults to the version before ``to``; ``to`` to the latest."""
    book = _book(plane(request))
    known = book.versions(name)
    if not known:
        raise Problem(404, "contract-not-found", f"no contract named {name!r}")
    numbers = [c.version for c, _ in known]
    target = new if new is not None else numbers[-1]
    earlier = [n for n in numbers if n < target]
    source = old if old is not None else (earlier[-1] if earlier else None)
    if source is None:
        raise Problem(422, "no-earlier-version", f"{name}@{target} has no earlier version")
    before, after = book.one(name, source), book.one(name, target)
    if before is None or after is None:
        missing = source if before is None else target
        raise Problem(404, "contract-not-found", f"no contract {name}@{missing}")
    report = book.compatibility(before[0], after[0], mode)
    if report is None:
        raise Problem(422, "not-comparable", f"{name}@{source} and @{target} differ in kind")
    return {"name": name, "from": source, "to": target, **report}


# -- capabilities ------------------------------------------------------------------------------


@router.get("/capabilities", tags=["capabilities"], summary="Capabilities live in the fleet")
async def capabilities(request: Request, principal: Principal = viewer) -> dict[str, Any]:
    p = plane(request)
    live = await p.engine.live_capabilities()
    return {"workers": live, "actions": sorted(p.engine.registry.capabilities())}


# -- keys and audit ----------------------------------------------------------------------------


@router.post("/keys", status_code=201, tags=["keys"], summary="Create an API key (shown once)")
async def create_key(body: NewKey, request: Request, principal: Principal = admin) -> Any:
    p = plane(request)
    tenants = tenants_of(principal, body.tenants)
    secret, key = p.control.create_key(body.role, tenants, name=body.name, created_by=principal.id)
    for tenant in tenants:
        p.audit(request, principal, tenant, "key.create", key.key_id, role=body.role)
    return {"key": secret, **key.to_json()}


@router.get("/keys", tags=["keys"], summary="API keys of the principal's tenants")
async def list_keys(request: Request, principal: Principal = admin) -> dict[str, Any]:
    keys = plane(request).control.list_keys()
    mine = set(principal.tenants)
    return {"keys": [k.to_json() for k in keys if set(k.tenants) <= mine]}


@router.delete("/keys/{key_id}", tags=["keys"], summary="Revoke an API key")
async def revoke_key(
    key_id: Annotated[str, Path(pattern=r"^[0-9a-f]{12}$")],
    request: Request,
    principal: Principal = admin,
) -> dict[str, Any]:
    p = plane(request)
    key = p.control.get_key(key_id)
    if key is None or not set(key.tenants) <= set(principal.tenants):
        raise Problem(404, "key-not-found", f"no key {key_id}")
    if not p.control.revoke_key(key_id):
        raise Problem(409, "key-revoked", f"key {key_id} is already revoked")
    for tenant in key.tenants:
        p.audit(request, principal, tenant, "key.revoke", key_id)
    return {"key_id": key_id, "revoked": True}


@router.get("/audit", tags=["audit"], summary="Audit records of the principal's tenants")
async def audit(  # noqa: PLR0917 - FastAPI maps each parameter
    request: Request,
    principal: Principal = admin,
    tenant: Annotated[list[str] | None, Query(max_length=63)] = None,
    action: Annotated[str | None, Query(max_length=64)] = None,
    after: Annotated[int, Query(ge=0, le=2**53)] = 0,
    limit: Annotated[int | None, Query(ge=1)] = None,
) -> dict[str, Any]:
    """Records of the tenants asked for (default: all the principal's) and the platform-wide
    records (tenant ``*``: workflow activations and rollbacks), oldest first."""
    p = plane(request)
    size = limit if limit is not None else p.limits.page_default
    if size > p.limits.page_max:
        raise Problem(422, "page-too-large", f"limit may be at most {p.limits.page_max}")
    tenants = [*tenants_of(principal, tenant), PLATFORM_TENANT]
    rows = p.control.audit_records(tenants, after=after, limit=size + 1, action=action)
    page = rows[:size]
    return {
        "records": [r.to_json() for r in page],
        "next_after": page[-1].seq if len(rows) > size and page else None,
    }
