"""Join stages at run time: durable arrivals, one successor released once.

Every edge into a join is one branch arriving: the arrival and the state the branch ended in are
recorded in the run record itself (nothing is gathered in memory). When every required branch has
arrived the join resolves, along ``on_success`` if all arrived in acceptable states, else along
``on_failure``.
"""

from __future__ import annotations

from accord.engine.machine.draft import Draft
from accord.engine.machine.kinds.base import Handler, Moves, complete
from accord.engine.machine.state import evolve
from accord.workflow.plan import JoinStage

__all__ = ["HANDLER"]


def reached(d: Draft, join: JoinStage, source: str, state: str) -> Moves:
    """Persist one branch arrival; release the join's successor once all required arrived."""
    source_stage = d.plan.stage(source)
    branch = source_stage.branch or source
    arrivals = d.join_arrivals.get(join.name, ())
    if branch in arrivals:
        return ()
    arrivals = (*arrivals, branch)
    d.join_arrivals = {**d.join_arrivals, join.name: arrivals}
    d.branch_states = {**d.branch_states, branch: state}
    if not set(join.required) <= set(arrivals):
        return ()
    states = {b: d.branch_states[b] for b in join.required}
    if all(s in join.acceptable_terminal_states for s in states.values()):
        complete(d, join.name, {"branches": states})
        return ((join.on_success, "completed"),)
    error = {"code": "join-unsatisfied", "branches": states}
    d.put(evolve(d.stages[join.name], status="failed", error=error, released=True))
    return ((join.on_failure, "failed"),)


HANDLER: Handler[JoinStage] = Handler("join", JoinStage, reached)
