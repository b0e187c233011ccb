"""Callbacks against the current attempt: acceptance, heartbeats, progress, success, refusals."""

from __future__ import annotations

import dataclasses

from accord.engine.machine import ids
from accord.engine.machine.effects import CancelTimer, EmitTelemetry, ScheduleTimer
from accord.engine.machine.events import StageAccepted, StageSucceeded
from accord.workflow.plan import Timeouts
from tests.unit.engine import invariants as inv
from tests.unit.engine import plans
from tests.unit.engine.sim import Sim


def _worker_sim(**timeouts: int) -> Sim:
    sim = Sim(plans.linear(timeouts=Timeouts(**timeouts)))
    sim.start()
    return sim


def test_acceptance_moves_queued_to_running_and_swaps_queue_for_execution_clock() -> None:
    sim = _worker_sim(heartbeat_timeout_ms=5_000)
    sim.now += 10
    tr = sim.accept("a")
    st = sim.state.stages["a"]
    assert st.status == "running" and st.current is not None
    assert st.current.accepted_at_ms == sim.now and st.current.heartbeat_due_ms == sim.now + 5_000
    assert CancelTimer(timer_id=ids.timer_id("run-1", "a", 1, "queue")) in tr.effects
    armed = {e.timer: e.due_at_ms for e in tr.effects if isinstance(e, ScheduleTimer)}
    assert armed == {"execution": sim.now + 300_000, "heartbeat": sim.now + 5_000}


def test_heartbeat_re_arms_the_same_timer_id() -> None:
    sim = _worker_sim(heartbeat_timeout_ms=5_000)
    first = sim.accept("a")
    sim.now += 3_000
    again = sim.heartbeat("a")
    (t1,) = [e for e in first.effects if isinstance(e, ScheduleTimer) and e.timer == "heartbeat"]
    (t2,) = [e for e in again.effects if isinstance(e, ScheduleTimer)]
    assert t1.timer_id == t2.timer_id and t2.due_at_ms == t1.due_at_ms + 3_000
    assert sim.state.stages["a"].current.heartbeat_due_ms == t2.due_at_ms  # type: ignore[union-attr]


def test_progress_is_recorded_and_out_of_range_progress_is_invalid() -> None:
    sim = _worker_sim()
    sim.accept("a")
    assert sim.progress("a", 0.5).history[0].accepted
    assert sim.state.stages["a"].progress == 0.5
    bad = sim.progress("a", 1.5)
    assert bad.history[0].reason == "invalid" and sim.state.stages["a"].progress == 0.5


def test_heartbeat_before_acceptance_counts_as_acceptance() -> None:
    sim = _worker_sim()
    sim.heartbeat("a")
    assert sim.state.stages["a"].status == "running"
    assert sim.accept("a").history[0].reason == "duplicate"


def test_rule_callback_accepted_only_on_exact_stage_attempt_and_fence() -> None:
    sim = _worker_sim()
    ident = sim.ident("a")
    wrong_fence = StageSucceeded(**{**ident, "fence": "0" * 31 + "1"}, result={"x": 1})
    tr = sim.apply(wrong_fence)
    assert tr.history[0].reason == "stale" and sim.state.stages["a"].status == "queued"
    future = StageSucceeded(**{**ident, "attempt": 2}, result={})
    assert sim.apply(future).history[0].reason == "unknown-attempt"
    unknown = StageAccepted(run_id="run-1", stage="b", attempt=1, fence="f" * 32)
    assert sim.apply(unknown).history[0].reason == "unknown-attempt"
    assert sim.apply(StageSucceeded(**ident, result={"x": 2})).history[0].accepted
    assert sim.state.stages["a"].result == {"x": 2}


def test_success_without_acceptance_is_accepted_reordering_tolerant() -> None:
    sim = _worker_sim()
    tr = sim.succeed("a", {"v": 1})
    assert tr.history[0].accepted and sim.state.stages["a"].status == "completed"
    assert "a->b" in sim.state.released


def test_rule_matching_duplicate_is_acknowledged_without_re_release() -> None:
    sim = _worker_sim()
    sim.succeed("a", {"v": 1})
    before = sim.state
    dup = sim.apply(sim.callbacks[-1])
    assert dup.history[0].reason == "duplicate" and dup.effects == ()
    assert sim.state.released == before.released


def test_I2_duplicate_callbacks_are_no_ops() -> None:
    sim = _worker_sim()
    sim.accept("a")
    for event in (sim.callbacks[-1], sim.callbacks[-1]):
        before = sim.state
        tr = sim.apply(event)
        inv.assert_i2_one_effective_completion(before, tr)
        assert tr.history[0].reason == "duplicate"
    sim.succeed("a", {"v": 1})
    before = sim.state
    failure_after_success = sim.fail("a", retryable=True)
    inv.assert_i2_one_effective_completion(before, failure_after_success)
    assert failure_after_success.history[0].reason == "duplicate"
    assert sim.state.stages["a"].result == {"v": 1}


def test_rule_stale_or_reordered_callback_is_recorded_and_changes_nothing() -> None:
    sim = Sim(plans.linear(retry=plans.RetryPolicy(max_attempts=3)))
    sim.start()
    sim.accept("a")
    old_success = StageSucceeded(**sim.ident("a"), result={"old": True})
    sim.fail("a", retryable=True)
    sim.fire(sim.timer("retry", "a"))
    before = sim.state
    tr = sim.apply(old_success)
    assert tr.history[0].reason == "stale" and not tr.history[0].accepted
    assert tr.run == dataclasses.replace(before, seq=before.seq + 1)
    (telemetry,) = tr.effects
    assert isinstance(telemetry, EmitTelemetry) and telemetry.name == "callback.rejected"


def test_I3_stale_fence_changes_nothing_and_versions_grow() -> None:
    sim = _worker_sim()
    issued = sim.state.stages["a"].fence
    for fence in ("", issued.upper(), issued[:-1], issued + "0", "1"):
        before = sim.state
        event = StageSucceeded(**{**sim.ident("a"), "fence": fence}, result={"forged": True})
        tr = sim.apply(event)
        inv.assert_i3_fencing(before, event, tr)
        assert tr.history[0].reason == "stale" and tr.run.seq == before.seq + 1
    assert sim.state.stages["a"].status == "queued"


def test_I3_fences_are_unguessable_and_never_reissued() -> None:
    fences = set()
    for n in range(50):
        sim = Sim(
            plans.linear(retry=plans.RetryPolicy(max_attempts=3)), run_id=f"run-{n % 5}", seed=n
        )
        sim.start()
        sim.fail("a", retryable=True)
        sim.fire(sim.timer("retry", "a"))
        for a in sim.state.stages["a"].attempts:
            assert len(a.fence) == 32 and not a.fence.isdigit()
            fences.add(a.fence)
    assert len(fences) == 100  # same run ids, same attempt numbers, different entropy


def test_I3_fence_is_not_reissued_after_the_store_loses_a_suffix() -> None:
    from accord.engine.machine import apply
    from accord.engine.machine.replay import replay

    sim = Sim(plans.linear(retry=plans.RetryPolicy(max_attempts=3)))
    sim.start()
    sim.fail("a", retryable=True)
    retry = sim.timer("retry", "a")
    sim.fire(retry)
    lost = sim.state.stages["a"].fence
    # the store acknowledged the retry, then lost it: the same event is applied again later,
    # with the fresh entropy the shell stamps on every delivery
    survivor = replay(sim.plan, sim.history[:-1])
    event = sim._event(sim.last)  # type: ignore[arg-type]
    again = apply(sim.plan, survivor, dataclasses.replace(event, entropy="5eed" * 8))
    reissued = again.run.stages["a"]
    assert reissued.attempt == 2 and reissued.fence != lost
