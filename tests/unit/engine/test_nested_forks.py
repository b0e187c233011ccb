"""Nested forks at run time: joins matched to their forks, failure scoped to the inner fork."""

from __future__ import annotations

from accord.engine.machine.effects import RequestCancellation
from accord.engine.machine.kinds.join import in_branch
from accord.workflow.plan import TerminalPolicy
from tests.unit.engine import invariants as inv
from tests.unit.engine import plans
from tests.unit.engine.sim import Sim


def test_rule_a_nested_fork_releases_its_branches_and_both_joins_resolve_once() -> None:
    sim = Sim(plans.nested_fork())
    sim.start()
    assert sim.live() == ["a1", "a2", "b"]
    sim.succeed("a1")
    sim.succeed("a2")
    assert sim.state.join_arrivals["inner-join"] == ("a1", "a2")
    assert sim.live() == ["after-inner", "b"]
    sim.succeed("after-inner")
    sim.succeed("b")
    run = sim.drain()
    assert run.status == "completed"
    assert run.join_arrivals["outer-join"] == ("inner-fork", "b")  # the inner fork is a branch
    assert run.released.count("inner-join->after-inner") == 1
    inv.assert_i12_replay(sim.plan, sim.history, run)


def test_rule_an_inner_branch_failure_cancels_only_the_inner_forks_siblings() -> None:
    sim = Sim(plans.nested_fork())
    sim.start()
    tr = sim.fail("a1", code="broken")
    cancelled = [e.stage for e in tr.effects if isinstance(e, RequestCancellation)]
    assert cancelled == ["a2"]  # b, on the outer fork's other branch, goes on
    assert sim.state.stages["a2"].status == "cancelled"
    assert sim.state.stages["inner-join"].status == "failed"
    assert sim.state.stages["after-inner"].status == "pending"
    assert sim.state.intent is None and sim.live() == ["b", "recover"]
    sim.succeed("recover")
    sim.succeed("b")
    assert sim.drain().status == "completed"
    inv.assert_i12_replay(sim.plan, sim.history, sim.state)


def test_rule_an_outer_branch_failure_cancels_the_whole_inner_fork() -> None:
    sim = Sim(plans.nested_fork())
    sim.start()
    tr = sim.fail("b", code="broken")  # b routes into the outer join, which cannot succeed
    cancelled = sorted(e.stage for e in tr.effects if isinstance(e, RequestCancellation))
    assert cancelled == ["a1", "a2"]
    assert sim.state.stages["inner-join"].status == "skipped"
    assert sim.state.branch_states["inner-fork"] == "cancelled"
    assert sim.drain().status == "failed"


def test_rule_the_fail_run_policy_escalates_a_branch_failure() -> None:
    policy = TerminalPolicy(fork_branch_failure="fail-run")
    sim = Sim(plans.nested_fork(terminal_policy=policy))
    sim.start()
    sim.fail("a1", code="broken")
    assert sim.state.intent == "failed"
    assert sim.state.error is not None and sim.state.error["code"] == "branch-failed"
    assert {n for n in ("a2", "b") if sim.state.stages[n].status == "cancelled"} == {"a2", "b"}
    assert sim.drain().status == "failed"


def test_branch_membership_reaches_through_nesting() -> None:
    plan = plans.nested_fork()
    assert in_branch(plan, "a1", "inner-fork", "a1")
    assert in_branch(plan, "a1", "outer", "inner-fork")
    assert in_branch(plan, "inner-join", "outer", "inner-fork")
    assert not in_branch(plan, "b", "outer", "inner-fork")
    assert not in_branch(plan, "done", "outer", "b")
