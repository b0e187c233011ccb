"""Forks record what they release; joins persist arrivals and release once (I4)."""

from __future__ import annotations

import dataclasses

from accord.engine.machine.effects import DispatchJob, InvokeAction, RequestCancellation
from accord.engine.machine.state import RunState
from accord.workflow.plan import JoinStage
from tests.unit.engine import invariants as inv
from tests.unit.engine import plans
from tests.unit.engine.sim import Sim

BRANCHES = ("semantic-analysis", "technical-metadata")


def _at_fork() -> Sim:
    sim = Sim(plans.model_ingest())
    sim.start()
    sim.succeed("cache-lookup", {"hit": False})
    sim.accept("render-thumbnail")
    sim.succeed("render-thumbnail", {"thumbnail": "t.png"})
    return sim


def test_rule_fork_records_released_branches_and_dispatches_each() -> None:
    sim = _at_fork()
    run = sim.state
    assert "derive-fork->semantic-analysis" in run.released
    assert "derive-fork->technical-metadata" in run.released
    assert run.stages["derive-fork"].status == "completed"
    jobs = [e for e in sim.last.effects if isinstance(e, DispatchJob)]  # type: ignore[union-attr]
    assert sorted(j.envelope["stage"] for j in jobs) == sorted(BRANCHES)
    assert {j.envelope["branch"] for j in jobs} == set(BRANCHES)


def test_rule_join_persists_each_arrival_in_the_record() -> None:
    sim = _at_fork()
    sim.succeed("technical-metadata", {"faces": 12})
    run = sim.state
    assert run.join_arrivals == {"derive-join": ("technical-metadata",)}
    assert run.branch_states == {"technical-metadata": "completed"}
    assert run.stages["derive-join"].status == "pending"
    # the arrival survives serialisation: nothing is gathered in memory
    assert RunState.from_json(run.to_json()).join_arrivals == run.join_arrivals


def test_rule_join_releases_successor_exactly_once_when_all_required_arrived() -> None:
    sim = _at_fork()
    sim.succeed("semantic-analysis", {"tags": ["chair"]})
    tr = sim.succeed("technical-metadata", {"faces": 12})
    assert sim.state.stages["derive-join"].status == "completed"
    assert sim.state.released.count("derive-join->publish") == 1
    invokes = [e for e in tr.effects if isinstance(e, InvokeAction)]
    assert [e.envelope["stage"] for e in invokes] == ["publish"]
    dup = sim.apply(sim.callbacks[-1])
    assert dup.history[0].reason == "duplicate" and dup.effects == ()


def test_I4_each_edge_releases_its_successor_at_most_once() -> None:
    sim = _at_fork()
    for stage in BRANCHES:
        before = sim.state
        sim.succeed(stage)
        inv.assert_i4_no_double_release(before, sim.state, (d.job_id for d in sim.dispatched))
        for _ in range(2):  # duplicate deliveries of the same outcome
            before = sim.state
            sim.apply(sim.callbacks[-1])
            inv.assert_i4_no_double_release(before, sim.state, (d.job_id for d in sim.dispatched))
    assert sum(1 for d in sim.dispatched if d.envelope["stage"] == "publish") == 1


def test_rule_branch_failure_sets_failed_intent_and_fences_active_siblings() -> None:
    sim = _at_fork()
    sim.accept("technical-metadata")
    sibling = sim.state.stages["technical-metadata"]
    tr = sim.fail("semantic-analysis", code="model-unreadable")
    run = sim.state
    assert run.intent == "failed" and run.status == "finalising"
    assert run.error is not None and run.error["stage"] == "semantic-analysis"
    (cancel,) = [e for e in tr.effects if isinstance(e, RequestCancellation)]
    assert (cancel.stage, cancel.attempt, cancel.fence) == ("technical-metadata", 1, sibling.fence)
    assert cancel.queue == "technical-metadata"
    fenced = run.stages["technical-metadata"]
    assert fenced.status == "cancelled" and fenced.current.status == "cancelled"  # type: ignore[union-attr]
    # remote work was never assumed stopped: its later success is recorded as late
    late = sim.succeed("technical-metadata")
    assert (
        late.history[0].reason == "late"
        and sim.state.stages["technical-metadata"].status == "cancelled"
    )


def test_join_with_failed_branch_in_acceptable_states_releases_success() -> None:
    sim = Sim(plans.tolerant_fork())
    sim.start()
    sim.fail("left")
    assert sim.state.intent is None and sim.state.branch_states == {"left": "failed"}
    sim.succeed("right")
    assert sim.state.stages["merge"].result == {
        "branches": {"left": "failed", "right": "completed"}
    }
    assert "merge->done" in sim.state.released
    assert sim.drain().status == "completed"


def test_join_with_unacceptable_branch_state_follows_on_failure() -> None:
    plan = plans.tolerant_fork()
    join = plan.stage("merge")
    assert isinstance(join, JoinStage)
    strict_join = dataclasses.replace(join, acceptable_terminal_states=("completed",))
    stages = tuple(strict_join if s.name == "merge" else s for s in plan.stages)
    strict = plans.make("strict-fork", "split", stages)
    sim = Sim(strict)
    sim.start()
    sim.poison("left")  # the join can no longer succeed: its fork's other branch is stopped
    merge = sim.state.stages["merge"]
    assert merge.status == "failed" and merge.error is not None
    assert merge.error["branches"] == {"left": "quarantined", "right": "cancelled"}
    assert sim.state.stages["right"].status == "cancelled"
    assert not sim.succeed("right").accepted  # the fenced attempt's report changes nothing
    assert sim.state.intent == "failed" and "merge->failed" in sim.state.released
