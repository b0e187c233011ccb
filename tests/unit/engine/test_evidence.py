"""Evidence at run time: a success without it is a terminal ``missing-evidence`` failure, and
the evidence a success carried is in the run's explanation."""

from __future__ import annotations

import dataclasses

from accord.engine.machine.explain import explain_history
from accord.workflow.plan import Plan, RetryPolicy
from tests.unit.engine import invariants as inv
from tests.unit.engine import plans
from tests.unit.engine.sim import Sim


def _plan(**top: object) -> Plan:
    stages = (
        plans.task("ship", "ship@1", "publish", retry=RetryPolicy(max_attempts=3),
                   evidence=("receipt.id", "carrier")),
        plans.task("publish", "publish@1", "completed", kind="action"),
    )  # fmt: skip
    return plans.make("evidenced", "ship", stages, **top)


def test_rule_a_success_without_its_evidence_is_a_terminal_missing_evidence_failure() -> None:
    sim = Sim(_plan())
    sim.start()
    sim.succeed("ship", {"receipt": {"id": None}, "carrier": "acme-post"})
    ship = sim.state.stages["ship"]
    assert ship.status == "failed" and ship.attempt == 1  # not retried
    assert ship.error == {"code": "missing-evidence", "missing": ["receipt.id"],
                          "retryable": False, "attempt": 1}  # fmt: skip
    assert ship.current is not None and ship.current.status == "succeeded"
    run = sim.drain()
    assert run.status == "failed" and run.error is not None
    assert run.error["code"] == "missing-evidence" and run.error["stage"] == "ship"
    inv.assert_i12_replay(sim.plan, sim.history, run)


def test_rule_evidence_is_listed_in_the_explanation() -> None:
    sim = Sim(_plan())
    sim.start()
    sim.succeed("ship", {"receipt": {"id": "r-9"}, "carrier": "acme-post"})
    run = sim.drain()
    assert run.status == "completed"
    lines = explain_history(run, sim.history)
    assert any("evidence of 'ship': receipt.id=r-9, carrier=acme-post" in x for x in lines)


def test_rule_workflow_evidence_is_required_of_the_completing_stage() -> None:
    plan = _plan(evidence=("entryId",))
    sim = Sim(plan)
    sim.start()
    sim.succeed("ship", {"receipt": {"id": "r-9"}, "carrier": "c"})
    sim.succeed("publish", {"status": "listed"})
    assert sim.state.intent == "failed"
    assert sim.state.error == {"code": "missing-evidence", "missing": ["entryId"],
                               "stage": "publish"}  # fmt: skip
    assert sim.drain().status == "failed"
    good = Sim(plan)
    good.start()
    good.succeed("ship", {"receipt": {"id": "r-9"}, "carrier": "c"})
    good.succeed("publish", {"entryId": "e-1"})
    run = good.drain()
    assert run.status == "completed" and run.result == {"entryId": "e-1"}
    assert any("evidence of the run: entryId=e-1" in x for x in explain_history(run, good.history))


def test_a_stage_without_evidence_is_unchanged() -> None:
    stages = tuple(dataclasses.replace(s, evidence=()) for s in _plan().stages)  # type: ignore[call-arg]
    sim = Sim(plans.make("plain", "ship", stages))
    sim.start()
    sim.succeed("ship", {})
    assert sim.state.stages["ship"].status == "completed"
