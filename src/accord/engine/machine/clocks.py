"""Clocks: a fired timer either expires a live attempt, starts a scheduled retry, or ends an
undecided run — or it is a recorded no-op.

A timer carries the stage, attempt and fence it was armed for, so a firing for anything but the
current, still-waiting attempt is stale by construction. A firing earlier than the attempt's
recorded due time means the timer was re-armed under the same id (heartbeats) and the old claim
raced the new one: the record wins and the timer stays armed. Every other no-op also drops the
timer (``CancelTimer``), because a store removes a timer only when a commit cancels it.

An expired attempt is fenced first — cooperative cancellation is requested and its later callbacks
are ``stale`` — and only then retried (when ``timeout`` is in ``retry_on`` and attempts are left)
or failed along ``on_failure``.
"""

from __future__ import annotations

from accord.engine.machine import gates
from accord.engine.machine.draft import Draft
from accord.engine.machine.effects import CancelTimer
from accord.engine.machine.envelope import request_cancellation, retry_of
from accord.engine.machine.events import TimerFired
from accord.engine.machine.finalise import restart_pseudo, set_intent
from accord.engine.machine.flow import enter_task
from accord.engine.machine.outcomes import Refusal, close, retry_or_fail
from accord.workflow.plan import TaskStage

__all__ = ["on_timer"]


def on_timer(d: Draft, ev: TimerFired) -> Refusal | None:
    """A due timer. One that no longer applies is a recorded no-op that also drops the timer,
    except one re-armed under the same id (a heartbeat): that one stays armed."""
    drop = (CancelTimer(timer_id=ev.timer_id),)
    if ev.timer == "run":
        deadline = d.base.deadline_at_ms
        if d.intent is not None or deadline is None:
            return Refusal("stale", "run deadline no longer applies", drop)
        if ev.at_ms < deadline:
            return Refusal("stale", "run deadline not yet due")
        d.emit(drop[0])
        set_intent(d, "failed", "", {"code": "run-deadline", "deadlineAt": deadline})
        return None
    if ev.timer == "approval":
        return gates.on_timer(d, ev)
    st = d.stages.get(ev.stage)
    cur = st.current if st is not None else None
    if st is None or cur is None:
        return Refusal("unknown-attempt", f"no attempt was issued for {ev.stage!r}", drop)
    if ev.attempt != st.attempt or ev.fence != st.fence:
        return Refusal("stale", f"{ev.timer} timer of an earlier attempt", drop)
    if ev.timer == "retry":
        if st.status != "retry-scheduled":
            return Refusal("stale", f"no retry is scheduled (stage is {st.status})", drop)
        d.emit(drop[0])
        if ev.stage.startswith("@"):  # a compensation or finaliser under its own policy
            restart_pseudo(d, ev.stage, st.attempt + 1)
            return None
        stage = d.plan.stage(ev.stage)
        assert isinstance(stage, TaskStage)
        enter_task(d, stage, st.attempt + 1, first=False)
        return None
    want = "queued" if ev.timer == "queue" else "running"
    due = cur.heartbeat_due_ms if ev.timer == "heartbeat" else cur.deadline_at_ms
    if cur.status != want:
        return Refusal("stale", f"{ev.timer} timer fired for an attempt that is {cur.status}", drop)
    if due is None or ev.at_ms < due:
        return Refusal("stale", f"{ev.timer} timer not yet due (re-armed)")
    _time_out(d, ev.stage, ev.timer)
    return None


def _time_out(d: Draft, name: str, clock: str) -> None:
    """Fence the expired attempt first, then retry or fail (never both at once)."""
    cur = d.stages[name].current
    assert cur is not None
    reason = f"{clock} deadline passed"
    request_cancellation(d, name, cur, reason)
    close(d, name, "timed-out")
    error = {
        "code": "timeout",
        "clock": clock,
        "message": reason,
        "retryable": True,
        "attempt": cur.attempt,
    }
    retry_or_fail(d, name, "timed-out", error, "timeout" in retry_of(d.plan, name).retry_on)
