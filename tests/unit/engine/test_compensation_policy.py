"""Compensations and finalisers under their own retry policy and clocks; "needs reconciliation"
when a compensation never succeeds."""

from __future__ import annotations

from accord.engine.machine.effects import InvokeAction
from accord.engine.machine.explain import explain_history
from accord.workflow.plan import Plan
from tests.unit.engine import invariants as inv
from tests.unit.engine import plans
from tests.unit.engine.sim import Sim


def _compensating() -> Sim:
    """The saga, failed at ``ship``: compensating ``charge`` first (it has a policy)."""
    sim = Sim(plans.saga_with_policies())
    sim.start()
    sim.succeed("reserve", {"reservation": "r-1"})
    sim.succeed("charge", {"payment": "p-1"})
    sim.fail("ship", code="no-courier")
    assert sim.live() == ["@compensate/charge"]
    return sim


def _retry(sim: Sim, name: str) -> None:
    assert sim.state.stages[name].status == "retry-scheduled"
    sim.fire(sim.timer("retry", name))


def test_rule_a_compensation_retries_under_its_own_policy_and_records_each_attempt() -> None:
    sim = _compensating()
    sim.fail("@compensate/charge", retryable=True, code="busy")
    _retry(sim, "@compensate/charge")
    sim.fail("@compensate/charge", retryable=True, code="busy")
    _retry(sim, "@compensate/charge")
    sim.succeed("@compensate/charge")  # the third attempt succeeds
    comp = sim.state.stages["@compensate/charge"]
    assert comp.status == "completed" and comp.attempt == 3
    assert [a.status for a in comp.attempts] == ["failed", "failed", "succeeded"]
    refunds = [e for e in sim.dispatched if e.envelope["stage"] == "@compensate/charge"]
    assert len({e.job_id for e in refunds}) == 3  # each attempt its own job, same idempotency key
    assert len({e.envelope["payload"]["idempotencyKey"] for e in refunds}) == 1
    run = sim.drain()
    assert run.status == "failed" and "needs_reconciliation" not in (run.error or {})
    inv.assert_i12_replay(sim.plan, sim.history, run)


def test_rule_a_compensation_failing_after_its_retries_needs_reconciliation() -> None:
    sim = _compensating()
    for _ in range(2):
        sim.fail("@compensate/charge", retryable=True, code="busy")
        _retry(sim, "@compensate/charge")
    sim.fail("@compensate/charge", retryable=True, code="busy")  # the third and last
    assert sim.state.stages["@compensate/charge"].status == "failed"
    assert sim.live() == ["@compensate/reserve"]  # the next compensation still runs
    run = sim.drain()
    assert run.status == "failed"
    assert run.error is not None and run.error["needs_reconciliation"] == ["charge"]
    lines = explain_history(run, sim.history)
    assert any(
        "needs reconciliation: the compensation of 'charge' ended failed (busy) after 3" in x
        for x in lines
    )
    finaliser = next(e for e in sim.dispatched if e.envelope["stage"] == "@finaliser/0")
    assert finaliser.envelope["payload"]["error"]["needs_reconciliation"] == ["charge"]
    inv.assert_i12_replay(sim.plan, sim.history, run)


def test_rule_a_terminal_compensation_error_is_not_retried() -> None:
    sim = _compensating()
    sim.fail("@compensate/charge", retryable=False, code="refused")
    assert sim.state.stages["@compensate/charge"].status == "failed"
    assert sim.drain().error["needs_reconciliation"] == ["charge"]  # type: ignore[index]


def test_rule_a_compensation_times_out_on_its_own_deadline_and_retries() -> None:
    sim = _compensating()
    (refund,) = [e for e in sim.dispatched if e.envelope["stage"] == "@compensate/charge"]
    assert isinstance(refund, InvokeAction)
    timer = sim.timer("execution", "@compensate/charge")
    assert timer.due_at_ms == sim.now + 5_000  # its own clock, not the default
    sim.fire(timer)
    assert sim.state.stages["@compensate/charge"].status == "retry-scheduled"
    _retry(sim, "@compensate/charge")
    sim.succeed("@compensate/charge")
    assert sim.drain().status == "failed"


def test_rule_a_compensation_without_a_policy_keeps_its_single_attempt() -> None:
    sim = _compensating()
    sim.succeed("@compensate/charge")
    sim.fail("@compensate/reserve", retryable=True, code="busy")
    assert sim.state.stages["@compensate/reserve"].status == "failed"
    assert sim.drain().error["needs_reconciliation"] == ["reserve"]  # type: ignore[index]


def test_rule_a_finaliser_with_a_policy_retries_and_the_run_completes() -> None:
    sim = Sim(plans.saga_with_policies())
    sim.start()
    for name in ("reserve", "charge", "ship"):
        sim.succeed(name)
    sim.fail("@finaliser/0", retryable=True, code="busy")
    _retry(sim, "@finaliser/0")
    sim.succeed("@finaliser/0")
    sim.succeed("@finaliser/1")
    run = sim.state
    assert run.status == "completed" and run.finalisers == ("completed", "completed")
    assert run.stages["@finaliser/0"].attempt == 2
    inv.assert_i12_replay(sim.plan, sim.history, run)


def test_policies_are_in_the_plan_only_when_given() -> None:
    with_policies = plans.saga_with_policies()
    doc = with_policies.to_json()
    assert "finaliser_policies" in doc
    assert "compensate_policy" in doc["stages"][1] and "compensate_policy" not in doc["stages"][0]
    assert Plan.from_json(doc) == with_policies
    plain = plans.saga().to_json()
    assert "finaliser_policies" not in plain
    assert all("compensate_policy" not in s for s in plain["stages"])
