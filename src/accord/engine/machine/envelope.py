"""Starting attempts: the wire envelope, the dispatch effect and its clocks.

An attempt's envelope is a pure function of the run's identity, the attempt record and the
payload; the payload is a pure function of the run's context and the results of completed stages,
which never change once written. So the record alone is enough to rebuild any live attempt's
dispatch (:func:`rebuild_effect`) — the reconciler re-publishes stranded work with identical ids,
and nothing about an envelope needs storing twice.

Workers are dispatched ``queued`` with a queue deadline; actions, compensations and finalisers run
in the engine, so they start ``running`` with an execution deadline straight away.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from accord.engine.machine import ids
from accord.engine.machine.draft import Draft
from accord.engine.machine.effects import DispatchJob, InvokeAction, RequestCancellation
from accord.engine.machine.state import ACTIVE_ATTEMPT, AttemptState, RunState, StageState, evolve
from accord.workflow.bindings import resolve_inputs
from accord.workflow.plan import (
    ActionPolicy,
    CapabilityPin,
    Plan,
    RetryPolicy,
    TaskStage,
    Timeouts,
)

__all__ = [
    "COMPENSATE",
    "FINALISER",
    "Target",
    "build_envelope",
    "payload_for",
    "pseudo_policy",
    "rebuild_effect",
    "request_cancellation",
    "retry_of",
    "start_attempt",
    "target_of",
]

COMPENSATE = "@compensate/"
FINALISER = "@finaliser/"
PRODUCER = "accord-engine"
_PSEUDO_TIMEOUTS = Timeouts()
_ONE_ATTEMPT = RetryPolicy(max_attempts=1)


class Target(NamedTuple):
    """What a task stage or pseudo-stage dispatches to, and under which clocks."""

    pin: CapabilityPin
    kind: str  # worker | action
    queue: str | None
    timeouts: Timeouts
    branch: str | None


def pseudo_policy(plan: Plan, name: str) -> ActionPolicy | None:
    """The retry policy and clocks a compensation or finaliser was given (``None``: one attempt
    under the default clocks)."""
    if name.startswith(COMPENSATE):
        stage = plan.stage(name[len(COMPENSATE) :])
        assert isinstance(stage, TaskStage) and stage.compensate is not None
        return stage.compensate_policy
    return plan.finaliser_policy(int(name[len(FINALISER) :]))


def retry_of(plan: Plan, name: str) -> RetryPolicy:
    """The retry policy of a task stage or pseudo-stage."""
    if name.startswith("@"):
        policy = pseudo_policy(plan, name)
        return policy.retry if policy is not None else _ONE_ATTEMPT
    stage = plan.stage(name)
    assert isinstance(stage, TaskStage)
    return stage.retry


def target_of(plan: Plan, name: str) -> Target:
    if name.startswith(COMPENSATE):
        stage = plan.stage(name[len(COMPENSATE) :])
        assert isinstance(stage, TaskStage) and stage.compensate is not None
        policy = stage.compensate_policy
        clocks = policy.timeouts if policy is not None else _PSEUDO_TIMEOUTS
        return Target(stage.compensate, "action", None, clocks, stage.branch)
    if name.startswith(FINALISER):
        index = int(name[len(FINALISER) :])
        policy = plan.finaliser_policy(index)
        clocks = policy.timeouts if policy is not None else _PSEUDO_TIMEOUTS
        return Target(plan.finalisers[index], "action", None, clocks, None)
    stage = plan.stage(name)
    assert isinstance(stage, TaskStage)
    queue = (stage.queue or stage.capability.name) if stage.type == "worker" else None
    return Target(stage.capability, stage.type, queue, stage.timeouts, stage.branch)


def request_cancellation(d: Draft, name: str, attempt: AttemptState, reason: str) -> None:
    """Ask the worker running ``attempt`` of ``name`` (already fenced) to stop it."""
    d.emit(
        RequestCancellation(
            job_id=attempt.job_id,
            queue=target_of(d.plan, name).queue,
            stage=name,
            attempt=attempt.attempt,
            fence=attempt.fence,
            reason=reason,
        )
    )


def payload_for(
    plan: Plan,
    run: RunState,
    stages: Mapping[str, StageState],
    name: str,
    *,
    intent: str | None,
    error: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The attempt's input; raises ``BindingError`` when a task's binding cannot resolve."""
    if name.startswith(COMPENSATE):
        done = stages[name[len(COMPENSATE) :]]
        return {
            "stage": done.name,
            "result": done.result or {},
            "idempotencyKey": ids.idempotency_key(run.run_id, done.name),
        }
    if name.startswith(FINALISER):
        return {"runId": run.run_id, "workflow": run.workflow, "intent": intent, "error": error}
    stage = plan.stage(name)
    assert isinstance(stage, TaskStage)
    return resolve_inputs(stage.input, run.context, _Results(stages))


class _Results(Mapping[str, Mapping[str, Any]]):
    """Completed stages' results, looked up on demand (most inputs read only the context)."""

    def __init__(self, stages: Mapping[str, StageState]) -> None:
        self._stages = stages

    def __getitem__(self, name: str) -> Mapping[str, Any]:
        st = self._stages[name]
        if st.status != "completed" or st.result is None:
            raise KeyError(name)
        return st.result

    def __iter__(self) -> Iterator[str]:
        return (n for n, s in self._stages.items() if s.status == "completed" and s.result)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _version(ref: str) -> int:
    _, _, version = ref.rpartition("@")
    return int(version) if version.isdigit() else 0


def build_envelope(
    run: RunState, name: str, attempt: AttemptState, payload: dict[str, Any], target: Target
) -> dict[str, Any]:
    pin, kind, _, timeouts, branch = target
    budget = timeouts.execution_deadline_ms + (
        timeouts.queue_deadline_ms if kind == "worker" else 0
    )
    deadline = attempt.dispatched_at_ms + budget
    if run.deadline_at_ms is not None:
        deadline = min(deadline, run.deadline_at_ms)
    return {
        "messageId": ids.message_id(run.run_id, name, attempt.attempt),
        "messageType": pin.request.rpartition("@")[0] or pin.request,
        "contractVersion": _version(pin.request),
        "correlationId": run.run_id,
        "causationId": f"{run.run_id}#{attempt.caused_by}",
        "producer": PRODUCER,
        "tenant": run.tenant,
        "occurredAt": ids.iso_ms(attempt.dispatched_at_ms),
        "workflow": run.workflow,
        "runId": run.run_id,
        "stage": name,
        "branch": branch,
        "attempt": attempt.attempt,
        "fence": attempt.fence,
        "definitionDigest": run.plan_digest,
        "idempotencyKey": ids.idempotency_key(run.run_id, name),
        "deadline": ids.iso_ms(deadline),
        "resultSchemaVersion": _version(pin.result),
        "traceparent": ids.traceparent(run.run_id, name, attempt.attempt, run.sampled),
        "payload": payload,
    }


def _effect(
    run: RunState, target: Target, name: str, attempt: AttemptState, payload: dict[str, Any]
) -> DispatchJob | InvokeAction:
    pin, kind, queue = target.pin, target.kind, target.queue
    envelope = build_envelope(run, name, attempt, payload, target)
    if kind == "worker":
        return DispatchJob(
            job_id=attempt.job_id, queue=queue or pin.name, capability=pin.ref, envelope=envelope
        )
    return InvokeAction(job_id=attempt.job_id, capability=pin.ref, envelope=envelope)


def start_attempt(
    d: Draft, name: str, number: int, payload: dict[str, Any], *, first: bool = False
) -> None:
    """Issue attempt ``number`` of ``name`` with a fresh fence; dispatch it and arm its clock.
    ``first`` starts a fresh retry budget (first entry, or an operator re-drive)."""
    target = target_of(d.plan, name)
    kind, timeouts = target.kind, target.timeouts
    at = d.at_ms
    fence = ids.fence_for(d.entropy, d.run_id, name, number, d.seq)
    worker = kind == "worker"
    limit = timeouts.queue_deadline_ms if worker else timeouts.execution_deadline_ms
    attempt = AttemptState(
        attempt=number,
        fence=fence,
        status="queued" if worker else "running",
        job_id=ids.job_id(d.run_id, name, number),
        dispatched_at_ms=at,
        caused_by=d.seq,
        accepted_at_ms=None if worker else at,
        deadline_at_ms=at + limit,
    )
    old = d.stages[name]
    d.put(
        evolve(
            old,
            status=attempt.status,
            attempt=number,
            fence=fence,
            progress=0.0,
            attempts=(*old.attempts, attempt),
            first_attempt=number if first else old.first_attempt,
        )
    )
    d.emit(_effect(d.base, target, name, attempt, payload))
    d.timer("queue" if worker else "execution", at + limit, name, number, fence)
    d.telemetry("stage.dispatched", name, attempt=number, capability=target.pin.ref)


def rebuild_effect(plan: Plan, run: RunState, name: str) -> DispatchJob | InvokeAction | None:
    """The dispatch of ``name``'s live attempt, identical to the one first emitted; ``None`` when
    the stage has no live attempt."""
    st = run.stages.get(name)
    cur = st.current if st is not None else None
    if cur is None or cur.status not in ACTIVE_ATTEMPT:
        return None
    payload = payload_for(plan, run, run.stages, name, intent=run.intent, error=run.error)
    return _effect(run, target_of(plan, name), name, cur, payload)
