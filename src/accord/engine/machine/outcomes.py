"""What happens to an attempt: callbacks, retries, poison, and the operator's cancel and re-drive.

Each handler gets the draft and the event and either changes the draft (accepted) or returns a
refusal ``(reason, note)`` *before* changing anything; :mod:`accord.engine.machine` then discards
the draft and records the refusal. :func:`classify` is the one gate every callback passes: exact
stage, attempt and fence, a live attempt, and no terminal intent for ordinary stages (I2, I3, I5).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from accord.engine.machine import ids
from accord.engine.machine.draft import Draft
from accord.engine.machine.effects import Effect
from accord.engine.machine.envelope import retry_of, target_of
from accord.engine.machine.events import (
    CancelRequested,
    HeartbeatReceived,
    PoisonReported,
    ProgressReported,
    RedriveRequested,
    StageAccepted,
    StageFailed,
    StageSucceeded,
)
from accord.engine.machine.finalise import pseudo_concluded, set_intent
from accord.engine.machine.flow import enter_task, route, route_failure
from accord.engine.machine.state import ACTIVE_ATTEMPT, StageState, evolve
from accord.workflow.kinds.task import evidence_note, missing_evidence
from accord.workflow.plan import TaskStage

__all__ = [
    "ATTEMPTS_BUDGET",
    "Refusal",
    "classify",
    "close",
    "over_budget",
    "pseudo_failed",
    "retries_on",
    "retry_or_fail",
]


class Refusal(NamedTuple):
    """Why an event changes nothing; ``effects`` only ever clear a timer that is dead anyway."""

    reason: str
    note: str
    effects: tuple[Effect, ...] = ()


_Callback = StageAccepted | HeartbeatReceived | ProgressReported | StageSucceeded | StageFailed
_REDRIVABLE = frozenset({"failed", "timed-out", "quarantined", "cancelled"})


def classify(d: Draft, ev: _Callback | PoisonReported) -> Refusal | None:
    st = d.stages.get(ev.stage)
    if st is None or st.current is None:
        return Refusal("unknown-attempt", f"no attempt was issued for stage {ev.stage!r}")
    if d.status != "running" and (d.intent is None or not ev.stage.startswith("@")):
        return Refusal("late", f"run is {d.status} with intent {d.intent}")
    if ev.attempt > st.attempt:
        return Refusal(
            "unknown-attempt", f"attempt {ev.attempt} was never issued (current {st.attempt})"
        )
    if ev.attempt < st.attempt:
        return Refusal("stale", f"attempt {ev.attempt} was superseded by attempt {st.attempt}")
    if ev.fence != st.fence:
        return Refusal("stale", "fence does not match the current attempt")
    status = st.current.status
    if status in ("succeeded", "failed"):
        return Refusal("duplicate", f"attempt {ev.attempt} already {status}")
    if status not in ACTIVE_ATTEMPT:
        return Refusal("stale", f"attempt {ev.attempt} was fenced ({status})")
    return None


def close(d: Draft, name: str, status: str) -> StageState:
    """Conclude the live attempt: stop its clocks and record how it ended."""
    cur = d.stages[name].current
    assert cur is not None
    d.cancel_clocks(name, cur)
    st = d.set_attempt(name, status, finished_at_ms=d.at_ms)
    d.put(st)
    return st


def _accept(d: Draft, name: str) -> None:
    timeouts = target_of(d.plan, name).timeouts
    at, fence = d.at_ms, d.stages[name].fence
    cur = d.stages[name].current
    assert cur is not None
    hb = timeouts.heartbeat_timeout_ms
    st = d.set_attempt(
        name,
        "running",
        accepted_at_ms=at,
        deadline_at_ms=at + timeouts.execution_deadline_ms,
        heartbeat_due_ms=at + hb if hb else None,
    )
    d.put(evolve(st, status="running"))
    d.cancel_timers(name, cur, "queue")
    d.timer("execution", at + timeouts.execution_deadline_ms, name, cur.attempt, fence)
    if hb:
        d.timer("heartbeat", at + hb, name, cur.attempt, fence)


def _alive(d: Draft, name: str) -> None:
    """A sign of life: implicit acceptance when still queued, else re-arm the heartbeat."""
    cur = d.stages[name].current
    assert cur is not None
    if cur.status == "queued":
        _accept(d, name)
        return
    hb = target_of(d.plan, name).timeouts.heartbeat_timeout_ms
    if hb:
        d.put(d.set_attempt(name, heartbeat_due_ms=d.at_ms + hb))
        d.timer("heartbeat", d.at_ms + hb, name, cur.attempt, cur.fence)


def on_accepted(d: Draft, ev: StageAccepted) -> Refusal | None:
    refusal = classify(d, ev)
    if refusal is None and d.stages[ev.stage].status == "running":
        return Refusal("duplicate", "attempt already accepted")
    if refusal is None:
        _accept(d, ev.stage)
    return refusal


def on_heartbeat(d: Draft, ev: HeartbeatReceived) -> Refusal | None:
    refusal = classify(d, ev)
    if refusal is None:
        _alive(d, ev.stage)
    return refusal


def on_progress(d: Draft, ev: ProgressReported) -> Refusal | None:
    refusal = classify(d, ev)
    if refusal is None and not (math.isfinite(ev.progress) and 0.0 <= ev.progress <= 1.0):
        return Refusal("invalid", f"progress {ev.progress!r} is outside [0, 1]")
    if refusal is None:
        _alive(d, ev.stage)
        d.put(evolve(d.stages[ev.stage], progress=ev.progress))
    return refusal


def on_succeeded(d: Draft, ev: StageSucceeded) -> Refusal | None:
    refusal = classify(d, ev)
    if refusal is not None:
        return refusal
    st = close(d, ev.stage, "succeeded")
    stage = None if ev.stage.startswith("@") else d.plan.stage(ev.stage)
    missing = missing_evidence(stage.evidence, ev.result) if isinstance(stage, TaskStage) else []
    if missing:  # a success without its evidence is a terminal failure, never retried
        d.put(evolve(st, result=ev.result, progress=1.0))
        error = {"code": "missing-evidence", "missing": missing, "retryable": False,
                 "attempt": ev.attempt}  # fmt: skip
        route_failure(d, ev.stage, "failed", error)
        return None
    d.put(evolve(st, status="completed", result=ev.result, progress=1.0, released=True))
    d.telemetry("stage.completed", ev.stage, attempt=ev.attempt)
    if isinstance(stage, TaskStage) and stage.evidence:  # the explanation lists it
        d.notes.append(evidence_note(stage.name, stage.evidence, ev.result))
    if ev.stage.startswith("@"):
        pseudo_concluded(d, ev.stage, True)
        return None
    assert isinstance(stage, TaskStage)
    d.completion_order = (*d.completion_order, ev.stage)
    route(d, ev.stage, stage.on_success)
    return None


def pseudo_failed(d: Draft, name: str, status: str, error: dict[str, Any]) -> None:
    d.put(evolve(d.stages[name], status=status, error=error))
    d.telemetry("stage.failed", name, status=status, code=error["code"])
    pseudo_concluded(d, name, False)


def retry_or_fail(d: Draft, name: str, status: str, error: dict[str, Any], eligible: bool) -> None:
    """Schedule the next attempt of a task stage or pseudo-stage while its policy allows, else
    fail it: a task along ``on_failure``, a compensation or finaliser as concluded."""
    retry = retry_of(d.plan, name)
    st = d.stages[name]
    used = st.attempt - st.first_attempt + 1
    if eligible and used < retry.max_attempts and over_budget(d, name):
        b = d.plan.budgets
        assert b is not None and b.max_attempts_total is not None
        error = {
            **error,
            "code": ATTEMPTS_BUDGET,
            "message": f"a retry would exceed the run's max_attempts_total "
            f"{b.max_attempts_total} (attempt {st.attempt} failed with {error['code']})",
            "retryable": False,
        }
        eligible = False
    if eligible and used < retry.max_attempts:
        jitter = ids.unit_random(d.entropy, d.run_id, name, st.attempt, "jitter")
        due = d.at_ms + retry.backoff_ms(used, jitter)
        d.put(evolve(st, status="retry-scheduled", error=error))
        d.timer("retry", due, name, st.attempt, st.fence)
        d.telemetry("stage.failed", name, status="retry-scheduled", code=error["code"], retryAt=due)
    elif name.startswith("@"):
        pseudo_failed(d, name, status, error)
    else:
        route_failure(d, name, status, error)


ATTEMPTS_BUDGET = "attempts-budget-exhausted"


def over_budget(d: Draft, name: str) -> bool:
    """Whether one more attempt of task stage ``name`` would exceed the plan's
    ``budgets.max_attempts_total`` (every task-stage attempt of the run counts, re-drives too)."""
    b = d.plan.budgets
    if b is None or b.max_attempts_total is None or name.startswith("@"):
        return False
    made = sum(st.attempt for stage, st in d.stages.items() if not stage.startswith("@"))
    return made + 1 > b.max_attempts_total


def retries_on(d: Draft, name: str, code: str) -> bool:
    """Whether ``code`` (or the ``retryable`` class) is one ``name``'s policy retries."""
    return bool({"retryable", code} & set(retry_of(d.plan, name).retry_on))


def on_failed(d: Draft, ev: StageFailed) -> Refusal | None:
    refusal = classify(d, ev)
    if refusal is not None:
        return refusal
    close(d, ev.stage, "failed")
    error = {
        "code": ev.code,
        "message": ev.message,
        "retryable": ev.retryable,
        "attempt": ev.attempt,
    }
    retry_or_fail(d, ev.stage, "failed", error, ev.retryable and retries_on(d, ev.stage, ev.code))
    return None


def on_poison(d: Draft, ev: PoisonReported) -> Refusal | None:
    refusal = classify(d, ev)
    if refusal is not None:
        return refusal
    st = close(d, ev.stage, "quarantined")
    meta = {
        "reason": ev.reason,
        "deliveryCount": ev.delivery_count,
        "attempt": ev.attempt,
        "fence": ev.fence,
        "jobId": st.current.job_id if st.current else "",
        "at": ev.at_ms,
    }
    d.put(evolve(st, quarantine=meta))
    error = {"code": "poison", "message": ev.reason, "retryable": False, "attempt": ev.attempt}
    if ev.stage.startswith("@"):
        pseudo_failed(d, ev.stage, "quarantined", error)
    else:
        route_failure(d, ev.stage, "quarantined", error)
    return None


def on_cancel(d: Draft, ev: CancelRequested) -> Refusal | None:
    if d.intent is not None:
        return Refusal("late", f"run already has terminal intent {d.intent}")
    set_intent(d, "failed", "", {"code": "cancelled", "reason": ev.reason, "by": ev.by})
    return None


def on_redrive(d: Draft, ev: RedriveRequested) -> Refusal | None:
    if d.intent is not None:
        return Refusal("invalid", "re-drive needs a run without a terminal intent; start a new run")
    stage = d.plan.stage(ev.stage) if d.plan.has_stage(ev.stage) else None
    if not isinstance(stage, TaskStage):
        return Refusal("invalid", f"{ev.stage!r} is not a task stage of this plan")
    st = d.stages[ev.stage]
    if st.status not in _REDRIVABLE:
        return Refusal(
            "invalid",
            f"stage {ev.stage!r} is {st.status}; only a failed, timed-out, quarantined or "
            "cancelled stage can be re-driven",
        )
    d.notes.append(f"re-drive by {ev.by}")
    enter_task(d, stage, st.attempt + 1, first=True)
    return None
