"""Moving along edges.

:func:`route` is the only way a run moves forward. It records the edge (at most once, I4), and
then either sets the terminal intent or hands the stage it reached to that stage's kind
(:mod:`accord.engine.machine.kinds`): a task is dispatched, a decision or fork resolves inside the
same transition, a join records the arrival. The kind returns the edges the stage leaves along
and :func:`route` releases them in turn. Nothing starts once a terminal intent exists: a fork
whose first branch failed at bind time does not go on to dispatch its second.
"""

from __future__ import annotations

from typing import Any

from accord.engine.machine.draft import Draft
from accord.engine.machine.finalise import set_intent
from accord.engine.machine.kinds import Moves, handler_of, task
from accord.engine.machine.state import ACTIVE_STAGE, WAITING, evolve
from accord.workflow.kinds import kind_of
from accord.workflow.plan import ApprovalStage, DecisionStage, JoinStage, Plan, TaskStage

__all__ = ["enter_task", "route", "route_failure", "skip_unreachable"]

# a stage in one of these may still move the run along its edges (a failed task may be re-driven)
_ALIVE = ACTIVE_STAGE | {WAITING, "failed", "timed-out", "quarantined", "cancelled"}
_SUCCESSORS: dict[str, dict[str, tuple[str, ...]]] = {}  # plan digest → stage → targets


def route(d: Draft, source: str, target: str, state: str = "completed") -> None:
    """Release ``source->target`` once; ``state`` is how ``source`` ended (for joins)."""
    if d.intent is not None or not d.release(source, target):
        return
    if d.plan.is_terminal(target):
        set_intent(d, target, source)
        return
    stage = d.plan.stage(target)
    _follow(d, target, handler_of(stage).reached(d, stage, source, state))
    if isinstance(stage, DecisionStage):  # a route was chosen: what it bypassed is skipped
        d.rerouted = True


def _follow(d: Draft, name: str, moves: Moves) -> None:
    for target, state in moves:
        route(d, name, target, state)


def route_failure(d: Draft, name: str, status: str, error: dict[str, Any]) -> None:
    """End task stage ``name`` in ``status`` (failed, timed-out, quarantined) along on_failure."""
    _follow(d, name, task.fail(d, name, status, error))


def enter_task(d: Draft, stage: TaskStage, number: int, *, first: bool) -> None:
    """Dispatch attempt ``number``; a binding error fails the stage terminally, no retry."""
    _follow(d, stage.name, task.enter(d, stage, number, first=first))


def _successors(plan: Plan) -> dict[str, tuple[str, ...]]:
    found = _SUCCESSORS.get(plan.digest)
    if found is None:
        if len(_SUCCESSORS) > 256:
            _SUCCESSORS.clear()
        found = _SUCCESSORS[plan.digest] = {
            s.name: tuple(t for t, _, _ in kind_of(s).arrows(s) if plan.has_stage(t))
            for s in plan.stages
        }
    return found


def skip_unreachable(d: Draft) -> None:
    """Mark ``skipped`` every pending stage no path can reach any more, once a decision or an
    approval gate chose a route: nothing will wait for it. A stage is still reachable from a live
    or waiting stage, from a failed task (an operator may re-drive it), and from a join some
    branches have arrived at. Nothing is skipped once the run has a terminal intent."""
    d.rerouted = False
    if d.intent is not None:
        return
    succ = _successors(d.plan)
    todo = [
        n
        for n, st in d.stages.items()
        if not n.startswith("@")
        and (
            (st.status in _ALIVE and not isinstance(d.plan.stage(n), DecisionStage | ApprovalStage))
            or st.status == WAITING
            or (isinstance(d.plan.stage(n), JoinStage) and n in d.join_arrivals)
        )
    ]
    reach = set(todo)
    while todo:
        for nxt in succ[todo.pop()]:
            if nxt not in reach:
                reach.add(nxt)
                todo.append(nxt)
    for s in d.plan.stages:
        st = d.stages[s.name]
        if st.status == "pending" and s.name not in reach:
            d.put(evolve(st, status="skipped"))
            d.telemetry("stage.skipped", s.name)
