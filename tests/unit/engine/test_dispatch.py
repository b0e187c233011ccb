"""Run start, dispatch envelopes, actions, bindings and decisions (docs/architecture.md §4)."""

from __future__ import annotations

import pytest

from accord.engine.machine import apply, ids
from accord.engine.machine.effects import DispatchJob, InvokeAction, ScheduleTimer
from accord.engine.machine.events import CancelRequested, RunStarted
from accord.errors import EngineError
from accord.workflow.plan import DecisionBranch, DecisionStage
from tests.unit.engine import plans
from tests.unit.engine.sim import T0, Sim


def _dispatches(sim: Sim) -> list[DispatchJob]:
    return [e for e in sim.dispatched if isinstance(e, DispatchJob)]


def test_run_start_pins_digest_versions_contracts_and_context() -> None:
    plan = plans.model_ingest(contracts={"thumbnail.render-request@3": "sha256:" + "ab" * 32})
    sim = Sim(plan)
    tr = sim.start(modelId="m-9")
    run = tr.run
    assert (run.plan_digest, run.dsl_version, run.compiler_version) == (plan.digest, "1", "1")
    assert run.engine_version == "1" and run.tenant == "acme" and run.workflow == "model-ingest"
    assert run.contracts == {"thumbnail.render-request@3": "sha256:" + "ab" * 32}
    assert run.context == {"modelId": "m-9"} and run.seq == 1 and run.status == "running"
    assert run.deadline_at_ms == T0 + 3_600_000
    run_timer = sim.timer("run")
    assert run_timer.due_at_ms == T0 + 3_600_000
    assert run_timer.timer_id == ids.timer_id("run-1", "", 0, "run")


def test_rule_dispatch_carries_run_stage_attempt_fence_digest_contract_id_and_deadline() -> None:
    sim = Sim(plans.model_ingest())
    sim.start()
    sim.succeed("cache-lookup", {"hit": False})
    (job,) = _dispatches(sim)
    env = job.envelope
    st = sim.state.stages["render-thumbnail"]
    assert job.queue == "render-thumbnail" and job.capability == "thumbnail.render@3"
    assert job.job_id == ids.job_id("run-1", "render-thumbnail", 1)
    assert env["messageId"] == ids.message_id("run-1", "render-thumbnail", 1)
    assert env["messageType"] == "thumbnail.render-request" and env["contractVersion"] == 3
    assert env["resultSchemaVersion"] == 1
    assert (env["runId"], env["stage"], env["attempt"], env["fence"]) == (
        "run-1",
        "render-thumbnail",
        1,
        st.fence,
    )
    assert env["correlationId"] == "run-1" and env["causationId"] == "run-1#2"
    assert env["producer"] == "accord-engine" and env["tenant"] == "acme"
    assert env["definitionDigest"] == sim.plan.digest and env["workflow"] == "model-ingest"
    assert env["idempotencyKey"] == ids.idempotency_key("run-1", "render-thumbnail")
    assert env["occurredAt"] == "2023-11-14T22:13:20.000Z"
    assert env["deadline"] == ids.iso_ms(T0 + 60_000 + 300_000)
    assert env["traceparent"].startswith("00-") and len(env["traceparent"]) == 55
    assert env["payload"] == {"modelId": "m-1"} and env["branch"] is None
    queue_timer = sim.timer("queue", "render-thumbnail")
    assert queue_timer.due_at_ms == T0 + 60_000 and queue_timer.fence == st.fence


def test_rule_workers_and_actions_receive_an_idempotency_key_stable_across_attempts() -> None:
    sim = Sim(plans.linear(retry=plans.RetryPolicy(max_attempts=3)))
    sim.start()
    sim.fail("a", retryable=True)
    sim.fire(sim.timer("retry", "a"))
    first, second = _dispatches(sim)
    assert first.envelope["idempotencyKey"] == second.envelope["idempotencyKey"]
    assert first.job_id != second.job_id
    assert first.envelope["fence"] != second.envelope["fence"]
    assert first.envelope["messageId"] != second.envelope["messageId"]


def test_action_stage_is_invoked_running_with_an_execution_timer() -> None:
    sim = Sim(plans.model_ingest())
    tr = sim.start()
    (invoke,) = [e for e in tr.effects if isinstance(e, InvokeAction)]
    assert invoke.capability == "cache.lookup@1" and invoke.envelope["stage"] == "cache-lookup"
    st = sim.state.stages["cache-lookup"]
    assert st.status == "running" and st.current is not None
    assert st.current.accepted_at_ms == T0
    timers = [e for e in tr.effects if isinstance(e, ScheduleTimer) and e.stage == "cache-lookup"]
    assert [t.timer for t in timers] == ["execution"]


def test_dispatch_is_deterministic_for_the_same_events() -> None:
    a, b = Sim(plans.model_ingest()), Sim(plans.model_ingest())
    for sim in (a, b):
        sim.start()
        sim.succeed("cache-lookup", {"hit": False})
    assert a.dispatched == b.dispatched and a.state == b.state


def test_binding_error_fails_the_stage_terminally_and_routes_on_failure() -> None:
    sim = Sim(plans.chained_binding())
    sim.start()
    sim.succeed("first", {"other": 1})
    st = sim.state.stages["second"]
    assert st.status == "failed" and st.attempts == ()
    assert st.error is not None and st.error["code"] == "binding-missing"
    assert sim.state.intent == "failed" and "second->failed" in sim.state.released
    assert sim.state.status == "failed"  # no finalisers: the intent resolves at once


def test_binding_null_is_its_own_code() -> None:
    sim = Sim(plans.chained_binding())
    sim.start()
    sim.succeed("first", {"uri": None})
    assert sim.state.stages["second"].error["code"] == "binding-null"  # type: ignore[index]


def test_rule_decision_takes_first_true_branch_without_dispatch() -> None:
    sim = Sim(plans.model_ingest())
    sim.start()
    tr = sim.succeed("cache-lookup", {"hit": True})
    route = sim.state.stages["cache-route"]
    assert route.status == "completed" and route.result == {"next": "publish", "branch": 0}
    assert route.attempts == ()
    assert [e.envelope["stage"] for e in tr.effects if isinstance(e, InvokeAction)] == ["publish"]
    assert sim.state.stages["render-thumbnail"].status == "skipped"  # the route bypassed it


def test_rule_decision_evaluation_error_follows_on_evaluation_error() -> None:
    bad = DecisionStage(
        name="route",
        branches=(
            DecisionBranch(when="context.missing.field == 1", next="b"),
            DecisionBranch(when="true", next="b"),
        ),
        on_evaluation_error="failed",
    )
    plan = plans.make(
        "bad-decision",
        "a",
        (plans.task("a", "alpha@1", "route"), bad, plans.task("b", "b@1", "completed")),
    )
    sim = Sim(plan)
    sim.start()
    sim.succeed("a")
    st = sim.state.stages["route"]
    assert st.status == "failed" and st.error is not None and st.error["code"] == "evaluation-error"
    assert sim.state.intent == "failed" and "route->failed" in sim.state.released


def test_run_started_twice_is_a_recorded_duplicate() -> None:
    sim = Sim(plans.linear())
    first = sim.start()
    again = sim.start()
    assert not again.history[0].accepted and again.history[0].reason == "duplicate"
    assert again.run.seq == 2 and again.effects == ()
    assert again.run.stages == first.run.stages


def test_wiring_mistakes_raise_engine_error() -> None:
    plan, other = plans.linear(), plans.saga()
    started = RunStarted(run_id="r", tenant="t", workflow="linear", plan_digest=plan.digest)
    with pytest.raises(EngineError):
        apply(other, None, started)
    run = apply(plan, None, started).run
    with pytest.raises(EngineError):
        apply(other, run, CancelRequested(run_id="r"))
    with pytest.raises(EngineError):
        apply(plan, None, CancelRequested(run_id="r"))
