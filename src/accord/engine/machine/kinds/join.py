"""Join stages at run time: durable arrivals, one successor released once.

Every edge into a join is one branch arriving: the arrival and the state the branch ended in are
recorded in the run record itself (nothing is gathered in memory). When every required branch has
arrived the join resolves, along ``on_success`` if all arrived in acceptable states, else along
``on_failure``.

A branch arriving in a state the join does not accept means the join can no longer succeed. The
cancellation that follows is scoped to the join's fork: the live stages of its other branches
(nested forks' stages included) are fenced and asked to stop, a waiting gate among them is
cancelled, their pending stages are ``skipped``, those branches arrive ``cancelled``, and the join
leaves along ``on_failure`` at once. The enclosing fork's other branches go on. With the
terminal policy ``fork_branch_failure: fail-run`` the failure escalates instead: the run's
intent becomes ``failed`` (and every live stage is fenced).
"""

from __future__ import annotations

from accord.engine.machine.draft import Draft
from accord.engine.machine.finalise import fence_stage, set_intent
from accord.engine.machine.kinds.base import Handler, Moves, complete
from accord.engine.machine.state import evolve
from accord.workflow.plan import JoinStage, Plan

__all__ = ["HANDLER", "in_branch"]

ESCALATE = "fail-run"


def in_branch(plan: Plan, name: str, fork: str, entry: str) -> bool:
    """Whether stage ``name`` is on branch ``entry`` of ``fork``, at any depth of nesting."""
    stage = plan.stage(name)
    while stage.fork is not None:
        if stage.fork == fork and stage.branch == entry:
            return True
        stage = plan.stage(stage.fork)
    return False


def reached(d: Draft, join: JoinStage, source: str, state: str) -> Moves:
    """Persist one branch arrival; release the join's successor once all required arrived."""
    source_stage = d.plan.stage(source)
    branch = source_stage.branch or source
    arrivals = d.join_arrivals.get(join.name, ())
    if branch in arrivals:
        return ()
    arrivals = (*arrivals, branch)
    states = {**d.branch_states, branch: state}
    unacceptable = state not in join.acceptable_terminal_states
    if unacceptable and not set(join.required) <= set(arrivals):
        if d.plan.terminal_policy.fork_branch_failure == ESCALATE:
            d.join_arrivals = {**d.join_arrivals, join.name: arrivals}
            d.branch_states = states
            failure = {"stage": join.name, "code": "branch-failed", "branch": branch}
            failure["state"] = state
            set_intent(d, "failed", source, failure)
            return ()
        for entry in join.required:
            if entry not in arrivals:
                _stop_branch(d, join, entry)
                arrivals = (*arrivals, entry)
                states[entry] = "cancelled"
    d.join_arrivals = {**d.join_arrivals, join.name: arrivals}
    d.branch_states = states
    if not set(join.required) <= set(arrivals):
        return ()
    ended = {b: d.branch_states[b] for b in join.required}
    if all(s in join.acceptable_terminal_states for s in ended.values()):
        complete(d, join.name, {"branches": ended})
        return ((join.on_success, "completed"),)
    error: dict[str, object] = {"code": "join-unsatisfied", "branches": ended}
    d.put(evolve(d.stages[join.name], status="failed", error=error, released=True))
    return ((join.on_failure, "failed"),)


def _stop_branch(d: Draft, join: JoinStage, entry: str) -> None:
    """Fence what is live on branch ``entry`` of the join's fork; skip what has not started."""
    assert join.fork is not None
    reason = f"branch of fork {join.fork!r} failed"
    for stage in d.plan.stages:
        if not in_branch(d.plan, stage.name, join.fork, entry):
            continue
        if not fence_stage(d, stage.name, reason) and d.stages[stage.name].status == "pending":
            d.put(evolve(d.stages[stage.name], status="skipped"))
    d.telemetry("branch.cancelled", join.fork, branch=entry)


HANDLER: Handler[JoinStage] = Handler("join", JoinStage, reached)
