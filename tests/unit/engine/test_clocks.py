"""The three clocks, retries with bounded backoff, and timers for old attempts (I6)."""

from __future__ import annotations

from accord.engine.machine import ids
from accord.engine.machine.effects import CancelTimer, DispatchJob, RequestCancellation
from accord.workflow.plan import RetryPolicy, Timeouts
from tests.unit.engine import invariants as inv
from tests.unit.engine import plans
from tests.unit.engine.sim import T0, Sim

RETRY = RetryPolicy(max_attempts=3, initial_backoff_ms=1_000, max_backoff_ms=10_000, jitter=0.2)


def _sim(retry: RetryPolicy = RETRY, **timeouts: int) -> Sim:
    sim = Sim(plans.linear(retry=retry, timeouts=Timeouts(**timeouts), deadline_ms=3_600_000))
    sim.start()
    return sim


def test_rule_retry_is_a_new_attempt_with_a_new_fence_after_bounded_backoff() -> None:
    sim = _sim()
    first = sim.state.stages["a"].fence
    sim.now += 5
    sim.fail("a", retryable=True, code="unavailable")
    st = sim.state.stages["a"]
    assert st.status == "retry-scheduled" and st.error["code"] == "unavailable"  # type: ignore[index]
    retry = sim.timer("retry", "a")
    delay = retry.due_at_ms - sim.now
    assert 800 <= delay <= 1_200  # 1 s ± 20 % jitter
    tr = sim.fire(retry)
    st = sim.state.stages["a"]
    assert st.attempt == 2 and st.fence != first and st.status == "queued"
    (job,) = [e for e in tr.effects if isinstance(e, DispatchJob)]
    assert job.envelope["attempt"] == 2 and job.envelope["fence"] == st.fence


def test_backoff_jitter_is_drawn_from_event_entropy() -> None:
    delays = set()
    for seed in range(20):
        sim = Sim(plans.linear(retry=RETRY), seed=seed)
        sim.start()
        sim.fail("a", retryable=True)
        delays.add(sim.timer("retry", "a").due_at_ms - T0)
    assert len(delays) > 10 and all(800 <= d <= 1_200 for d in delays)


def test_rule_retryable_and_terminal_errors_differ() -> None:
    sim = _sim()
    sim.fail("a", retryable=False, code="invalid-model")
    assert sim.state.stages["a"].status == "failed" and sim.state.intent == "failed"
    sim = _sim(RetryPolicy(max_attempts=3, retry_on=("rate-limited",)))
    sim.fail("a", retryable=True, code="disk-full")
    assert sim.state.stages["a"].status == "failed"
    sim = _sim(RetryPolicy(max_attempts=3, retry_on=("rate-limited",)))
    sim.fail("a", retryable=True, code="rate-limited")
    assert sim.state.stages["a"].status == "retry-scheduled"


def test_retries_are_bounded_by_max_attempts() -> None:
    sim = _sim()
    for _ in range(2):
        sim.fail("a", retryable=True)
        sim.fire(sim.timer("retry", "a"))
    sim.fail("a", retryable=True)
    st = sim.state.stages["a"]
    assert st.attempt == 3 and st.status == "failed" and sim.state.intent == "failed"


def test_rule_queue_timeout_fences_the_attempt_before_any_retry() -> None:
    sim = _sim()
    old = sim.state.stages["a"]
    tr = sim.fire(sim.timer("queue", "a"))
    (cancel,) = [e for e in tr.effects if isinstance(e, RequestCancellation)]
    assert (cancel.attempt, cancel.fence) == (1, old.fence)
    st = sim.state.stages["a"]
    assert st.current.status == "timed-out" and st.status == "retry-scheduled"  # type: ignore[union-attr]
    assert not [e for e in tr.effects if isinstance(e, DispatchJob)]  # the retry waits for backoff
    late = sim.accept("a")  # the fenced attempt's acceptance arrives after the timeout
    assert late.history[0].reason == "stale" and late.history[0].note.endswith("(timed-out)")


def test_execution_and_heartbeat_timeouts() -> None:
    sim = _sim(heartbeat_timeout_ms=2_000, execution_deadline_ms=10_000)
    sim.accept("a")
    sim.now += 1_500
    sim.heartbeat("a")
    hb = sim.timer("heartbeat", "a")
    assert hb.due_at_ms == sim.now + 2_000
    sim.fire(hb)
    assert sim.state.stages["a"].attempts[0].status == "timed-out"
    sim = _sim(execution_deadline_ms=10_000, retry=RetryPolicy(max_attempts=1))
    sim.accept("a")
    sim.fire(sim.timer("execution", "a"))
    st = sim.state.stages["a"]
    assert st.status == "timed-out" and st.error["clock"] == "execution"  # type: ignore[index]
    assert sim.state.intent == "failed"


def test_rule_timer_for_an_old_attempt_is_a_recorded_no_op() -> None:
    sim = _sim()
    queue_timer = sim.timer("queue", "a")
    sim.accept("a")  # cancels the queue timer; it may still fire once
    before = sim.state
    tr = sim.fire(queue_timer)
    assert tr.history[0].reason == "stale" and tr.run.stages == before.stages
    assert tr.effects == (CancelTimer(timer_id=queue_timer.timer_id),)  # the store drops it
    inv.assert_i3_fencing(before, sim._event(tr), tr)
    sim.fail("a", retryable=True)
    sim.fire(sim.timer("retry", "a"))
    execution_of_first = next(
        t for t in sim.all_timers if t.timer == "execution" and t.attempt == 1
    )
    assert sim.fire(execution_of_first).history[0].reason == "stale"
    assert sim.state.stages["a"].attempt == 2 and sim.state.stages["a"].status == "queued"


def test_rearmed_heartbeat_timer_firing_early_is_a_no_op() -> None:
    sim = _sim(heartbeat_timeout_ms=2_000)
    sim.accept("a")
    stale_due = sim.timer("heartbeat", "a")
    sim.now += 1_000
    sim.heartbeat("a")
    from accord.engine.machine.events import TimerFired

    early = sim.apply(
        TimerFired(
            run_id="run-1",
            timer="heartbeat",
            timer_id=stale_due.timer_id,
            stage="a",
            attempt=1,
            fence=stale_due.fence,
            at_ms=stale_due.due_at_ms,
        )
    )
    assert early.history[0].reason == "stale" and sim.state.stages["a"].status == "running"
    assert early.effects == ()  # the re-armed timer shares the id and must stay armed


def test_run_deadline_sets_failed_intent() -> None:
    sim = _sim()
    tr = sim.fire(sim.timer("run"))
    assert sim.state.intent == "failed" and sim.state.error == {
        "code": "run-deadline",
        "deadlineAt": T0 + 3_600_000,
    }
    assert any(isinstance(e, RequestCancellation) for e in tr.effects)
    assert sim.state.status == "failed"
    assert sim.fire(sim.timer("run")).history[0].reason == "stale"


def test_I6_every_live_attempt_has_a_persisted_deadline_and_timer() -> None:
    sim = Sim(plans.model_ingest())
    sim.start()
    inv.assert_i6_deadlines(sim.plan, sim.state, sim.timers)
    sim.succeed("cache-lookup", {"hit": False})
    inv.assert_i6_deadlines(sim.plan, sim.state, sim.timers)
    sim.accept("render-thumbnail")
    inv.assert_i6_deadlines(sim.plan, sim.state, sim.timers)
    ex = sim.timer("execution", "render-thumbnail")
    assert ex.timer_id == ids.timer_id("run-1", "render-thumbnail", 1, "execution")
    # an expired attempt is fenced, then retried: the new attempt is armed again
    sim.fire(ex)
    inv.assert_i6_deadlines(sim.plan, sim.state, sim.timers)
    sim.fire(sim.timer("retry", "render-thumbnail"))
    inv.assert_i6_deadlines(sim.plan, sim.state, sim.timers)
    assert sim.state.stages["render-thumbnail"].current.deadline_at_ms is not None  # type: ignore[union-attr]


def test_rule_three_clocks_are_persisted_as_durable_timers() -> None:
    sim = _sim(heartbeat_timeout_ms=2_000)
    kinds = {t.timer for t in sim.timers.values()}
    assert kinds == {"run", "queue"}  # dispatch → acceptance, and the run as a whole
    sim.accept("a")
    kinds = {t.timer for t in sim.timers.values()}
    assert kinds == {"run", "execution", "heartbeat"}  # acceptance → result
    for t in sim.timers.values():
        assert t.timer_id == ids.timer_id("run-1", t.stage, t.attempt, t.timer)
    sim.succeed("a")
    sim.succeed("b")
    assert sim.state.terminal and sim.timers == {}  # every clock is cancelled at the end
