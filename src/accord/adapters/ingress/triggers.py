"""Trigger intake: signed webhooks at ``POST /v1/triggers/{workflow}/{trigger}`` and message
triggers consumed from a queue of any transport (docs/triggers.md).

**Sources.** A webhook trigger names a ``source``; the sources file (``accord serve
--trigger-sources FILE``, YAML or JSON) gives each its signing keys (``key id → whsec_…``;
several at once is how a secret is rotated), its timestamp tolerance and the tenants it may
start runs for (the first is the default; a request picks another with ``Accord-Tenant``)::

    sources:
      storefront:
        keys: { sf-2026-11: whsec_…, sf-2026-12: whsec_… }
        tenants: [default, acme]
        tolerance_s: 300

**Webhooks.** In order: the workflow's active plan has a ``webhook`` trigger of that name (else
404); its source is configured (else 401 ``unknown-source``); the Standard Webhooks signature
verifies (:class:`~accord.adapters.ingress.webhooks.WebhookVerifier`: 401 ``missing-signature``,
``missing-key-id``, ``unknown-key``, ``timestamp-expired``, ``timestamp-in-future``,
``malformed-signature``, ``bad-signature``; 409 ``replayed``); the body satisfies the trigger's
event contract (else 422 ``event-invalid`` with every failing path, and a recorded rejection:
the body is never started). Then the run id is derived from the tenant and the dedupe key
(``webhook:<workflow>:<trigger>:<dedupe value>``, or the ``webhook-id`` when the trigger
declares no dedupe) by the run-request rule
(:func:`~accord.engine.runtime.requests.request_run_id`), so every delivery with one key
names one run for as long as that run is retained, and admission
(:mod:`accord.engine.runtime.admission`) decides: 202 with the run (``existing`` when a delivery
with the key started it before) or 429 ``admission-refused`` with its reasons.

**Message triggers.** :class:`MessageTriggers` consumes each ``message`` trigger's queue with the
same checks: a body that is not JSON or breaks the event contract, or whose start admission
refuses, is quarantined on ``<queue>.quarantine`` with its reason (never dropped) and
acknowledged; a duplicate key is answered by the run it started.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from accord.adapters.ingress.auth import Principal, authorizer
from accord.adapters.ingress.problems import problem_response
from accord.contracts.validate import Validator
from accord.engine.ports import Delivery, JsonDict, Transport
from accord.engine.runtime.admission import Admission, Decision, create_record, record_id
from accord.engine.runtime.consumer import QueueConsumer
from accord.engine.runtime.requests import request_run_id
from accord.engine.runtime.schedules import (
    Scheduler,
    fire_records,
    next_fire_times,
    set_paused,
    trigger_summary,
)
from accord.engine.runtime.wire import (
    UndecodableJson,
    decode_json,
)
from accord.errors import EngineError
from accord.workflow.plan import Plan
from accord.workflow.triggers import EventTrigger, ScheduleTrigger, event_value, render_context

if TYPE_CHECKING:  # the webhook module needs the `remote` extra: imported when a source is used
    from accord.adapters.ingress.webhooks import ReplayStore, WebhookVerifier
    from accord.engine.runtime.orchestrator import Engine

__all__ = [
    "REJECTED_STATUS",
    "MessageTriggers",
    "SourceConfig",
    "SourcesError",
    "TriggerIntake",
    "TriggerRuntime",
    "TriggerSources",
    "load_sources",
    "message_triggers",
    "mount_triggers",
    "router",
]

log = logging.getLogger("accord.ingress.triggers")
REJECTED_STATUS = "trigger-rejected"
TENANT_HEADER = "accord-tenant"
ID_HEADER = "webhook-id"
MAX_EVENT_BYTES = 1_048_576

router = APIRouter(tags=["triggers"])
viewer = Depends(authorizer("viewer"))
operator = Depends(authorizer("operator"))


class SourcesError(ValueError):
    """A sources file that cannot be used; ``str()`` names the file and the field."""


@dataclass(frozen=True, slots=True)
class SourceConfig:
    name: str
    keys: Mapping[str, str]
    tenants: tuple[str, ...] = ("default",)
    tolerance_s: int = 300


@dataclass(frozen=True, slots=True)
class TriggerSources:
    sources: Mapping[str, SourceConfig] = field(default_factory=dict)
    workflows: tuple[str, ...] = ()  # whose schedules and message triggers this process runs
    tenant: str = "default"  # the tenant schedules and message triggers start runs for

    def get(self, name: str | None) -> SourceConfig | None:
        return self.sources.get(name) if name is not None else None


def _sources_from(doc: Any, where: str) -> TriggerSources:
    if not isinstance(doc, Mapping) or not isinstance(doc.get("sources", {}), Mapping):
        raise SourcesError(f"{where}: a mapping with 'sources' (name → source) is expected")
    unknown_top = set(doc) - {"sources", "workflows", "tenant"}
    if unknown_top:
        raise SourcesError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown_top)))}")
    workflows = doc.get("workflows", [])
    if not isinstance(workflows, list) or not all(isinstance(w, str) and w for w in workflows):
        raise SourcesError(f"{where}: workflows: a list of workflow names is expected")
    tenant = doc.get("tenant", "default")
    if not isinstance(tenant, str) or not tenant:
        raise SourcesError(f"{where}: tenant: a tenant id is expected")
    out: dict[str, SourceConfig] = {}
    for name, spec in (doc.get("sources") or {}).items():
        at = f"{where}: sources.{name}"
        if not isinstance(spec, Mapping):
            raise SourcesError(f"{at}: a mapping is expected")
        unknown = set(spec) - {"keys", "tenants", "tolerance_s"}
        if unknown:
            raise SourcesError(f"{at}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        keys = spec.get("keys")
        if not isinstance(keys, Mapping) or not keys:
            raise SourcesError(f"{at}.keys: at least one key id → whsec_ secret is required")
        for kid, secret in keys.items():
            if not isinstance(secret, str) or not secret.startswith("whsec_"):
                raise SourcesError(f"{at}.keys.{kid}: a whsec_ secret is expected")
        tenants = spec.get("tenants", ["default"])
        if (
            not isinstance(tenants, list)
            or not tenants
            or not all(isinstance(t, str) and t for t in tenants)
        ):
            raise SourcesError(f"{at}.tenants: a non-empty list of tenant ids is expected")
        tolerance = spec.get("tolerance_s", 300)
        if (
            not isinstance(tolerance, int)
            or isinstance(tolerance, bool)
            or not 1 <= tolerance <= 300
        ):
            raise SourcesError(f"{at}.tolerance_s: an integer in [1, 300] is expected")
        out[str(name)] = SourceConfig(
            str(name), {str(k): str(v) for k, v in keys.items()}, tuple(tenants), tolerance
        )
    return TriggerSources(out, tuple(workflows), tenant)


def load_sources(path: Path) -> TriggerSources:
    """Read a sources file (YAML or JSON); :class:`SourcesError` naming what is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SourcesError(f"{path}: cannot be read ({exc.strerror})") from None
    try:
        doc = YAML(typ="safe").load(text)
    except YAMLError as exc:
        raise SourcesError(f"{path}: not YAML or JSON: {exc}") from None
    return _sources_from(doc, str(path))


def _violations(result: Any) -> list[dict[str, str]]:
    return [{"path": v.path or "$", "message": v.message} for v in result.violations]


class TriggerIntake:
    """What the webhook route and message consumers share: sources, verifiers, admission."""

    def __init__(
        self,
        engine: Engine,
        sources: TriggerSources,
        *,
        replay: ReplayStore | None = None,
        admission: Admission | None = None,
    ) -> None:
        self.engine = engine
        self.sources = sources
        self.admission = admission or Admission(engine)
        self._verifiers: dict[str, WebhookVerifier] = {}
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self.replay: ReplayStore | None = replay
        if not sources.sources:
            return
        from accord.adapters.ingress.webhooks import (  # noqa: PLC0415
            MemoryReplayStore,
            WebhookVerifier,
        )

        self.replay = replay or MemoryReplayStore()
        self._verifiers = {
            name: WebhookVerifier(s.keys, tolerance_s=s.tolerance_s, replay=self.replay)
            for name, s in sources.sources.items()
        }

    def verifier(self, source: str) -> WebhookVerifier | None:
        return self._verifiers.get(source)

    def validate(
        self, plan: Plan, trigger: EventTrigger, doc: Any
    ) -> tuple[Any, list[dict[str, str]]]:
        """The normalised event, or the failing paths."""
        catalog = self.engine.catalog
        contract = catalog.message(trigger.event) if catalog is not None else None
        if contract is None:
            return None, [{"path": "$", "message": f"event contract {trigger.event} is unknown"}]
        result = Validator.for_contract(contract).validate(doc)
        if not result.ok:
            return None, _violations(result)
        return result.value, []

    async def reject(
        self,
        plan: Plan,
        trigger: EventTrigger,
        reason: str,
        body: bytes,
        *,
        violations: Any,
        by: str,
    ) -> str:
        """Record a body that may never start a run; the record's id."""
        now = self.engine.clock.now_ms()
        rid = record_id("trj_", plan.name, trigger.name, str(now), by, reason[:200])
        doc: JsonDict = {
            "kind": REJECTED_STATUS,
            "workflow": plan.name,
            "trigger": trigger.name,
            "reason": reason,
            "violations": violations,
            "by": by,
            "atMs": now,
            "body": body[:65536].decode("utf-8", "replace"),
        }
        index = {"status": REJECTED_STATUS, "workflow": plan.name, "trigger": trigger.name}
        await create_record(self.engine.store, rid, doc, index)
        return rid

    async def rejected(self, workflow: str, limit: int = 100) -> list[JsonDict]:
        rows = await self.engine.store.list_runs(limit, status=REJECTED_STATUS, workflow=workflow)
        return [r.state for r in rows]

    def dedupe_key(self, plan: Plan, trigger: EventTrigger, event: Any, fallback: str) -> str:
        if trigger.dedupe is not None:
            value = event_value(event, trigger.dedupe)
            return f"{trigger.type}:{plan.name}:{trigger.name}:{json.dumps(value)}"
        return f"{trigger.type}:{plan.name}:{trigger.name}:id:{fallback}"

    async def start(
        self,
        plan: Plan,
        trigger: EventTrigger,
        event: Any,
        *,
        tenant: str,
        key: str,
        requester: str,
        allowed: Sequence[str],
    ) -> Decision:
        run_id = request_run_id(tenant, key)
        lock, users = self._locks.get(run_id, (asyncio.Lock(), 0))
        self._locks[run_id] = (lock, users + 1)
        try:  # copies of one key arriving at once here are answered one after the other
            async with lock:
                return await self.admission.start(
                    plan.name,
                    render_context(trigger, event),
                    tenant,
                    requester=requester,
                    run_id=run_id,
                    permits=lambda _r, _w, t: t in allowed,
                    record={"trigger": trigger.name, "key": key},
                )
        finally:
            lock, users = self._locks[run_id]
            if users == 1:
                del self._locks[run_id]
            else:
                self._locks[run_id] = (lock, users - 1)


async def _event_trigger(
    engine: Engine, workflow: str, name: str, kind: str
) -> tuple[Plan, EventTrigger] | JSONResponse:
    try:
        plan = await engine.plans.resolve(workflow)
    except EngineError:
        return problem_response(404, "not-found", f"workflow {workflow!r} has no active plan")
    trigger = plan.trigger(name)
    if not isinstance(trigger, EventTrigger) or trigger.type != kind:
        return problem_response(404, "not-found", f"{workflow} has no {kind} trigger {name!r}")
    return plan, trigger


@router.post(
    "/v1/triggers/{workflow}/{trigger}",
    status_code=202,
    summary="Deliver a signed webhook event to a workflow's webhook trigger",
)
async def deliver_webhook(
    request: Request,
    workflow: str = PathParam(..., max_length=64),
    trigger: str = PathParam(..., max_length=64),
) -> JSONResponse:
    intake: TriggerIntake | None = getattr(request.app.state, "triggers", None)
    if intake is None:
        return problem_response(404, "not-found", "no trigger sources are configured")
    found = await _event_trigger(intake.engine, workflow, trigger, "webhook")
    if isinstance(found, JSONResponse):
        return found
    plan, t = found
    source = intake.sources.get(t.source)
    verifier = intake.verifier(t.source or "")
    if source is None or verifier is None:
        return problem_response(401, "unknown-source", f"source {t.source!r} is not configured")
    body = await request.body()
    headers = {k.lower(): v for k, v in request.headers.items()}
    from accord.adapters.ingress.webhooks import Rejected  # noqa: PLC0415

    try:
        verified = verifier.verify(body, headers)
        await verifier.claim(verified)
    except Rejected as exc:
        return problem_response(exc.status, exc.code, exc.detail)
    tenant = headers.get(TENANT_HEADER, "").strip() or source.tenants[0]
    try:
        doc = decode_json(body, max_bytes=MAX_EVENT_BYTES)
    except UndecodableJson as exc:
        rid = await intake.reject(
            plan, t, f"not JSON: {exc}", body, violations=[], by=f"source:{source.name}"
        )
        return problem_response(422, "event-invalid", f"the body is not JSON: {exc}", record=rid)
    event, violations = intake.validate(plan, t, doc)
    if violations:
        said = "; ".join(f"{v['path']}: {v['message']}" for v in violations[:4])
        rid = await intake.reject(
            plan,
            t,
            f"breaks {t.event}: {said}",
            body,
            violations=violations,
            by=f"source:{source.name}",
        )
        return problem_response(
            422,
            "event-invalid",
            f"the event breaks {t.event}: {said}",
            violations=violations,
            record=rid,
        )
    key = intake.dedupe_key(plan, t, event, verified.webhook_id)
    try:
        decision = await intake.start(
            plan,
            t,
            event,
            tenant=tenant,
            key=key,
            requester=f"source:{source.name}",
            allowed=source.tenants,
        )
    except Exception:
        await verifier.release(verified)  # not carried out: the sender may deliver it again
        raise
    if not decision.admitted:
        await verifier.release(verified)  # refused now: the same delivery may be retried later
        said = "; ".join(f"{r.code}: {r.message}" for r in decision.reasons)
        return problem_response(
            429,
            "admission-refused",
            said,
            reasons=[r.as_dict() for r in decision.reasons],
            headers={"Retry-After": "60"},
        )
    return JSONResponse(
        {
            "runId": decision.run_id,
            "existing": decision.existing,
            "workflow": plan.name,
            "trigger": t.name,
            "tenant": tenant,
            "webhookId": headers.get(ID_HEADER, ""),
        },
        status_code=202,
    )


def _engine_of(request: Request) -> Engine:
    engine: Engine = request.app.state.plane.engine
    return engine


async def _schedule_of(
    engine: Engine, workflow: str, name: str
) -> tuple[Plan, ScheduleTrigger] | JSONResponse:
    try:
        plan = await engine.plans.resolve(workflow)
    except EngineError:
        return problem_response(404, "not-found", f"workflow {workflow!r} has no active plan")
    trigger = plan.trigger(name)
    if not isinstance(trigger, ScheduleTrigger):
        return problem_response(404, "not-found", f"{workflow} has no schedule trigger {name!r}")
    return plan, trigger


@router.get("/v1/workflows/{workflow}/triggers", summary="The triggers of a workflow's active plan")
async def list_triggers(
    request: Request, workflow: str = PathParam(..., max_length=64), _p: Principal = viewer
) -> JSONResponse:
    engine = _engine_of(request)
    try:
        plan = await engine.plans.resolve(workflow)
    except EngineError:
        return problem_response(404, "not-found", f"workflow {workflow!r} has no active plan")
    items = await trigger_summary(engine.store, plan, engine.clock.now_ms(), 5)
    return JSONResponse({"workflow": plan.name, "digest": plan.digest, "triggers": items})


@router.get(
    "/v1/workflows/{workflow}/triggers/{trigger}/next", summary="The next fire times of a schedule"
)
async def next_fires(
    request: Request,
    workflow: str = PathParam(..., max_length=64),
    trigger: str = PathParam(..., max_length=64),
    count: int = Query(5, ge=1, le=100),
    _p: Principal = viewer,
) -> JSONResponse:
    engine = _engine_of(request)
    found = await _schedule_of(engine, workflow, trigger)
    if isinstance(found, JSONResponse):
        return found
    plan, t = found
    ticks = next_fire_times(t, engine.clock.now_ms(), count)
    return JSONResponse({"workflow": plan.name, "trigger": t.name, "next": ticks})


@router.get(
    "/v1/workflows/{workflow}/triggers/{trigger}/fires", summary="The fire records of a schedule"
)
async def schedule_fires(
    request: Request,
    workflow: str = PathParam(..., max_length=64),
    trigger: str = PathParam(..., max_length=64),
    limit: int = Query(100, ge=1, le=10_000),
    _p: Principal = viewer,
) -> JSONResponse:
    engine = _engine_of(request)
    found = await _schedule_of(engine, workflow, trigger)
    if isinstance(found, JSONResponse):
        return found
    plan, t = found
    records = await fire_records(engine.store, plan.name, t.name, limit)
    return JSONResponse({"workflow": plan.name, "trigger": t.name, "fires": records})


async def _pause(request: Request, workflow: str, trigger: str, paused: bool) -> JSONResponse:
    engine = _engine_of(request)
    found = await _schedule_of(engine, workflow, trigger)
    if isinstance(found, JSONResponse):
        return found
    plan, t = found
    state = await set_paused(engine.store, plan.name, t.name, paused, engine.clock.now_ms())
    return JSONResponse({"workflow": plan.name, "trigger": t.name, "state": state})


@router.post("/v1/workflows/{workflow}/triggers/{trigger}/pause", summary="Pause a schedule")
async def pause_schedule(
    request: Request,
    workflow: str = PathParam(..., max_length=64),
    trigger: str = PathParam(..., max_length=64),
    _p: Principal = operator,
) -> JSONResponse:
    return await _pause(request, workflow, trigger, True)


@router.post("/v1/workflows/{workflow}/triggers/{trigger}/resume", summary="Resume a schedule")
async def resume_schedule(
    request: Request,
    workflow: str = PathParam(..., max_length=64),
    trigger: str = PathParam(..., max_length=64),
    _p: Principal = operator,
) -> JSONResponse:
    return await _pause(request, workflow, trigger, False)


class MessageTriggers(QueueConsumer):
    """Consumes the queue of one ``message`` trigger of ``workflow``'s active plan."""

    what = "trigger event"
    prefetch = 16

    def __init__(
        self,
        intake: TriggerIntake,
        transport: Transport,
        workflow: str,
        trigger: str,
        queue: str,
        *,
        tenant: str = "default",
    ) -> None:
        super().__init__(transport, queue)
        self.intake, self.workflow, self.trigger, self.tenant = intake, workflow, trigger, tenant
        self.started: list[str] = []

    async def process(self, delivery: Delivery) -> str | None:
        engine = self.intake.engine
        try:
            plan = await engine.plans.resolve(self.workflow)
        except EngineError as exc:
            await self.quarantine(delivery, str(exc))
            return None
        t = plan.trigger(self.trigger)
        if not isinstance(t, EventTrigger) or t.type != "message":
            await self.quarantine(delivery, f"{plan.name} has no message trigger {self.trigger!r}")
            return None
        try:
            doc = decode_json(delivery.body, max_bytes=MAX_EVENT_BYTES)
        except UndecodableJson as exc:
            await self.quarantine(delivery, f"not JSON: {exc}")
            return None
        event, violations = self.intake.validate(plan, t, doc)
        if violations:
            said = "; ".join(f"{v['path']}: {v['message']}" for v in violations[:8])
            await self.quarantine(delivery, f"breaks {t.event}: {said}")
            return None
        key = self.intake.dedupe_key(plan, t, event, delivery.message_id)
        decision = await self.intake.start(
            plan,
            t,
            event,
            tenant=self.tenant,
            key=key,
            requester=f"queue:{self.queue}",
            allowed=(self.tenant,),
        )
        if not decision.admitted:
            said = "; ".join(f"{r.code}: {r.message}" for r in decision.reasons)
            await self.quarantine(delivery, f"admission refused: {said}")
            return None
        await self._transport.ack(delivery)
        assert decision.run_id is not None
        self.started.append(decision.run_id)
        return decision.run_id


def message_triggers(
    intake: TriggerIntake, transport: Transport, plans: Sequence[Plan], tenant: str = "default"
) -> list[MessageTriggers]:
    """A consumer for every ``message`` trigger of ``plans``."""
    return [
        MessageTriggers(intake, transport, p.name, t.name, t.queue, tenant=tenant)
        for p in plans
        for t in p.triggers
        if isinstance(t, EventTrigger) and t.type == "message" and t.queue
    ]


class TriggerRuntime:
    """What ``accord serve --trigger-sources`` runs: the webhook intake on the application and,
    with the engine in the process, the schedules and message triggers of the sources file's
    ``workflows``."""

    def __init__(
        self, intake: TriggerIntake, scheduler: Scheduler | None, consumers: list[MessageTriggers]
    ) -> None:
        self.intake, self.scheduler, self.consumers = intake, scheduler, consumers

    async def stop(self) -> None:
        if self.scheduler is not None:
            await self.scheduler.stop()
        for c in self.consumers:
            await c.stop()
        if self.intake.replay is not None:
            await self.intake.replay.close()


async def mount_triggers(
    app: Any, engine: Engine, path: Path, *, run: bool, replay: ReplayStore | None = None
) -> TriggerRuntime:
    """Load the sources file (:class:`SourcesError` when it cannot be used), put the intake on
    ``app.state.triggers`` and, when ``run``, start the schedules and message consumers."""
    sources = load_sources(path)
    intake = TriggerIntake(engine, sources, replay=replay)
    app.state.triggers = intake
    scheduler: Scheduler | None = None
    consumers: list[MessageTriggers] = []
    if run and sources.workflows:
        scheduler = Scheduler(
            engine, sources.workflows, admission=intake.admission, tenant=sources.tenant
        )
        scheduler.start()
        plans: list[Plan] = []
        for name in sources.workflows:
            try:
                plans.append(await engine.plans.resolve(name))
            except EngineError:
                log.warning("trigger workflow %s has no active plan: its triggers wait", name)
        consumers = message_triggers(intake, engine.transport, plans, sources.tenant)
        for c in consumers:
            c.start()
    return TriggerRuntime(intake, scheduler, consumers)
