"""Admission: before a trigger starts a run, decide whether it may, and record why.

Every start proposed by a trigger (schedule, webhook, message) — and any caller that asks for
it — goes through :meth:`Admission.start`, which answers with a :class:`Decision`: admitted
with the run id, answered by a run the same key already started, or refused with every reason.
A refusal is an answer, not an error: the HTTP intake turns it into 429 (or 403/409), schedules
write it into their fire record, message intake into its quarantine record; each refusal is
also recorded in the store (status ``admission-refused``) so it can be read back later.

Checks, each with its code:

- ``admission-plan-planned`` — the workflow's active plan is ``planned``, not ``active``;
- ``admission-no-owner`` / ``admission-no-review-date`` / ``admission-review-expired`` — the
  plan's owner and review date are set and the review date has not passed (``today`` is the
  clock's UTC date);
- ``admission-requester-denied`` — the requester (a principal or a trigger source) may not
  start this workflow for this tenant (the ``permits`` answer the caller supplies);
- ``admission-concurrency-workflow`` / ``admission-concurrency-tenant`` — the plan's
  ``budgets.max_concurrent_runs`` (live runs of the workflow) or
  ``max_concurrent_runs_per_tenant`` would be exceeded;
- ``admission-rate-hour`` — ``budgets.max_runs_per_hour`` runs of the workflow were admitted in
  this clock hour (a durable counter per workflow and hour, shared by every engine);
- ``admission-attempts-budget`` — the plan can make more attempts than
  ``budgets.max_attempts_total`` (the sum of its task stages' ``max_attempts``);
- ``admission-deadline-passed`` — the request's own deadline has passed, or is nearer than
  the plan's ``deadline_ms`` allows a run to finish in;
- ``admission-no-live-worker`` / ``admission-no-action`` — a capability the plan needs has no
  live announcement in the fleet (:func:`accord.workflow.admission.admit`, read live).

The records this module writes (refusals, hourly counters) and the schedule records of
:mod:`.schedules` are kept through the ordinary :class:`~accord.engine.ports.Store` port: a
create-only commit (``expected_version=0``) is the durable, cross-engine claim every store
adapter already implements, and a status that is not a run status keeps them out of the
reconciler's sweep.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from accord.engine.ports import Commit, JsonDict, JsonValue, Store, StoredRun
from accord.errors import ConflictError, EngineError, ValidationError
from accord.workflow.plan import Plan, TaskStage

if TYPE_CHECKING:
    from accord.engine.runtime.orchestrator import Engine

__all__ = [
    "REFUSED_STATUS",
    "Admission",
    "Decision",
    "Permits",
    "Refusal",
    "create_record",
    "record_id",
    "update_record",
]

REFUSED_STATUS = "admission-refused"
COUNTER_STATUS = "admission-counter"
LIVE = ("running", "finalising")
KEPT_DECISIONS = 1000  # decisions kept in memory per Admission (a long-lived consumer holds one)
_SEP = "\x1f"

Permits = Callable[[str, str, str], bool]  # (requester, workflow, tenant) → may start


def record_id(prefix: str, *parts: str) -> str:
    """A deterministic store id for a non-run record: ``prefix`` and 24 hex digits."""
    return (
        prefix + hashlib.sha256(_SEP.join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:24]
    )


async def create_record(store: Store, rid: str, state: JsonDict, index: Mapping[str, str]) -> bool:
    """Create ``rid`` if it does not exist: whether this call created it (the durable claim)."""
    try:
        await store.commit(Commit(rid, 0, state, index=dict(index)))
    except ConflictError:
        return False
    return True


async def update_record(
    store: Store,
    rid: str,
    change: Callable[[JsonDict | None], JsonDict | None],
    index: Mapping[str, str],
    *,
    attempts: int = 32,
) -> JsonDict | None:
    """Compare-and-set ``rid`` to ``change(current)`` (``None`` from ``change``: leave it);
    retried on a lost race. The state written, or ``None`` when nothing was."""
    for _ in range(attempts):
        stored: StoredRun | None = await store.load(rid)
        current = stored.state if stored is not None else None
        new = change(dict(current) if current is not None else None)
        if new is None:
            return None
        try:
            await store.commit(Commit(rid, stored.version if stored else 0, new, index=dict(index)))
        except ConflictError:
            continue
        return new
    raise EngineError(f"record {rid}: too many concurrent updates")


@dataclass(frozen=True, slots=True)
class Refusal:
    code: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


@dataclass(frozen=True, slots=True)
class Decision:
    """What admission answered: ``admitted`` (a run was started or already existed, ``run_id``
    names it; ``existing`` when the key's run was there before) or refused with ``reasons``."""

    admitted: bool
    run_id: str | None = None
    existing: bool = False
    reasons: tuple[Refusal, ...] = ()
    workflow: str = ""
    tenant: str = ""
    requester: str = ""
    at_ms: int = 0

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(r.code for r in self.reasons)

    def as_dict(self) -> dict[str, JsonValue]:
        return {
            "admitted": self.admitted,
            "runId": self.run_id,
            "existing": self.existing,
            "reasons": [r.as_dict() for r in self.reasons],  # type: ignore[misc]
            "workflow": self.workflow,
            "tenant": self.tenant,
            "requester": self.requester,
            "atMs": self.at_ms,
        }


def _hour(ms: int) -> int:
    return ms // 3_600_000


def _attempts(plan: Plan) -> int:
    return sum(s.retry.max_attempts for s in plan.stages if isinstance(s, TaskStage))


@dataclass
class Admission:
    """Admission for one engine. ``require_owner`` / ``require_review_date`` enforce the
    plan's governance fields (on by default: a triggered workflow must be owned).

    ``governance`` says where they apply: ``"always"`` (triggers: every start needs an owned,
    reviewed plan) or ``"declared"`` (direct starts — the API, ``accord runs start``, a
    ``run-requested`` message: only a plan that declares an ``owner`` is held to it, and then
    its review date must be set and not passed). Every other check applies to every start."""

    engine: Engine
    require_owner: bool = True
    require_review_date: bool = True
    governance: Literal["always", "declared"] = "always"
    decisions: list[Decision] = field(default_factory=list)  # this process's latest, newest last

    @property
    def store(self) -> Store:
        return self.engine.store

    def _note(self, decision: Decision) -> None:
        """Keep ``decision`` among the newest :data:`KEPT_DECISIONS` (the store has them all)."""
        self.decisions.append(decision)
        if len(self.decisions) > KEPT_DECISIONS:
            del self.decisions[: len(self.decisions) - KEPT_DECISIONS]

    def _today(self) -> str:
        return datetime.fromtimestamp(self.engine.clock.now_ms() / 1000, UTC).date().isoformat()

    async def _live(self, limit: int, **filters: str) -> int:
        count = 0
        for status in LIVE:
            count += len(await self.store.list_runs(limit, status=status, **filters))
        return count

    async def refusals(
        self,
        plan: Plan,
        tenant: str,
        requester: str,
        *,
        permits: Permits | None = None,
        deadline_at_ms: int | None = None,
    ) -> list[Refusal]:
        """Every reason ``plan`` may not start now for ``tenant`` (empty: it may), except the
        hourly rate, which :meth:`start` reserves atomically."""
        out: list[Refusal] = []
        now = self.engine.clock.now_ms()
        if plan.status == "planned":
            out.append(Refusal("admission-plan-planned", f"{plan.name} {plan.version} is planned"))
        governed = self.governance == "always" or bool(plan.owner)
        if governed and self.require_owner and not plan.owner:
            out.append(Refusal("admission-no-owner", f"{plan.name} {plan.version} has no owner"))
        if governed and self.require_review_date:
            if not plan.review_date:
                out.append(Refusal("admission-no-review-date", f"{plan.name} has no review_date"))
            elif plan.review_date < self._today():
                out.append(
                    Refusal(
                        "admission-review-expired",
                        f"{plan.name} was due for review on {plan.review_date}",
                    )
                )
        if permits is not None and not permits(requester, plan.name, tenant):
            out.append(
                Refusal(
                    "admission-requester-denied",
                    f"{requester} may not start {plan.name} for tenant {tenant!r}",
                )
            )
        b = plan.budgets
        if b is not None and b.max_attempts_total is not None:
            most = _attempts(plan)
            if most > b.max_attempts_total:
                out.append(
                    Refusal(
                        "admission-attempts-budget",
                        f"the plan may make {most} attempts; max_attempts_total is "
                        f"{b.max_attempts_total}",
                    )
                )
        if deadline_at_ms is not None:
            need = now + (plan.deadline_ms or 0)
            if deadline_at_ms <= now or (plan.deadline_ms and deadline_at_ms < need):
                out.append(
                    Refusal(
                        "admission-deadline-passed",
                        f"the request's deadline {deadline_at_ms} leaves no time for a run "
                        f"(now {now}, deadline_ms {plan.deadline_ms})",
                    )
                )
        if b is not None and b.max_concurrent_runs is not None:
            live = await self._live(b.max_concurrent_runs + 1, workflow=plan.name)
            if live >= b.max_concurrent_runs:
                out.append(
                    Refusal(
                        "admission-concurrency-workflow",
                        f"{live} runs of {plan.name} are live (max_concurrent_runs "
                        f"{b.max_concurrent_runs})",
                    )
                )
        if b is not None and b.max_concurrent_runs_per_tenant is not None:
            cap = b.max_concurrent_runs_per_tenant
            live = await self._live(cap + 1, workflow=plan.name, tenant=tenant)
            if live >= cap:
                out.append(
                    Refusal(
                        "admission-concurrency-tenant",
                        f"{live} runs of {plan.name} are live for tenant {tenant!r} "
                        f"(max_concurrent_runs_per_tenant {cap})",
                    )
                )
        for d in await self.engine.admit(plan):
            if d.code != "admission-plan-planned":
                out.append(Refusal(d.code, d.message))
        return out

    async def _reserve_hour(self, plan: Plan, run_id: str) -> Refusal | None:
        b = plan.budgets
        if b is None or b.max_runs_per_hour is None:
            return None
        cap = b.max_runs_per_hour
        hour = _hour(self.engine.clock.now_ms())
        rid = record_id("adm_", plan.name, str(hour))
        refused: list[int] = []

        def take(cur: JsonDict | None) -> JsonDict | None:
            doc = cur or {"kind": COUNTER_STATUS, "workflow": plan.name, "hour": hour, "runs": []}
            runs = doc["runs"]
            assert isinstance(runs, list)
            if run_id in runs:
                return None
            if len(runs) >= cap:
                refused.append(len(runs))
                return None
            doc["runs"] = [*runs, run_id]
            return doc

        await update_record(
            self.store, rid, take, {"status": COUNTER_STATUS, "workflow": plan.name}
        )
        if refused:
            return Refusal(
                "admission-rate-hour",
                f"{refused[0]} runs of {plan.name} were admitted this hour "
                f"(max_runs_per_hour {cap})",
            )
        return None

    async def start(
        self,
        workflow: str,
        context: Mapping[str, Any],
        tenant: str,
        *,
        requester: str,
        run_id: str,
        permits: Permits | None = None,
        deadline_at_ms: int | None = None,
        record: Mapping[str, JsonValue] | None = None,
    ) -> Decision:
        """Admit and start a run of ``workflow`` under ``run_id`` (deterministic, so asking
        again is answered by the run the first ask started), or refuse and record why."""
        now = self.engine.clock.now_ms()
        base = {"workflow": workflow, "tenant": tenant, "requester": requester, "at_ms": now}
        try:
            plan = await self.engine.plans.resolve(workflow)
        except EngineError as exc:
            return await self._refuse(
                [Refusal("admission-no-active-plan", str(exc))], run_id, base, record
            )
        base["workflow"] = plan.name  # a start asked for by digest is recorded under the name
        existing = await self.engine.load(run_id)
        if existing is not None:
            decision = Decision(True, run_id, True, (), plan.name, tenant, requester, now)
            self._note(decision)
            return decision
        reasons = await self.refusals(
            plan, tenant, requester, permits=permits, deadline_at_ms=deadline_at_ms
        )
        if not reasons:
            rate = await self._reserve_hour(plan, run_id)
            if rate is not None:
                reasons.append(rate)
        if reasons:
            return await self._refuse(reasons, run_id, base, record)
        try:
            await self.engine.start_run(
                plan.digest, dict(context), tenant, run_id=run_id, requested_by=requester
            )
        except ValidationError as exc:
            return await self._refuse(
                [Refusal("admission-context-invalid", str(exc))], run_id, base, record
            )
        decision = Decision(True, run_id, False, (), plan.name, tenant, requester, now)
        self._note(decision)
        return decision

    async def _refuse(
        self,
        reasons: list[Refusal],
        run_id: str,
        base: Mapping[str, Any],
        record: Mapping[str, JsonValue] | None,
    ) -> Decision:
        decision = Decision(
            False,
            None,
            False,
            tuple(reasons),
            base["workflow"],
            base["tenant"],
            base["requester"],
            base["at_ms"],
        )
        # the run id the start would have had (the decision's own is None: nothing started)
        doc: JsonDict = {**decision.as_dict(), "kind": REFUSED_STATUS, "runId": run_id}
        if record:
            doc["request"] = dict(record)
        rid = record_id("ref_", run_id, str(base["at_ms"]), ",".join(decision.codes))
        index = {"status": REFUSED_STATUS, "workflow": str(base["workflow"])}
        if _storable_tenant(str(base["tenant"])):
            index["tenant"] = str(base["tenant"])
        await create_record(self.store, rid, doc, index)
        self._note(decision)
        return decision

    async def refused(self, workflow: str, limit: int = 100) -> list[JsonDict]:
        """Recorded refusals of ``workflow``, newest first."""
        return [
            s.state
            for s in await self.store.list_runs(limit, status=REFUSED_STATUS, workflow=workflow)
        ]


def _storable_tenant(tenant: str) -> bool:
    return 0 < len(tenant) <= 128
