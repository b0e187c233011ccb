"""The ``skipped`` stage status: a stage a chosen route bypasses, so nothing waits for it."""

from __future__ import annotations

from accord.engine.machine.effects import EmitTelemetry
from accord.engine.machine.explain import explain_history
from accord.workflow.plan import DecisionBranch, DecisionStage, RetryPolicy
from tests.unit.engine import invariants as inv
from tests.unit.engine import plans
from tests.unit.engine.sim import Sim

BYPASSED = ("render-thumbnail", "derive-fork", "semantic-analysis", "technical-metadata",
            "derive-join")  # fmt: skip


def test_rule_a_decision_skips_every_stage_its_route_bypasses() -> None:
    sim = Sim(plans.model_ingest())
    sim.start()
    tr = sim.succeed("cache-lookup", {"hit": True})
    assert {n: tr.run.stages[n].status for n in BYPASSED} == dict.fromkeys(BYPASSED, "skipped")
    skipped = [e.attributes["stage"] for e in tr.effects
               if isinstance(e, EmitTelemetry) and e.name == "stage.skipped"]  # fmt: skip
    assert sorted(skipped) == sorted(BYPASSED)
    run = sim.drain()
    assert run.status == "completed"
    inv.assert_i12_replay(sim.plan, sim.history, run)


def test_rule_the_route_taken_is_never_skipped() -> None:
    sim = Sim(plans.model_ingest())
    sim.start()
    tr = sim.succeed("cache-lookup", {"hit": False})
    assert not [s for s in tr.run.stages.values() if s.status == "skipped"]
    assert sim.drain(results={"cache-lookup": {"hit": False}}).status == "completed"


def test_rule_a_gate_skips_the_route_it_did_not_take() -> None:
    plan = plans.make(
        "gate-routes",
        "review",
        (
            plans.gate("review", "publish", on_reject="revise"),
            plans.task("publish", "publish@1", "completed"),
            plans.task("revise", "revise@1", "completed"),
        ),
    )
    sim = Sim(plan)
    sim.start()
    tr = sim.decide("review", "reject")
    assert tr.run.stages["publish"].status == "skipped"
    assert tr.run.stages["revise"].status == "queued"


def test_rule_a_stage_a_failed_task_may_still_reach_is_not_skipped() -> None:
    """``work`` fails over to ``route``, whose fallback goes to ``notify``: ``after`` is
    bypassed only as long as nobody re-drives ``work``, so it stays pending (and then runs)."""
    stages = (
        plans.task("work", "work@1", "after", "route", retry=RetryPolicy(max_attempts=1)),
        DecisionStage(
            name="route",
            branches=(DecisionBranch(when="true", next="notify"),),
            on_evaluation_error="failed",
        ),
        plans.task("notify", "notify@1", "after"),
        plans.task("after", "after@1", "completed"),
    )
    sim = Sim(plans.make("failover", "work", stages))
    sim.start()
    sim.fail("work", code="terminal")
    assert sim.state.intent is None and sim.live() == ["notify"]
    assert sim.state.stages["after"].status == "pending"
    sim.succeed("notify")
    assert sim.live() == ["after"]


def test_explain_lists_the_skipped_stages() -> None:
    sim = Sim(plans.model_ingest())
    sim.start()
    sim.succeed("cache-lookup", {"hit": True})
    lines = explain_history(sim.state, sim.history)
    assert any(line.startswith("skipped (no route reaches them): ") and "derive-join" in line
               for line in lines)  # fmt: skip
