"""Approval gates in the machine: waiting, deciding, refusing, timing out, cancelling, replay."""

from __future__ import annotations

import json

from accord.canonical import canonical_json
from accord.engine.machine.effects import CancelTimer, DispatchJob, InvokeAction, ScheduleTimer
from accord.engine.machine.events import ApprovalDecided, CancelRequested, event_from_json
from accord.engine.machine.explain import explain_history
from accord.engine.machine.state import RunState
from accord.workflow.plan import Approvers
from tests.unit.engine import invariants as inv
from tests.unit.engine import plans
from tests.unit.engine.sim import Sim


def _at_gate(**gate_extra: object) -> Sim:
    sim = Sim(plans.gated(**gate_extra))
    sim.start(modelId="m-1")
    sim.succeed("a")
    return sim


def _refused(sim: Sim, reason: str) -> str:
    (entry,) = sim.last.history if sim.last else ()
    assert not entry.accepted and entry.reason == reason, entry
    return entry.note


def test_rule_reaching_a_gate_dispatches_nothing_and_arms_its_timeout() -> None:
    sim = Sim(plans.gated())
    sim.start(modelId="m-1")
    tr = sim.succeed("a")
    gate = tr.run.stages["review"]
    assert gate.status == "waiting" and gate.fence and gate.attempt == 1
    assert not [e for e in tr.effects if isinstance(e, DispatchJob | InvokeAction)]
    (timer,) = [e for e in tr.effects if isinstance(e, ScheduleTimer) and e.timer == "approval"]
    assert timer.due_at_ms == sim.now + 60_000 and timer.fence == gate.fence
    assert gate.result == {"waiting_since_ms": sim.now, "due_at_ms": sim.now + 60_000,
                           "decisions": []}  # fmt: skip


def test_rule_an_approval_records_who_when_and_the_form_and_routes_on_approve() -> None:
    sim = _at_gate()
    tr = sim.decide("review", "approve", by="key:ann", comment="looks right")
    gate = tr.run.stages["review"]
    assert gate.status == "completed"
    (decision,) = gate.result["decisions"] if gate.result else ()
    assert decision == {"decision": "approve", "by": "key:ann", "role": "operator",
                        "at_ms": sim.now, "comment": "looks right", "form": {}}  # fmt: skip
    assert gate.result is not None and gate.result["decision"] == "approve"
    assert CancelTimer(timer_id=sim.timer("approval", "review").timer_id) in tr.effects
    assert tr.run.stages["b"].status == "running"  # the action after the gate was invoked
    assert sim.drain().status == "completed"


def test_rule_a_rejection_routes_on_reject_with_approval_rejected() -> None:
    sim = _at_gate()
    tr = sim.decide("review", "reject", by="key:ann", comment="wrong price")
    assert tr.run.stages["review"].status == "failed"
    assert tr.run.intent == "failed"
    assert tr.run.error is not None and tr.run.error["code"] == "approval-rejected"
    assert tr.run.error["stage"] == "review" and tr.run.error["by"] == "key:ann"
    run = sim.drain()
    assert run.status == "failed"
    assert run.stages["@compensate/a"].status == "completed"  # a completed stage is undone


def test_rule_the_timeout_routes_on_timeout_when_nobody_decides() -> None:
    sim = _at_gate()
    tr = sim.fire(sim.timer("approval", "review"))
    assert tr.accepted
    assert tr.run.stages["review"].status == "timed-out"
    assert tr.run.error is not None and tr.run.error["code"] == "approval-timeout"
    assert sim.drain().status == "failed"


def test_rule_a_decision_after_the_timeout_is_refused_and_recorded() -> None:
    sim = _at_gate()
    sim.now += 60_000  # due, though the timer has not fired yet
    sim.decide("review", "approve")
    assert "timed out" in _refused(sim, "late")
    sim.fire(sim.timer("approval", "review"))
    sim.decide("review", "approve", by="key:bob")
    _refused(sim, "late")


def test_rule_a_second_decision_is_refused_and_recorded() -> None:
    sim = _at_gate()
    sim.decide("review", "approve", by="key:ann")
    sim.decide("review", "reject", by="key:bob")
    assert "already decided (completed)" in _refused(sim, "duplicate")
    assert sim.state.stages["review"].status == "completed"


def test_rule_the_same_approver_cannot_decide_twice_toward_min() -> None:
    sim = _at_gate(approvers=Approvers(min=2))
    sim.decide("review", "approve", by="key:ann")
    assert sim.state.stages["review"].status == "waiting"
    sim.decide("review", "approve", by="key:ann")
    assert "already decided" in _refused(sim, "duplicate")
    sim.decide("review", "approve", by="key:bob")
    gate = sim.state.stages["review"]
    assert gate.status == "completed" and gate.result is not None
    assert [d["by"] for d in gate.result["decisions"]] == ["key:ann", "key:bob"]


def test_rule_the_requester_is_refused_when_excluded() -> None:
    sim = _at_gate()
    sim.decide("review", "approve", by="key:requester", role="admin")
    assert "requested the run" in _refused(sim, "forbidden")
    allowed = _at_gate(approvers=Approvers(exclude_requester=False))
    assert allowed.decide("review", "approve", by="key:requester").accepted


def test_rule_a_role_below_the_gates_is_refused() -> None:
    sim = _at_gate(approvers=Approvers(role="author"))
    sim.decide("review", "approve", role="operator")
    assert "below the gate's 'author'" in _refused(sim, "forbidden")
    assert sim.decide("review", "approve", role="admin").accepted


def test_rule_another_tenant_is_refused_when_tenant_scoped() -> None:
    sim = _at_gate()
    sim.decide("review", "approve", tenants=("beta",))
    assert "tenant 'acme'" in _refused(sim, "forbidden")
    open_gate = _at_gate(approvers=Approvers(tenant_scoped=False))
    assert open_gate.decide("review", "approve", tenants=("beta",)).accepted


def test_rule_form_problems_found_by_the_shell_refuse_the_decision() -> None:
    sim = _at_gate(form="listing-review@1")
    sim.decide("review", "approve", form={"price": -1}, form_problems=("price: below 0",))
    assert "price: below 0" in _refused(sim, "invalid")
    no_form = _at_gate()
    no_form.decide("review", "approve", form={"x": 1})
    assert "takes no form" in _refused(no_form, "invalid")
    tr = sim.decide("review", "approve", form={"price": 12})
    assert tr.accepted and tr.run.stages["review"].result is not None
    assert tr.run.stages["review"].result["decisions"][0]["form"] == {"price": 12}


def test_rule_a_decision_for_an_unreached_or_unknown_gate_is_invalid() -> None:
    sim = Sim(plans.gated())
    sim.start(modelId="m-1")
    sim.decide("review", "approve")
    assert "not been reached" in _refused(sim, "invalid")
    sim.decide("a", "approve")
    assert "not an approval gate" in _refused(sim, "invalid")
    sim.decide("review", "maybe")
    _refused(sim, "invalid")


def test_rule_cancellation_cancels_a_waiting_gate_and_its_timer() -> None:
    sim = _at_gate()
    tr = sim.apply(CancelRequested(run_id=sim.run_id, reason="stop"))
    assert tr.run.stages["review"].status == "cancelled"
    timer = sim.timer("approval", "review")
    assert CancelTimer(timer_id=timer.timer_id) in tr.effects
    sim.decide("review", "approve")
    _refused(sim, "late")
    assert sim.drain().status == "cancelled"
    fired = sim.fire(timer)
    assert not fired.accepted


def test_rule_a_gate_on_a_fork_branch_arrives_at_the_join() -> None:
    sim = Sim(plans.gated_fork())
    sim.start(modelId="m-1")
    assert sim.state.stages["sign-off"].status == "waiting"
    sim.succeed("work")
    sim.decide("sign-off", "approve")
    assert sim.drain().status == "completed"
    rejected = Sim(plans.gated_fork())
    rejected.start(modelId="m-1")
    rejected.decide("sign-off", "reject")
    assert rejected.state.branch_states["sign-off"] == "failed"
    assert rejected.drain().status == "failed"


def test_replay_reproduces_runs_with_gates_exactly() -> None:
    for decide in ("approve", "reject", "timeout", "refused-then-approve"):
        sim = _at_gate(approvers=Approvers(min=2))
        if decide == "timeout":
            sim.fire(sim.timer("approval", "review"))
        elif decide == "refused-then-approve":
            sim.decide("review", "approve", by="key:requester")
            sim.decide("review", "approve", by="key:ann")
            sim.decide("review", "approve", by="key:bob")
        else:
            sim.decide("review", decide, by="key:ann")
            sim.decide("review", decide, by="key:bob")
        run = sim.drain()
        inv.assert_i12_replay(sim.plan, sim.history, run)
        assert RunState.from_json(json.loads(canonical_json(run.to_json()))) == run


def test_a_decision_event_round_trips_through_json() -> None:
    ev = ApprovalDecided(run_id="r", stage="g", decision="approve", by="key:a", role="operator",
                         tenants=("acme",), form={"x": 1}, form_problems=("p",))  # fmt: skip
    again = event_from_json(json.loads(canonical_json(
        {**{k: getattr(ev, k) for k in ev.__dataclass_fields__}, "kind": ev.kind})))  # fmt: skip
    assert again == ev


def test_explain_names_decisions_refusals_and_a_waiting_gate() -> None:
    sim = _at_gate(approvers=Approvers(min=2))
    sim.decide("review", "approve", by="key:ann", comment="ok")
    sim.decide("review", "approve", by="key:requester")
    lines = explain_history(sim.state, sim.history)
    assert any("approve of gate 'review' by key:ann (role operator): ok" in x for x in lines)
    assert any("by key:requester" in x and "refused: forbidden" in x for x in lines)
    assert any("gate 'review' is waiting for approval (1 decided" in x for x in lines)


def test_a_run_record_without_a_requester_keeps_its_earlier_json_form() -> None:
    sim = Sim(plans.linear())
    sim.start(requested_by="", modelId="m-1")
    assert "requested_by" not in sim.state.to_json()
    sim2 = Sim(plans.linear())
    sim2.start(modelId="m-1")
    assert sim2.state.to_json()["requested_by"] == "key:requester"
    assert RunState.from_json(sim2.state.to_json()) == sim2.state
