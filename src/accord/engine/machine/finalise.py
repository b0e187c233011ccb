"""The end of a run: terminal intent, fencing, compensations, finalisers, terminal status.

Setting the intent is a one-way door taken once. From then on the run only winds down: every
live attempt is fenced and asked to stop (its later callbacks are ``late``), completed stages with
a ``compensate`` action are compensated newest first, then finalisers run in declared order.
Each step is an ordinary fenced attempt of a pseudo-stage, started only when the previous one has
concluded, so the order is in the record and survives any crash. :func:`advance` is the single
place that decides what comes next; it is called whenever a pseudo-stage concludes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from accord.engine.machine import ids
from accord.engine.machine.draft import Draft
from accord.engine.machine.effects import CancelTimer
from accord.engine.machine.envelope import (
    COMPENSATE,
    FINALISER,
    payload_for,
    request_cancellation,
    start_attempt,
)
from accord.engine.machine.state import (
    ACTIVE_ATTEMPT,
    ACTIVE_STAGE,
    RUN_TERMINAL,
    WAITING,
    StageState,
    evolve,
)
from accord.workflow.kinds.task import evidence_note, missing_evidence
from accord.workflow.plan import TaskStage

__all__ = [
    "advance",
    "fence_live",
    "fence_stage",
    "needs_reconciliation",
    "pseudo_concluded",
    "restart_pseudo",
    "set_intent",
]

_UNDONE = frozenset({"failed", "timed-out", "quarantined"})


def set_intent(d: Draft, intent: str, source: str, error: dict[str, Any] | None = None) -> None:
    if d.intent is not None:
        return
    src = d.stages.get(source)
    if intent == "completed" and d.plan.evidence:
        missing = missing_evidence(d.plan.evidence, src.result if src is not None else None)
        if missing:  # the run's own evidence: completing without it is a terminal failure
            intent, error = "failed", {"code": "missing-evidence", "missing": missing,
                                       "stage": source}  # fmt: skip
        else:
            d.notes.append(evidence_note("the run", d.plan.evidence, src.result if src else None))
    d.intent = intent
    d.set_status("finalising")
    if intent == "completed":
        d.result = dict(src.result) if src is not None and src.result else {}
    else:
        cause = src.error if src is not None and src.error else {"code": "failed"}
        d.error = error if error is not None else {"stage": source, **cause}
    if d.base.deadline_at_ms is not None:
        d.emit(CancelTimer(timer_id=ids.timer_id(d.run_id, "", 0, "run")))
    d.telemetry("run.intent", intent=intent, source=source)
    fence_live(d, f"terminal intent {intent}")
    if intent == "failed":
        d.compensations = tuple(
            name
            for name in reversed(d.completion_order)
            if isinstance(stage := d.plan.stage(name), TaskStage) and stage.compensate is not None
        )
    advance(d)


def fence_live(d: Draft, reason: str) -> None:
    """Fence every live ordinary attempt and request its cooperative cancellation; cancel every
    waiting approval gate and its timer."""
    for name in list(d.stages):
        if not name.startswith("@"):
            fence_stage(d, name, reason)


def fence_stage(d: Draft, name: str, reason: str) -> bool:
    """Fence stage ``name`` if it is live (request cancellation of its attempt, stop its clocks)
    or waiting at a gate (stop its timer); ``False`` when there was nothing to stop."""
    st = d.stages[name]
    if st.status == WAITING:
        d.emit(CancelTimer(timer_id=ids.timer_id(d.run_id, name, st.attempt, "approval")))
        d.put(evolve(st, status="cancelled"))
        return True
    if st.status not in ACTIVE_STAGE:
        return False
    cur = st.current
    assert cur is not None
    if cur.status in ACTIVE_ATTEMPT:
        request_cancellation(d, name, cur, reason)
        d.cancel_clocks(name, cur)
        fenced = d.set_attempt(name, "cancelled", finished_at_ms=d.at_ms)
    else:
        d.cancel_timers(name, cur, "retry")
        fenced = st
    d.put(evolve(fenced, status="cancelled"))
    return True


def pseudo_concluded(d: Draft, name: str, ok: bool) -> None:
    """A compensation or finaliser concluded (its stage record is already updated)."""
    if name.startswith(FINALISER):
        d.finalisers = (*d.finalisers, "completed" if ok else "failed")
    advance(d)


def _start(d: Draft, name: str, kind: str) -> None:
    d.stages[name] = StageState(name=name, kind=kind)
    payload = payload_for(d.plan, d.base, d.stages, name, intent=d.intent, error=d.error)
    start_attempt(d, name, 1, payload, first=True)


def restart_pseudo(d: Draft, name: str, number: int) -> None:
    """Attempt ``number`` of a compensation or finaliser, after a retry's backoff."""
    payload = payload_for(d.plan, d.base, d.stages, name, intent=d.intent, error=d.error)
    start_attempt(d, name, number, payload)


def needs_reconciliation(stages: Mapping[str, StageState], order: tuple[str, ...]) -> list[str]:
    """The stages (of ``order``, the run's compensations) whose compensation ended without
    succeeding after its retries: their effects may still stand."""
    return [s for s in order if (c := stages.get(COMPENSATE + s)) and c.status in _UNDONE]


def advance(d: Draft) -> None:
    for stage in d.compensations:
        name = COMPENSATE + stage
        st = d.stages.get(name)
        if st is None:
            _start(d, name, "compensation")
            return
        if st.status in ACTIVE_STAGE:
            return
    undone = needs_reconciliation(d.stages, d.compensations)
    if undone and d.error is not None and "needs_reconciliation" not in d.error:
        d.error = {**d.error, "needs_reconciliation": undone}
        d.telemetry("run.needs-reconciliation", stages=undone)
    index = len(d.finalisers)
    if index < len(d.plan.finalisers):
        name = f"{FINALISER}{index}"
        if name not in d.stages:
            _start(d, name, "finaliser")
        return
    _finish(d)


def _finish(d: Draft) -> None:
    if d.intent == "completed" and all(f == "completed" for f in d.finalisers):
        status = "completed"
    elif d.error is not None and d.error.get("code") == "cancelled":
        status = "cancelled"
    else:
        policy = d.plan.terminal_policy.finaliser_failure_terminal
        status = policy if policy in RUN_TERMINAL and policy != "completed" else "failed"
        if d.intent == "completed":
            d.error = {"code": "finaliser-failed", "finalisers": list(d.finalisers)}
    d.set_status(status)
    d.telemetry("run.terminal", status=status, intent=d.intent)
