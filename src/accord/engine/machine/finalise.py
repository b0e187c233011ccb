"""The end of a run: terminal intent, fencing, compensations, finalisers, terminal status.

Setting the intent is a one-way door taken once. From then on the run only winds down: every
live attempt is fenced and asked to stop (its later callbacks are ``late``), completed stages with
a ``compensate`` action are compensated newest first, then finalisers run in declared order.
Each step is an ordinary fenced attempt of a pseudo-stage, started only when the previous one has
concluded, so the order is in the record and survives any crash. :func:`advance` is the single
place that decides what comes next; it is called whenever a pseudo-stage concludes.
"""

from __future__ import annotations

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
    StageState,
    evolve,
)
from accord.workflow.plan import TaskStage

__all__ = ["advance", "fence_live", "pseudo_concluded", "set_intent"]


def set_intent(d: Draft, intent: str, source: str, error: dict[str, Any] | None = None) -> None:
    if d.intent is not None:
        return
    d.intent = intent
    d.set_status("finalising")
    src = d.stages.get(source)
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
    """Fence every live ordinary attempt and request its cooperative cancellation."""
    for name, st in list(d.stages.items()):
        if name.startswith("@") or st.status not in ACTIVE_STAGE:
            continue
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


def pseudo_concluded(d: Draft, name: str, ok: bool) -> None:
    """A compensation or finaliser concluded (its stage record is already updated)."""
    if name.startswith(FINALISER):
        d.finalisers = (*d.finalisers, "completed" if ok else "failed")
    advance(d)


def _start(d: Draft, name: str, kind: str) -> None:
    d.stages[name] = StageState(name=name, kind=kind)
    payload = payload_for(d.plan, d.base, d.stages, name, intent=d.intent, error=d.error)
    start_attempt(d, name, 1, payload, first=True)


def advance(d: Draft) -> None:
    for stage in d.compensations:
        name = COMPENSATE + stage
        st = d.stages.get(name)
        if st is None:
            _start(d, name, "compensation")
            return
        if st.status in ACTIVE_STAGE:
            return
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
