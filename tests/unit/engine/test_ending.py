"""Terminal intent, late callbacks, finalisers, compensation, cancel, poison and re-drive."""

from __future__ import annotations

from accord.engine.machine.effects import InvokeAction, RequestCancellation
from accord.engine.machine.events import CancelRequested, RedriveRequested
from accord.workflow.plan import TerminalPolicy
from tests.unit.engine import invariants as inv
from tests.unit.engine import plans
from tests.unit.engine.sim import Sim


def _invoked(sim: Sim) -> list[str]:
    return [e.envelope["stage"] for e in sim.dispatched if isinstance(e, InvokeAction)]


def _happy_to_publish(sim: Sim) -> None:
    sim.start()
    sim.succeed("cache-lookup", {"hit": True})
    sim.succeed("publish", {"catalogueId": "c-1"})


def test_rule_finalisers_run_once_each_in_order_after_the_intent() -> None:
    sim = Sim(plans.saga())
    sim.start()
    for stage in ("reserve", "charge", "ship"):
        sim.succeed(stage)
    assert sim.state.intent == "completed" and sim.state.status == "finalising"
    assert sim.live() == ["@finaliser/0"]  # sequential: the second waits for the first
    sim.succeed("@finaliser/0")
    assert sim.live() == ["@finaliser/1"]
    sim.succeed("@finaliser/1")
    assert sim.state.status == "completed" and sim.state.finalisers == ("completed", "completed")
    assert _invoked(sim).count("@finaliser/0") == 1 and _invoked(sim).count("@finaliser/1") == 1
    dup = sim.apply(sim.callbacks[-1])
    assert not dup.history[0].accepted and dup.effects == ()


def test_rule_all_finalisers_attempted_and_completed_only_if_all_succeeded() -> None:
    sim = Sim(plans.saga())
    sim.start()
    for stage in ("reserve", "charge", "ship"):
        sim.succeed(stage)
    sim.fail("@finaliser/0", code="audit-down")
    assert sim.live() == ["@finaliser/1"]  # attempted even though the first failed
    sim.succeed("@finaliser/1")
    run = sim.state
    assert run.intent == "completed" and run.status == "failed"
    assert run.finalisers == ("failed", "completed")
    assert run.error == {"code": "finaliser-failed", "finalisers": ["failed", "completed"]}
    assert run.result == {"ok": True}


def test_finaliser_failure_terminal_policy_names_the_terminal_status() -> None:
    plan = plans.linear(
        finalisers=(plans.pin("audit@1", "action"),),
        terminal_policy=TerminalPolicy(finaliser_failure_terminal="cancelled"),
    )
    sim = Sim(plan)
    sim.start()
    sim.succeed("a")
    sim.succeed("b")
    sim.fire(sim.timer("execution", "@finaliser/0"))  # a finaliser that times out has failed
    assert sim.state.status == "cancelled" and sim.state.finalisers == ("failed",)


def test_model_ingest_completes_via_cache_hit_and_exposes_publish_result() -> None:
    sim = Sim(plans.model_ingest())
    _happy_to_publish(sim)
    sim.succeed("@finaliser/0")
    assert sim.state.status == "completed" and sim.state.result == {"catalogueId": "c-1"}


def test_rule_late_callbacks_after_terminal_intent_are_rejected_and_recorded() -> None:
    sim = Sim(plans.model_ingest())
    sim.start()
    sim.succeed("cache-lookup", {"hit": False})
    ident = sim.ident("render-thumbnail")
    sim.apply(CancelRequested(run_id="run-1", reason="user"))
    from accord.engine.machine.events import StageSucceeded

    tr = sim.apply(StageSucceeded(**ident, result={}))
    assert tr.history[0].reason == "late" and not tr.history[0].accepted
    assert sim.state.stages["render-thumbnail"].status == "cancelled"
    finaliser = sim.succeed("@finaliser/0")  # finaliser callbacks are still accepted
    assert finaliser.history[0].accepted and sim.state.status == "cancelled"


def test_I5_nothing_after_terminal_intent() -> None:
    sim = Sim(plans.model_ingest())
    sim.start()
    sim.succeed("cache-lookup", {"hit": False})
    sim.accept("render-thumbnail")
    stale_ident = sim.ident("render-thumbnail")
    sim.fire(sim.timer("run"))
    from accord.engine.machine.events import HeartbeatReceived, StageFailed, StageSucceeded

    for event in (
        StageSucceeded(**stale_ident, result={}),
        StageFailed(**stale_ident, retryable=True),
        HeartbeatReceived(**stale_ident),
        CancelRequested(run_id="run-1"),
    ):
        before = sim.state
        tr = sim.apply(event)
        inv.assert_i5_nothing_after_intent(before, tr)
        assert tr.history[0].reason == "late"
    assert sim.state.stages["semantic-analysis"].status == "pending"


def test_rule_compensation_runs_in_reverse_completion_order_before_finalisers() -> None:
    sim = Sim(plans.saga())
    sim.start()
    sim.succeed("reserve", {"reservation": "r-1"})
    sim.succeed("charge", {"payment": "p-1"})
    sim.fail("ship", code="no-courier")
    run = sim.state
    assert run.intent == "failed" and run.compensations == ("charge", "reserve")
    assert sim.live() == ["@compensate/charge"]
    refund = sim.dispatched[-1]
    assert refund.capability == "refund@1"
    assert refund.envelope["payload"]["result"] == {"payment": "p-1"}
    sim.succeed("@compensate/charge")
    assert sim.live() == ["@compensate/reserve"]
    sim.fail("@compensate/reserve", code="gone")  # each compensation is its own recorded action
    assert sim.live() == ["@finaliser/0"]
    sim.succeed("@finaliser/0")
    sim.succeed("@finaliser/1")
    assert sim.state.status == "failed"
    assert _invoked(sim) == [
        "@compensate/charge",
        "@compensate/reserve",
        "@finaliser/0",
        "@finaliser/1",
    ]
    assert sim.state.stages["@compensate/reserve"].status == "failed"


def test_operator_cancel_fences_live_attempts_and_ends_cancelled() -> None:
    sim = Sim(plans.model_ingest())
    sim.start()
    sim.succeed("cache-lookup", {"hit": False})
    tr = sim.apply(CancelRequested(run_id="run-1", reason="duplicate upload", by="ops"))
    (cancel,) = [e for e in tr.effects if isinstance(e, RequestCancellation)]
    assert cancel.stage == "render-thumbnail" and cancel.queue == "render-thumbnail"
    assert sim.state.error == {"code": "cancelled", "reason": "duplicate upload", "by": "ops"}
    sim.succeed("@finaliser/0")
    assert sim.state.status == "cancelled" and sim.state.terminal


def test_rule_poison_is_quarantined_with_reconcile_metadata_and_never_retried() -> None:
    sim = Sim(plans.linear(retry=plans.RetryPolicy(max_attempts=5)))
    sim.start()
    st = sim.state.stages["a"]
    sim.poison("a", count=7)
    q = sim.state.stages["a"]
    assert q.status == "quarantined" and q.current.status == "quarantined"  # type: ignore[union-attr]
    assert q.quarantine == {
        "reason": "crash-loop",
        "deliveryCount": 7,
        "attempt": 1,
        "fence": st.fence,
        "jobId": st.current.job_id,  # type: ignore[union-attr]
        "at": sim.now,
    }
    assert sim.state.intent == "failed" and not [
        t for t in sim.timers.values() if t.timer == "retry"
    ]


def test_redrive_gives_a_failed_stage_a_new_fenced_attempt_while_no_intent() -> None:
    sim = Sim(plans.fallback())
    sim.start()
    first = sim.state.stages["work"].fence
    sim.poison("work")
    assert sim.state.intent is None and sim.live() == ["notify"]
    tr = sim.apply(RedriveRequested(run_id="run-1", stage="work", by="ops"))
    st = sim.state.stages["work"]
    assert tr.history[0].accepted and tr.history[0].note == "re-drive by ops"
    assert st.attempt == 2 and st.fence != first and st.status == "queued"
    assert st.quarantine is not None  # the reconcile metadata stays
    sim.succeed("work")
    assert sim.state.intent == "completed" and "work->notify" in sim.state.released
    assert sim.state.stages["notify"].status == "cancelled"


def test_redrive_is_refused_once_a_terminal_intent_exists() -> None:
    sim = Sim(plans.linear())
    sim.start()
    sim.fail("a", code="bad")
    before = sim.state
    tr = sim.apply(RedriveRequested(run_id="run-1", stage="a"))
    assert tr.history[0].reason == "invalid" and tr.run.stages == before.stages
    running = Sim(plans.linear())
    running.start()
    refused = running.apply(RedriveRequested(run_id="run-1", stage="a"))
    assert refused.history[0].reason == "invalid"  # only failed-like stages can be re-driven
    assert (
        running.apply(RedriveRequested(run_id="run-1", stage="nope")).history[0].reason == "invalid"
    )
