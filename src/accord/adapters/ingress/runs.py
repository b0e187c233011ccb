"""``/v1/runs``: start, list, read, explain, follow (SSE), cancel and re-drive runs.

Starting is idempotent on ``(tenant, Idempotency-Key)``: the run id is derived from the pair as
``accord runs start`` derives it (:func:`~accord.engine.runtime.requests.request_run_id`), and
the control file binds the pair to the digest of the body
(:meth:`~accord.adapters.ingress.control.ControlStore.claim`): the same body again answers the
same run (200), another body under the same key is refused (409 ``idempotency-key-reused``).
The run's tenant is the principal's (one it names when it has several), never the context's.

Every start goes through admission (:class:`~accord.engine.runtime.admission.Admission`, with
``governance="declared"``): a refusal is ``429 admission-refused`` with ``reasons`` (each code
and message), recorded in the store, and the idempotency key is released. When starts go by the
queue, admission is checked here and again by the engine that takes the request.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, NoReturn

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from accord.adapters.ingress.auth import Principal, authorizer, chosen_tenant, tenants_of
from accord.adapters.ingress.plane import Plane, plane
from accord.adapters.ingress.problems import Problem
from accord.canonical import canonical_json
from accord.contracts.redact import scrub
from accord.engine.machine.explain import explain_history, migrations
from accord.engine.machine.state import RUN_STATUSES, HistoryEntry, RunState
from accord.engine.runtime.admission import Admission, Refusal
from accord.engine.runtime.requests import (
    RUNS_QUEUE,
    parse_request,
    request_message_id,
    request_run_id,
)
from accord.errors import EngineError

__all__ = ["StartRun", "router", "summary"]

router = APIRouter(prefix="/v1/runs", tags=["runs"])

viewer = Depends(authorizer("viewer"))
operator = Depends(authorizer("operator"))
RunId = Annotated[str, Path(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]
StageName = Annotated[str, Path(min_length=1, max_length=128)]
KEY_CHARS = r"^[\x21-\x7e]{1,200}$"  # printable ASCII, no space
MAX_MS = 2**53
SSE_POLL_S = 0.25
SSE_KEEPALIVE_S = 15.0


class StartRun(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workflow: str = Field(min_length=1, max_length=200, description="name (active) or sha256:…")
    context: dict[str, Any] = Field(default_factory=dict, description="the run's context")
    tenant: str | None = Field(
        None, min_length=1, max_length=63, description="one of the principal's tenants"
    )


class CancelRun(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field("", max_length=1000)


def summary(run: RunState, **more: Any) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "status": run.status,
        "intent": run.intent,
        "workflow": run.workflow,
        "tenant": run.tenant,
        "plan_digest": run.plan_digest,
        "started_at_ms": run.started_at_ms,
        "stages": {name: s.status for name, s in run.stages.items()},
        **more,
    }


def _iso(ms: int) -> str:
    return f"{datetime.fromtimestamp(ms // 1000, tz=UTC):%Y-%m-%dT%H:%M:%S}.{ms % 1000:03d}Z"


@router.post("", status_code=201, summary="Start a run (idempotent with Idempotency-Key)")
async def start_run(
    body: StartRun,
    request: Request,
    response: Response,
    principal: Principal = operator,
    idempotency_key: Annotated[
        str | None, Header(alias="Idempotency-Key", pattern=KEY_CHARS)
    ] = None,
) -> dict[str, Any]:
    p = plane(request)
    tenant = chosen_tenant(principal, body.tenant)
    key = idempotency_key or f"api-{secrets.token_hex(16)}"
    run_id = request_run_id(tenant, key)
    try:  # what the engine would refuse is refused here, before the key is claimed
        await p.engine.check_start(body.workflow, body.context, tenant)
    except EngineError as exc:
        raise Problem(422, "workflow-not-active", str(exc), workflow=body.workflow) from None
    try:
        text = canonical_json({"workflow": body.workflow, "context": body.context})
    except (TypeError, ValueError) as exc:  # check_start refuses these first; stay safe
        raise Problem(422, "context-not-json", f"body.context: {exc}") from None
    digest = hashlib.sha256(text).hexdigest()
    claimed = p.control.claim(tenant, key, digest, run_id)
    if claimed is not None and claimed != digest:
        raise Problem(
            409, "idempotency-key-reused", f"idempotency key {key!r} already started run "
            f"{run_id} with another request body", run_id=run_id,
        )  # fmt: skip
    existing = await p.engine.load(run_id)
    if existing is not None:
        if body.workflow not in (existing.workflow, existing.plan_digest):
            raise Problem(
                409, "idempotency-key-reused", f"idempotency key {key!r} already started run "
                f"{run_id} of workflow {existing.workflow!r}", run_id=run_id,
            )  # fmt: skip
        response.status_code = 200
        return summary(existing, state="existing", idempotency_key=key)
    if claimed is not None:  # the same request is being started by another call right now
        response.status_code = 202
        return {"run_id": run_id, "status": None, "state": "starting", "tenant": tenant,
                "idempotency_key": key}  # fmt: skip
    try:
        state = await _start(p, body, principal, tenant=tenant, key=key, run_id=run_id)
    except BaseException:
        p.control.release(tenant, key)
        raise
    p.audit(request, principal, tenant, "run.start", run_id, workflow=body.workflow,
            idempotency_key=key, state=state)  # fmt: skip
    response.headers["Location"] = f"/v1/runs/{run_id}"
    run = await p.engine.load(run_id)
    if run is None:
        response.status_code = 202
        return {"run_id": run_id, "status": None, "state": state, "tenant": tenant,
                "idempotency_key": key}  # fmt: skip
    return summary(run, state=state, idempotency_key=key)


async def _start(
    p: Plane, body: StartRun, principal: Principal, *, tenant: str, key: str, run_id: str
) -> str:
    admission = Admission(p.engine, governance="declared")
    if p.starts == "engine":
        decision = await admission.start(
            body.workflow, body.context, tenant, requester=principal.id[:128], run_id=run_id,
            record={"workflow": body.workflow, "idempotencyKey": key, "via": "api"},
        )  # fmt: skip
        if not decision.admitted:
            _admission_refused(decision.reasons, body.workflow, run_id)
        return "started"
    try:  # the engine that takes the request decides again; refuse here what it would refuse
        plan = await p.engine.plans.resolve(body.workflow)
    except EngineError as exc:
        raise Problem(422, "workflow-not-active", str(exc)) from None
    reasons = await admission.refusals(plan, tenant, principal.id[:128])
    # in-process actions are the engines' to have: one without them gives the request back
    reasons = [r for r in reasons if r.code != "admission-no-action"]
    if reasons:
        _admission_refused(reasons, body.workflow, run_id)
    request = {
        "workflow": body.workflow,
        "context": body.context,
        "tenant": tenant,
        "idempotencyKey": key,
        "requester": principal.id[:128],
        "requestedAt": _iso(time.time_ns() // 1_000_000),
    }
    payload = json.dumps(request, ensure_ascii=False, sort_keys=True).encode("utf-8")
    parse_request(payload)  # the contract, as the engines will read it
    await p.engine.transport.publish(RUNS_QUEUE, request_message_id(tenant, key), payload)
    return "queued"


def _admission_refused(reasons: Sequence[Refusal], workflow: str, run_id: str) -> NoReturn:
    """429 ``admission-refused``: a refused start is an answer, with every reason."""
    said = "; ".join(f"{r.code}: {r.message}" for r in reasons)
    raise Problem(
        429, "admission-refused", f"admission refused the start of {workflow!r}: {said}",
        reasons=[r.as_dict() for r in reasons], workflow=workflow, run_id=run_id,
    )  # fmt: skip


def _cursor(run: RunState) -> str:
    raw = json.dumps([run.started_at_ms, run.run_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _uncursor(text: str) -> tuple[int, str]:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        at, rid = json.loads(raw)
        if isinstance(at, int) and isinstance(rid, str):
            return at, rid
    except (ValueError, TypeError):
        pass
    raise Problem(422, "cursor-invalid", "the cursor is not one this API returned")


@router.get("", summary="List runs, newest first, with filters and a cursor")
async def list_runs(  # noqa: PLR0917 - FastAPI maps each parameter
    request: Request,
    principal: Principal = viewer,
    workflow: Annotated[str | None, Query(max_length=200)] = None,
    digest: Annotated[str | None, Query(max_length=100, description="plan digest")] = None,
    status: Annotated[str | None, Query(max_length=32)] = None,
    tenant: Annotated[list[str] | None, Query(max_length=63)] = None,
    started_after: Annotated[int | None, Query(ge=0, le=MAX_MS, description="epoch ms")] = None,
    started_before: Annotated[int | None, Query(ge=0, le=MAX_MS, description="epoch ms")] = None,
    stage: Annotated[str | None, Query(max_length=128, description="with stage_status")] = None,
    stage_status: Annotated[str | None, Query(max_length=32)] = None,
    limit: Annotated[int | None, Query(ge=1)] = None,
    cursor: Annotated[str | None, Query(max_length=400)] = None,
) -> dict[str, Any]:
    p = plane(request)
    size = _page(limit, p.limits.page_default, p.limits.page_max, "limit")
    filters = {k: v for k, v in (("workflow", workflow), ("status", status)) if v is not None}
    found: dict[str, RunState] = {}
    for t in tenants_of(principal, tenant):
        for stored in await p.store.list_runs(p.limits.scan_max, tenant=t, **filters):
            if stored.state.get("status") not in RUN_STATUSES:
                continue  # a schedule's fire, an admission refusal: records, not runs
            run = RunState.from_json(stored.state)
            found[run.run_id] = run
    after = _uncursor(cursor) if cursor else None

    def keep(run: RunState) -> bool:
        if digest is not None and run.plan_digest != digest:
            return False
        if started_after is not None and run.started_at_ms < started_after:
            return False
        if started_before is not None and run.started_at_ms >= started_before:
            return False
        if stage_status is not None:
            if stage is None:
                stages = list(run.stages.values())
            else:
                stages = [run.stages[stage]] if stage in run.stages else []
            if not any(s.status == stage_status for s in stages):
                return False
        if after is not None:  # newest first: strictly older than the cursor's run
            return (run.started_at_ms, run.run_id) < after
        return True

    ordered = sorted(
        (r for r in found.values() if keep(r)),
        key=lambda r: (r.started_at_ms, r.run_id),
        reverse=True,
    )
    page = ordered[:size]
    more = len(ordered) > size
    return {
        "runs": [summary(r) for r in page],
        "next_cursor": _cursor(page[-1]) if more and page else None,
    }


def _page(asked: int | None, default: int, most: int, name: str) -> int:
    if asked is None:
        return default
    if asked > most:
        raise Problem(422, "page-too-large", f"{name} may be at most {most}", max_page_size=most)
    return asked


@router.get("/{run_id}", summary="A run's record (sensitive values masked)")
async def get_run(run_id: RunId, request: Request, principal: Principal = viewer) -> Any:
    p = plane(request)
    run = await p.visible_run(principal, run_id)
    doc, _, _ = await p.shown(run)
    return doc


@router.get("/{run_id}/history", summary="A run's history, paged by sequence number")
async def run_history(
    run_id: RunId,
    request: Request,
    principal: Principal = viewer,
    after: Annotated[int, Query(ge=-1, le=MAX_MS, description="entries with seq > after")] = -1,
    limit: Annotated[int | None, Query(ge=1)] = None,
) -> dict[str, Any]:
    p = plane(request)
    size = _page(limit, p.limits.history_default, p.limits.history_max, "limit")
    run = await p.visible_run(principal, run_id)
    _, entries, _ = await p.shown(run)
    later = [e for e in entries if int(e.get("seq", -1)) > after]
    page = later[:size]
    more = len(later) > size
    return {"entries": page, "next_after": page[-1]["seq"] if more and page else None}


@router.get("/{run_id}/explanation", summary="How the run reached its state, from its history")
async def explain(run_id: RunId, request: Request, principal: Principal = viewer) -> Any:
    p = plane(request)
    run = await p.visible_run(principal, run_id)
    _, _, pattern = await p.shown(run)
    entries = [HistoryEntry.from_json(h) for h in await p.store.history(run_id)]
    lines = [scrub(line, pattern) for line in explain_history(run, entries)]
    moves = scrub(migrations(run, entries), pattern)
    return {"run_id": run_id, "status": run.status, "explanation": lines, "migrations": moves}


@router.post("/{run_id}/cancel", summary="Ask for a run's cancellation (recorded with who)")
async def cancel(
    run_id: RunId, request: Request, body: CancelRun | None = None, principal: Principal = operator
) -> Any:
    p = plane(request)
    run = await p.visible_run(principal, run_id)
    reason = body.reason if body is not None else ""
    done = await p.engine.cancel(run_id, reason, by=principal.id)
    _refused(done.history, run_id)
    p.audit(request, principal, run.tenant, "run.cancel", run_id, reason=reason)
    return summary(done.run) if done.run is not None else {"run_id": run_id}


@router.post(
    "/{run_id}/stages/{stage}/redrive", summary="Re-drive a failed stage: a new fenced attempt"
)
async def redrive(
    run_id: RunId, stage: StageName, request: Request, principal: Principal = operator
) -> Any:
    p = plane(request)
    run = await p.visible_run(principal, run_id)
    if stage not in run.stages:
        raise Problem(404, "stage-not-found", f"run {run_id!r} has no stage {stage!r}")
    done = await p.engine.redrive(run_id, stage, by=principal.id)
    _refused(done.history, run_id)
    p.audit(request, principal, run.tenant, "run.redrive", f"{run_id}/{stage}", stage=stage)
    return summary(done.run) if done.run is not None else {"run_id": run_id}


def _refused(history: tuple[HistoryEntry, ...], run_id: str) -> None:
    refused = [h for h in history if not h.accepted]
    if refused:
        h = refused[0]
        raise Problem(
            409, "refused-by-run", f"refused by the run's rules: {h.reason} ({h.note})",
            reason=h.reason, run_id=run_id,
        )  # fmt: skip


# -- Server-Sent Events -----------------------------------------------------------------------


@router.get(
    "/{run_id}/events",
    summary="The run's history as it happens (SSE; resumable with Last-Event-ID)",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def events(
    run_id: RunId,
    request: Request,
    principal: Principal = viewer,
    last_event_id: Annotated[
        str | None, Header(alias="Last-Event-ID", max_length=20, pattern=r"^-?[0-9]+$")
    ] = None,
    after: Annotated[int | None, Query(ge=-1, le=MAX_MS)] = None,
) -> StreamingResponse:
    p = plane(request)
    run = await p.visible_run(principal, run_id)
    start = int(last_event_id) if last_event_id is not None else after if after is not None else -1
    return StreamingResponse(
        _stream(p, request, run, start),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _stream(p: Plane, request: Request, run: RunState, after: int) -> AsyncIterator[str]:
    """Each history entry with ``seq > after`` as an event whose id is its ``seq``; when the
    run has ended and every entry was sent, an ``end`` event, and the stream closes."""
    run_id = run.run_id
    wake = p.waker(run_id)
    last_sent = time.monotonic()
    try:
        yield "retry: 1000\n\n"
        while True:
            wake.clear()
            current = await p.engine.load(run_id)
            if current is None:
                yield f"event: end\ndata: {json.dumps({'run_id': run_id, 'status': None})}\n\n"
                return
            _, entries, _ = await p.shown(current)
            for entry in entries:
                seq = int(entry.get("seq", -1))
                if seq > after:
                    data = json.dumps(entry, separators=(",", ":"), default=str)
                    yield f"id: {seq}\nevent: history\ndata: {data}\n\n"
                    after = seq
                    last_sent = time.monotonic()
            if current.terminal:
                end = {"run_id": run_id, "status": current.status}
                yield f"event: end\ndata: {json.dumps(end)}\n\n"
                return
            if await request.is_disconnected():
                return
            if time.monotonic() - last_sent > SSE_KEEPALIVE_S:
                yield ": keep-alive\n\n"
                last_sent = time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), SSE_POLL_S)
    finally:
        p.drop_waker(run_id, wake)
