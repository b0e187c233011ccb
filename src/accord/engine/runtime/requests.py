"""Run intake: ``run-requested@1`` messages from any process become runs.

Starting a run is a message like any other, so any process that can publish to a transport can
start one, in any language, with no Accord code and no engine of its own: it publishes a
``run-requested@1`` document (``schemas/contracts/run-requested.v1.yaml``) on
:data:`RUNS_QUEUE` (``accord.runs``), which every engine consumes. ``accord runs start`` does
exactly that.

**Idempotency.** The run's id is derived from the tenant and the request's ``idempotencyKey``
(:func:`request_run_id`), never drawn at random, so a repeated request (a redelivery, a retried
publish, a client that asks again) names the run the first one started. The request's own
message id is derived from the same pair (:func:`request_message_id`), so a broker that
deduplicates drops the copy before an engine sees it; one that does not delivers it, and the
engine finds the run already there and starts nothing. Two engines taking two copies at once
both try to create it: the store's create-only commit lets one in, and the other's
``run-started`` is recorded in the run's history as a refused duplicate, changing nothing else.
A key reused for another workflow is refused (quarantined), never answered with a run the
requester did not ask for.

**Refusals.** A request that is not JSON, does not satisfy the contract, names a workflow with no
active plan, or carries a context the plan's context contract rejects is quarantined with its
reason on ``accord.runs.quarantine``, as outcome intake does, and acknowledged: it can never
start, and spending its delivery budget would only dead-letter it later. Requesters that want an
answer before publishing check the same things first (``accord runs start`` does, against the
store).

**Admission.** A request the engine could start goes through
:class:`~accord.engine.runtime.admission.Admission` (``governance="declared"``): plan active,
budgets, live capabilities, and owner and review date where the plan declares an owner. A refusal
is an answer, not a bad message: it is recorded in the store (status ``admission-refused``, with
the run id the request names and every reason) and the request is acknowledged, so
``accord runs start`` finds the refusal under its run id and exits 1 with the reasons.

**Platform actions.** The engine that starts a run runs its first action stages, and whichever
engine commits a later transition runs the next ones, so an engine must not start a run whose
plan names an action it has no handler for: the run would fail at once with
``capability-not-registered``. Such a request is returned to the queue (after
:data:`MISSING_ACTION_DELAY_MS`) for an engine that has them, and dead-lettered past the
queue's delivery limit, never dropped. ``accord engine run`` registers the platform actions
unless ``--no-platform``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError as ModelError

from accord.engine.ports import Delivery, Transport
from accord.engine.runtime.admission import Admission
from accord.engine.runtime.consumer import QueueConsumer
from accord.engine.runtime.holding import Hold
from accord.engine.runtime.wire import (
    UndecodableJson,
    decode_json,
)
from accord.errors import EngineError, ValidationError
from accord.generated.run_requested_v1 import RunRequestedV1
from accord.workflow.plan import Plan
from accord.workflow.values import CapabilityPin

if TYPE_CHECKING:
    from accord.engine.runtime.orchestrator import Engine

__all__ = [
    "MAX_REQUEST_BYTES",
    "MISSING_ACTION_DELAY_MS",
    "REQUEST_TYPE",
    "RUNS_QUEUE",
    "RunRequests",
    "action_capabilities",
    "parse_request",
    "request_message_id",
    "request_run_id",
]

RUNS_QUEUE = "accord.runs"  # where every engine takes run-requested@1 messages
REQUEST_TYPE = "run-requested"
MAX_REQUEST_BYTES = 1_048_576  # the contract's maxBytes
MISSING_ACTION_DELAY_MS = 2_000  # a request this engine cannot serve waits this long for another

log = logging.getLogger("accord.engine.runtime.requests")

_SEP = "\x1f"


def _h(*parts: str) -> str:
    return hashlib.sha256(_SEP.join(parts).encode("utf-8", "surrogatepass")).hexdigest()


def request_run_id(tenant: str, idempotency_key: str) -> str:
    """The id of the run a request with this tenant and key starts: ``run_`` and 24 hex digits,
    the shape of a run id drawn at random, so nothing downstream tells them apart."""
    return "run_" + _h("run-request", tenant, idempotency_key)[:24]


def request_message_id(tenant: str, idempotency_key: str) -> str:
    """The message id to publish a request under, so a deduplicating broker keeps one copy (a
    hash: BullMQ restricts the characters of custom job ids)."""
    return "req_" + _h("run-request-message", tenant, idempotency_key)[:32]


class BadRequest(ValueError):
    """A delivery that is not a ``run-requested@1`` message; ``str()`` is the reason."""


def _where(loc: Sequence[int | str]) -> str:
    return ".".join(str(p) for p in loc) or "(message)"


def parse_request(body: bytes) -> RunRequestedV1:
    """The request in ``body``, checked against ``run-requested@1`` through its generated
    binding; :class:`BadRequest` naming every failing field otherwise."""
    try:
        doc = decode_json(body, max_bytes=MAX_REQUEST_BYTES)
    except UndecodableJson as exc:
        raise BadRequest(str(exc)) from None
    if not isinstance(doc, dict):
        raise BadRequest(f"not a {REQUEST_TYPE}@1 message: a JSON object is expected")
    try:
        return RunRequestedV1.model_validate(doc)
    except ModelError as exc:
        said = "; ".join(f"{_where(e['loc'])}: {e['msg']}" for e in exc.errors()[:8])
        raise BadRequest(f"not a valid {REQUEST_TYPE}@1 message: {said}") from None


def action_capabilities(plan: Plan) -> set[str]:
    """Every action capability ``plan`` may run in-process: its action stages, their
    compensations and its finalisers."""
    pins: list[Any] = list(plan.finalisers)
    for stage in plan.stages:
        pins += [getattr(stage, "capability", None), getattr(stage, "compensate", None)]
    return {p.ref for p in pins if isinstance(p, CapabilityPin) and p.kind == "action"}


class _Refused(Exception):
    """The request can never start a run; ``str()`` is the reason it is quarantined with."""


class _Elsewhere(Exception):
    """This engine cannot serve the request, another may: it goes back to the queue."""


class RunRequests(QueueConsumer):
    """Consumes :data:`RUNS_QUEUE` for one engine and starts (or answers) the runs asked for."""

    what = "run request"
    prefetch = 16

    def __init__(
        self, engine: Engine, transport: Transport, *, queue: str = RUNS_QUEUE, hold: Hold
    ) -> None:
        super().__init__(transport, queue, hold)
        self._engine = engine
        self.started = 0  # runs this engine started from requests
        self.answered = 0  # requests answered with a run that already existed
        self.refused = 0  # requests admission refused (each refusal recorded in the store)
        self.admission = Admission(engine, governance="declared")
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  # and its users

    async def process(self, delivery: Delivery) -> str | None:
        """Start or answer the run ``delivery`` asks for and acknowledge it; the run id, or
        ``None`` when the request was quarantined or given back."""
        try:
            request = parse_request(delivery.body)
            run_id = request_run_id(request.tenant, request.idempotencyKey)
            lock, users = self._locks.get(run_id, (asyncio.Lock(), 0))
            self._locks[run_id] = (lock, users + 1)
            try:  # copies of one request taken at once here are answered one after the other
                async with lock:
                    await self._start(request, run_id)
            finally:
                lock, users = self._locks[run_id]
                if users == 1:
                    del self._locks[run_id]
                else:
                    self._locks[run_id] = (lock, users - 1)
        except (BadRequest, _Refused) as exc:
            await self.quarantine(delivery, str(exc))
            return None
        except _Elsewhere as exc:
            log.warning("run request %s given back: %s", delivery.message_id, exc)
            await self._transport.nack(delivery, MISSING_ACTION_DELAY_MS)
            return None
        await self._transport.ack(delivery)
        return run_id

    async def _start(self, request: RunRequestedV1, run_id: str) -> None:
        engine = self._engine
        try:
            plan = await engine.plans.resolve(request.workflow)
        except EngineError as exc:
            raise _Refused(str(exc)) from None
        if await self._answered(request, run_id):
            return
        missing = sorted(action_capabilities(plan) - set(engine.registry.capabilities()))
        if missing:
            raise _Elsewhere(
                f"engine {engine.owner} has no handler for action(s) {', '.join(missing)}"
            )
        context = dict(request.context or {})
        try:
            await engine.check_start(plan.digest, context, request.tenant)
        except ValidationError as exc:
            raise _Refused(str(exc)) from None
        decision = await self.admission.start(
            plan.digest, context, request.tenant, requester=request.requester, run_id=run_id,
            record={"workflow": request.workflow, "idempotencyKey": request.idempotencyKey,
                    "queue": self.queue},
        )  # fmt: skip
        if not decision.admitted:  # an answer, recorded by admission; the request is settled
            self.refused += 1
            log.warning("run request %s refused by admission: %s", run_id,
                        "; ".join(f"{r.code}: {r.message}" for r in decision.reasons))  # fmt: skip
            return
        run = await engine.load(run_id)
        if run is None or run.plan_digest != plan.digest:  # another engine's request won the race
            await self._answered(request, run_id)
            return
        self.started += 1
        log.info("run %s of %s started for %s (key %r)", run_id, plan.name, request.requester,
                 request.idempotencyKey)  # fmt: skip

    async def _answered(self, request: RunRequestedV1, run_id: str) -> bool:
        """Whether the key's run exists already (the request is then answered by it); refused
        when that run is of another workflow than the request names."""
        existing = await self._engine.load(run_id)
        if existing is None:
            return False
        if request.workflow not in (existing.workflow, existing.plan_digest):
            raise _Refused(
                f"idempotency key {request.idempotencyKey!r} of tenant {request.tenant!r} "
                f"already started run {run_id} of workflow {existing.workflow!r}"
            )
        self.answered += 1
        return True
