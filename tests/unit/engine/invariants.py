"""Assertions named after docs/reliability.md's invariants, usable by any test that drives the
machine.

Each helper takes plain values — the record before, the event, the :class:`Transition` after, or
the accumulated history and timers — so scenario, property and integration tests can all call
them after every step.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence

from accord.canonical import canonical_json
from accord.engine.machine import Transition
from accord.engine.machine.effects import (
    CancelTimer,
    DispatchJob,
    EmitTelemetry,
    InvokeAction,
    ScheduleTimer,
)
from accord.engine.machine.events import Event
from accord.engine.machine.replay import replay
from accord.engine.machine.state import ACTIVE_ATTEMPT, HistoryEntry, RunState
from accord.workflow.plan import Plan

CALLBACK_KINDS = frozenset(
    {
        "stage-accepted",
        "heartbeat",
        "progress",
        "stage-succeeded",
        "stage-failed",
        "poison-reported",
    }
)


def _unchanged_but_seq(before: RunState, after: RunState) -> bool:
    return after == dataclasses.replace(before, seq=before.seq + 1)


def assert_versions_grow(before: RunState | None, after: RunState) -> None:
    assert after.seq == (before.seq if before is not None else 0) + 1


def assert_i1_terminal(run: RunState) -> None:
    """I1 after a drain: the run reached exactly one terminal state and nothing is live."""
    assert run.terminal, f"run is {run.status} (intent {run.intent})"
    live = [
        n
        for n, s in run.stages.items()
        if s.status in ("queued", "running", "retry-scheduled", "waiting")
    ]
    assert not live, f"terminal run still has live stages {live}"


def assert_i2_one_effective_completion(before: RunState, tr: Transition) -> None:
    """I2: a duplicate is a recorded no-op — no state change, no effects, nothing released."""
    (entry,) = tr.history
    if entry.reason == "duplicate":
        assert not entry.accepted
        assert tr.effects == (), tr.effects
        assert _unchanged_but_seq(before, tr.run)


def assert_i3_fencing(before: RunState, event: Event, tr: Transition) -> None:
    """I3: a refused event changes nothing but ``seq``; an accepted callback carried the exact
    current attempt and fence; every fence in the record is distinct."""
    (entry,) = tr.history
    assert entry.seq == tr.run.seq == before.seq + 1
    if not entry.accepted:
        assert _unchanged_but_seq(before, tr.run)
        # telemetry about the refusal, or dropping a fired timer that no longer applies
        assert all(isinstance(e, EmitTelemetry | CancelTimer) for e in tr.effects)
        if entry.event["kind"] != "timer-fired":
            assert not any(isinstance(e, CancelTimer) for e in tr.effects)
    elif entry.event["kind"] in CALLBACK_KINDS:
        st = before.stages[entry.event["stage"]]
        assert (entry.event["attempt"], entry.event["fence"]) == (st.attempt, st.fence)
        assert st.current is not None and st.current.status in ACTIVE_ATTEMPT
    fences = [a.fence for s in tr.run.stages.values() for a in s.attempts]
    assert len(fences) == len(set(fences)), "a fence was issued twice"
    assert all(len(f) == 32 and not f.isdigit() for f in fences)


def assert_i4_no_double_release(
    before: RunState, after: RunState, dispatched: Iterable[str] = ()
) -> None:
    """I4: released edges only grow, each at most once; job ids were never dispatched twice."""
    assert after.released[: len(before.released)] == before.released
    assert len(after.released) == len(set(after.released)), after.released
    jobs = list(dispatched)
    assert len(jobs) == len(set(jobs)), "a job id was dispatched twice"


def assert_i5_nothing_after_intent(before: RunState, tr: Transition) -> None:
    """I5: once an intent exists, ordinary callbacks are refused as late and nothing ordinary
    is dispatched."""
    if before.intent is None:
        return
    (entry,) = tr.history
    stage = entry.event.get("stage", "")
    if entry.event["kind"] in CALLBACK_KINDS and not stage.startswith("@"):
        assert not entry.accepted and entry.reason in ("late", "unknown-attempt"), entry
    for effect in tr.effects:
        if isinstance(effect, DispatchJob | InvokeAction):
            assert effect.envelope["stage"].startswith("@"), effect.envelope["stage"]


def assert_i6_deadlines(plan: Plan, run: RunState, timers: Mapping[str, ScheduleTimer]) -> None:
    """I6: every live attempt has a persisted deadline with a live timer; every scheduled retry
    and the run deadline of an undecided run are armed too."""
    armed: dict[tuple[str, int, str], ScheduleTimer] = {
        (t.stage, t.attempt, t.timer): t for t in timers.values()
    }
    for name, st in run.stages.items():
        cur = st.current
        if cur is not None and cur.status in ACTIVE_ATTEMPT:
            kind = "queue" if cur.status == "queued" else "execution"
            timer = armed.get((name, cur.attempt, kind))
            assert cur.deadline_at_ms is not None and timer is not None, (name, cur)
            assert timer.due_at_ms == cur.deadline_at_ms and timer.fence == cur.fence
        if st.status == "retry-scheduled":
            assert (name, st.attempt, "retry") in armed, name
        if st.status == "waiting":  # an approval gate: its timeout is armed, with its fence
            gate = armed.get((name, st.attempt, "approval"))
            assert gate is not None and gate.fence == st.fence, name
            assert st.result is not None and gate.due_at_ms == st.result["due_at_ms"], name
    if run.intent is None and plan.deadline_ms is not None:
        assert ("", 0, "run") in armed


def assert_i7_outbox(before: RunState | None, tr: Transition) -> None:
    """I7: every attempt the transition issued has its dispatch and its clock in the same
    transition (so in the same commit)."""
    old = {(n, a.attempt) for n, s in (before.stages.items() if before else ()) for a in s.attempts}
    jobs = {e.job_id for e in tr.effects if isinstance(e, DispatchJob | InvokeAction)}
    timers = {(e.stage, e.attempt) for e in tr.effects if isinstance(e, ScheduleTimer)}
    for name, st in tr.run.stages.items():
        for a in st.attempts:
            if (name, a.attempt) not in old:
                assert a.job_id in jobs, (name, a.attempt)
                assert (name, a.attempt) in timers, (name, a.attempt)


def assert_i12_replay(plan: Plan, history: Sequence[HistoryEntry], run: RunState) -> None:
    """I12: folding the history (as stored JSON) from empty gives the stored record exactly."""
    stored = [json.loads(canonical_json(h.to_json())) for h in history]
    assert replay(plan, stored) == run
    assert RunState.from_json(json.loads(canonical_json(run.to_json()))) == run
