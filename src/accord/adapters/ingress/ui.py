"""The web UI under ``/ui/`` and the three small ``/v1`` reads it needs (docs/ui.md).

The UI is a single-page application built from ``ui/`` by ``make node`` into ``ui_static/``
beside this module; this router serves those files (never a directory listing, never a path
outside the folder) with a Content-Security-Policy that lets a page load nothing but this
server's own assets and talk to nothing but this server. A server whose UI was not built
answers ``/ui/`` with ``503 ui-not-built`` naming the command that builds it.

The API routes added here are reads the UI cannot do without:

- ``GET /v1/me`` (viewer): who the bearer is, its role and tenants, and which actions that role
  may take, so the UI hides what the server would refuse anyway;
- ``GET /v1/plans/{digest}`` (viewer): a compiled plan by digest (a run's own plan, or any
  version of a workflow for a diff);
- ``POST /v1/workflows/check`` (author): compile a pasted definition and answer every finding
  (code, message, file, line, column, path, stage) without storing or activating anything;
- ``GET /v1/fleet`` (viewer): the queues the principal's running runs wait on, from the search
  projection (each queued stage's queue and capability from its plan): how many stages are
  queued on each and the oldest one's age, the workers announcing its capability (``live``
  false: none, so the stage waits — the UI's banner), and the open alerts;
- ``GET /v1/contracts/{name}/usage`` (viewer): a contract's golden fixtures (each valid and
  invalid example with what it expects) and who uses it: the capability contracts whose request
  or result it is, and the active workflow versions whose context or stages name it;
- ``GET /v1/runs/{run_id}/previews`` (viewer): the previews the run's recorded stage results name
  (each ``previews[].objectKey``), and ``GET /v1/runs/{run_id}/objects?key=…`` (viewer): one of
  those objects, read from the run's tenant's folder of the server's object store
  (``app.state.objects``: what ``accord serve`` gives, a ``StorageMap`` of
  :mod:`accord.worker.storage`, which this layer may not import — :class:`Objects` is what it
  needs of one); a key no result of the
  run names, a run of another tenant or a missing object is ``404``, a server without an object
  store answers ``404 no-object-store``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import mimetypes
import time
from pathlib import Path
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Depends, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, RedirectResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from accord.adapters.ingress.auth import Principal, authorizer, tenants_of
from accord.adapters.ingress.control import ROLES, role_at_least
from accord.adapters.ingress.manage import list_workflows
from accord.adapters.ingress.plane import plane
from accord.adapters.ingress.problems import Problem
from accord.contracts.codegen import FIXTURES_OUT
from accord.contracts.model import CapabilityContract
from accord.engine.machine.state import RunState
from accord.engine.runtime.projector import parse_query
from accord.errors import StageFailed, StoreError
from accord.workflow import activation
from accord.workflow.compiler import compile_workflow

__all__ = ["ACTIONS", "STATIC", "api", "pages"]

STATIC = Path(__file__).with_name("ui_static")
ACTIONS = {  # what the UI offers, and the least role the server accepts it from
    "run.start": "operator",
    "run.cancel": "operator",
    "run.redrive": "operator",
    "workflow.check": "author",
    "workflow.activate": "author",
    "workflow.rollback": "author",
    "key.manage": "admin",
    "audit.read": "admin",
}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
FLEET_MAX_RUNS = 10_000  # the most running runs one fleet read looks at
_NO_QUEUE = {False: "(in the engine)", True: "(plan not stored here)"}
Digest = Annotated[str, PathParam(pattern=r"^sha256:[0-9a-f]{64}$")]

pages = APIRouter(include_in_schema=False)
api = APIRouter(prefix="/v1")
viewer = Depends(authorizer("viewer"))
author = Depends(authorizer("author"))


class Check(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = Field(min_length=1, max_length=1_000_000, description="the workflow YAML")
    filename: str = Field("workflow.yaml", min_length=1, max_length=200)


def _asset(name: str) -> Path:
    if not (STATIC / "index.html").is_file():
        raise Problem(
            503, "ui-not-built", "the web UI is not built here: run `make node` (builds ui/)"
        )
    wanted = (STATIC / name).resolve()
    if STATIC.resolve() not in wanted.parents or not wanted.is_file():
        raise Problem(404, "not-found", f"/ui/{name}: no such asset")
    return wanted


def _file(path: Path, *, cache: bool) -> FileResponse:
    kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    control = "public, max-age=300" if cache else "no-cache"
    return FileResponse(path, media_type=kind, headers={**_HEADERS, "Cache-Control": control})


@pages.get("/ui")
async def ui_root() -> Response:
    return RedirectResponse("/ui/", status_code=308)


@pages.get("/ui/")
async def ui_index() -> Response:
    return _file(_asset("index.html"), cache=False)


@pages.get("/ui/{name:path}")
async def ui_asset(name: str) -> Response:
    return _file(_asset(name), cache=not name.endswith(".html"))


@api.get("/me", tags=["ui"], summary="The bearer's identity, role, tenants and allowed actions")
async def me(principal: Principal = viewer) -> dict[str, Any]:
    return {
        "principal": principal.id,
        "role": principal.role,
        "tenants": list(principal.tenants),
        "roles": list(ROLES),
        "may": {action: role_at_least(principal.role, least) for action, least in ACTIONS.items()},
    }


@api.get("/plans/{digest}", tags=["ui"], summary="A compiled plan by its digest")
async def plan_by_digest(
    digest: Digest, request: Request, principal: Principal = viewer
) -> dict[str, Any]:
    p = plane(request)
    plan = await activation.load_plan(p.store, digest)  # 404 activation-unknown-plan
    return {"workflow": plan.name, "version": plan.version, "digest": plan.digest,
            "plan": plan.to_json()}  # fmt: skip


@api.post("/workflows/check", tags=["workflows"],
          summary="Compile a definition and answer its findings (nothing is stored)")  # fmt: skip
async def check_workflow(body: Check, request: Request, principal: Principal = author) -> Any:
    p = plane(request)
    if p.catalog is None:
        raise Problem(503, "no-contracts", "this server was started without a contract catalog")
    result = compile_workflow(body.source, body.filename, p.catalog)
    plan = result.plan
    return {
        "ok": plan is not None,
        "workflow": plan.name if plan is not None else None,
        "digest": plan.digest if plan is not None else None,
        "plan": plan.to_json() if plan is not None else None,
        "errors": len(result.errors),
        "diagnostics": [d.as_dict() for d in result.diagnostics],
    }


@api.get("/fleet", tags=["ui"], summary="Queues waited on, their age, live workers and alerts")
async def fleet(request: Request, principal: Principal = viewer) -> dict[str, Any]:
    p = plane(request)
    now = int(time.time() * 1000)
    live = await p.engine.live_capabilities()
    book = getattr(request.app.state, "alerts", None)
    alerts = (
        [] if book is None else [a.to_json() for a in await asyncio.to_thread(book.list, "open")]
    )
    projection = getattr(request.app.state, "projection", None)
    if projection is None:
        return {"queues": None, "capabilities": live, "alerts": alerts,
                "source": "no search projection on this server: queues are not known"}  # fmt: skip
    query = parse_query("status:running", now, tenants=tuple(tenants_of(principal, None)))
    query = dataclasses.replace(query, limit=500)
    queues: dict[tuple[str, str], dict[str, Any]] = {}
    plans: dict[str, Any] = {}
    seen = 0
    try:
        while seen < FLEET_MAX_RUNS:
            found = await projection.search(query)
            for run in found.runs:
                for name, stage in (run.get("stages") or {}).items():
                    if not isinstance(stage, dict) or stage.get("status") != "queued":
                        continue
                    digest = str(run.get("plan_digest", ""))
                    if digest not in plans:
                        try:
                            plans[digest] = await activation.load_plan(p.store, digest)
                        except activation.ActivationError:
                            plans[digest] = None
                    plan = plans[digest]
                    step = next((s for s in plan.stages if s.name == name), None) if plan else None
                    pin = getattr(step, "capability", None)
                    capability = getattr(pin, "ref", "") if pin is not None else ""
                    queue = str(getattr(step, "queue", None) or _NO_QUEUE[step is None])
                    q = queues.setdefault((queue, capability), {
                        "queue": queue, "capability": capability, "queued": 0,
                        "oldest_queued_at_ms": None, "stages": set()})  # fmt: skip
                    q["queued"] += 1
                    q["stages"].add(f"{run.get('workflow')}/{name}")
                    at = stage.get("dispatched_at_ms")
                    if isinstance(at, int) and (q["oldest_queued_at_ms"] is None
                                                or at < q["oldest_queued_at_ms"]):  # fmt: skip
                        q["oldest_queued_at_ms"] = at
            seen += len(found.runs)
            if len(found.runs) < query.limit:
                break
            last = found.runs[-1]
            query = dataclasses.replace(
                query, after=(int(last["updated_at_ms"]), str(last["run_id"]))
            )
    except StoreError as exc:
        raise Problem(503, "projection-unavailable", f"the search index: {exc}") from None
    out = []
    for q in sorted(queues.values(), key=lambda q: (q["queue"], q["capability"])):
        oldest = q["oldest_queued_at_ms"]
        workers = live.get(q["capability"], []) if q["capability"] else []
        age = max(0, now - oldest) if oldest else None
        # live: None when there is no worker to ask for (an in-engine stage, an unknown plan)
        out.append({**q, "stages": sorted(q["stages"]), "workers": workers,
                    "live": bool(workers) if q["capability"] else None, "age_ms": age})  # fmt: skip
    return {
        "queues": out,
        "capabilities": live,
        "alerts": alerts,
        "runs_read": seen,
        "indexed_through_ms": found.indexed_through_ms,
        "source": "derived index (the search projection: queued stages of running runs)",
    }


ContractName = Annotated[str, PathParam(pattern=r"^[a-z][a-z0-9.-]{0,99}$")]


@api.get("/contracts/{name}/usage", tags=["contracts"],
         summary="A contract's golden fixtures and who uses it")  # fmt: skip
async def contract_usage(
    name: ContractName, request: Request, principal: Principal = viewer
) -> dict[str, Any]:
    p = plane(request)
    if p.contracts is None:
        raise Problem(503, "no-contracts", "this server was started without a repository root")
    every = p.contracts.all()
    if not any(c.name == name for c, _ in every):
        raise Problem(404, "contract-not-found", f"no contract named {name!r}")
    fixtures = await asyncio.to_thread(_fixtures, p.contracts.root / FIXTURES_OUT / name)
    capabilities = []
    for c, _ in every:
        if isinstance(c, CapabilityContract):
            for role, ref in (("request", c.request), ("result", c.result)):
                if ref.name == name:
                    capabilities.append(
                        {"capability": f"{c.name}@{c.version}", "as": role, "contract": str(ref)}
                    )
    workflows = []
    for active in (await list_workflows(request, principal, None))["workflows"]:
        try:
            plan = await activation.load_plan(p.store, str(active["active"]))
        except activation.ActivationError:
            continue
        where = []
        if plan.context_contract and plan.context_contract.split("@")[0] == name:
            where.append(f"context ({plan.context_contract})")
        for stage in plan.stages:
            pin = getattr(stage, "capability", None)
            if pin is None:
                continue
            for role, ref in (("request", pin.request), ("result", pin.result)):
                if str(ref).split("@")[0] == name:
                    where.append(f"stage {stage.name} {role} ({ref}, via {pin.ref})")
            if pin.name == name:
                where.append(f"stage {stage.name} capability ({pin.ref})")
        if where:
            workflows.append({"workflow": plan.name, "version": plan.version,
                              "digest": plan.digest, "uses": where})  # fmt: skip
    return {"name": name, "fixtures": fixtures, "capabilities": capabilities,
            "workflows": workflows}  # fmt: skip


def _fixtures(folder: Path) -> list[dict[str, Any]]:
    """The golden fixtures under ``folder`` (``<version>/<valid|invalid>/<name>.json``)."""
    out: list[dict[str, Any]] = []
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("*/*/*.json")):
        version, kind = path.parent.parent.name, path.parent.name
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            doc = {"description": f"unreadable: {exc}"}
        out.append({
            "version": int(version) if version.isdigit() else version, "kind": kind,
            "name": path.stem, "description": doc.get("description", ""),
            "expect": doc.get("expect"), "message": doc.get("message"),
        })  # fmt: skip
    return out


class _Stored(Protocol):
    def get_path(self, key: str) -> Path: ...  # raises StageFailed when missing or refused


class Objects(Protocol):
    """The part of a ``StorageMap`` this module reads through: one tenant's store behind a ref."""

    def open(self, ref: str | None, tenant: str, *, deadline_ms: int | None = None) -> _Stored: ...


RunIdParam = Annotated[str, PathParam(min_length=1, max_length=128)]
ObjectKey = Annotated[str, Query(min_length=1, max_length=1024, description="an objectKey")]
_IMAGES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
           ".webp": "image/webp", ".gif": "image/gif"}  # fmt: skip


def _previews(run: RunState) -> list[dict[str, Any]]:
    """The ``previews`` the run's recorded stage results name, in stage order."""
    out: list[dict[str, Any]] = []
    for name, stage in run.stages.items():
        listed = (stage.result or {}).get("previews")
        for item in listed if isinstance(listed, list) else []:
            if isinstance(item, dict) and isinstance(item.get("objectKey"), str):
                ref = item.get("storageConnectionRef")
                out.append({"stage": name, "objectKey": item["objectKey"],
                            "previewType": item.get("previewType"),
                            "contentType": item.get("contentType"),
                            "ref": ref if isinstance(ref, str) else None})  # fmt: skip
    return out


@api.get("/runs/{run_id}/previews", tags=["ui"],
         summary="The previews a run's stage results name")  # fmt: skip
async def run_previews(
    run_id: RunIdParam, request: Request, principal: Principal = viewer
) -> dict[str, Any]:
    run = await plane(request).visible_run(principal, run_id)
    shown = [{k: v for k, v in p.items() if k != "ref"} for p in _previews(run)]
    return {"run_id": run.run_id, "previews": shown}


@api.get("/runs/{run_id}/objects", tags=["ui"],
         summary="An object a run's stage result names (a preview image)")  # fmt: skip
async def run_object(
    run_id: RunIdParam, key: ObjectKey, request: Request, principal: Principal = viewer
) -> Response:
    run = await plane(request).visible_run(principal, run_id)  # another tenant's: 404
    named = next((p for p in _previews(run) if p["objectKey"] == key), None)
    if named is None:
        raise Problem(404, "object-not-named", f"no result of run {run.run_id} names {key!r}")
    storage: Objects | None = getattr(request.app.state, "objects", None)
    if storage is None:
        raise Problem(404, "no-object-store", "this server was started without an object store")
    try:
        store = storage.open(named["ref"], run.tenant)  # the run's tenant, never the payload's
        path = await asyncio.to_thread(store.get_path, key)
    except StageFailed as exc:
        raise Problem(404, "object-not-found", f"{key!r}: {exc}") from None
    kind = _IMAGES.get(path.suffix.lower(), "application/octet-stream")
    return FileResponse(path, media_type=kind,
                        headers={"Cache-Control": "private, max-age=300",
                                 "X-Content-Type-Options": "nosniff"})  # fmt: skip
