"""Moving along edges: entering stages, decisions, forks and durable joins.

:func:`route` is the only way a run moves forward. It records the edge (at most once, I4), and
then either sets the terminal intent, records a join arrival, or enters the next stage. Decisions
and forks resolve inside the same transition; task stages are dispatched. Nothing starts once a
terminal intent exists: a fork whose first branch failed at bind time does not go on to dispatch
its second.
"""

from __future__ import annotations

from typing import Any

from accord.engine.draft import Draft
from accord.engine.envelope import payload_for, start_attempt
from accord.engine.finalise import set_intent
from accord.engine.state import evolve
from accord.workflow.bindings import BindingError
from accord.workflow.expressions import ExpressionError, evaluate
from accord.workflow.plan import DecisionStage, ForkStage, JoinStage, Stage, TaskStage

__all__ = ["enter_task", "route", "route_failure"]


def route(d: Draft, source: str, target: str, state: str = "completed") -> None:
    """Release ``source->target`` once; ``state`` is how ``source`` ended (for joins)."""
    if d.intent is not None or not d.release(source, target):
        return
    if d.plan.is_terminal(target):
        set_intent(d, target, source)
        return
    stage = d.plan.stage(target)
    if isinstance(stage, JoinStage):
        _arrive(d, stage, source, state)
    elif d.stages[target].status == "pending":
        _enter(d, stage)


def route_failure(d: Draft, name: str, status: str, error: dict[str, Any]) -> None:
    """End task stage ``name`` in ``status`` (failed, timed-out, quarantined) along on_failure."""
    stage = d.plan.stage(name)
    assert isinstance(stage, TaskStage)
    d.put(evolve(d.stages[name], status=status, error=error, released=True))
    d.telemetry("stage.failed", name, status=status, code=error.get("code", status))
    route(d, name, stage.on_failure, status)


def enter_task(d: Draft, stage: TaskStage, number: int, *, first: bool) -> None:
    """Dispatch attempt ``number``; a binding error fails the stage terminally, no retry."""
    try:
        payload = payload_for(d.plan, d.base, d.stages, stage.name, intent=d.intent, error=d.error)
    except BindingError as exc:
        error = {"code": exc.code, "message": exc.message, "path": exc.path, "retryable": False}
        route_failure(d, stage.name, "failed", error)
        return
    start_attempt(d, stage.name, number, payload, first=first)


def _enter(d: Draft, stage: Stage) -> None:
    if isinstance(stage, TaskStage):
        enter_task(d, stage, 1, first=True)
    elif isinstance(stage, DecisionStage):
        _decide(d, stage)
    elif isinstance(stage, ForkStage):
        _complete(d, stage.name, {"branches": list(stage.branches)})
        for branch in stage.branches:
            route(d, stage.name, branch)


def _complete(d: Draft, name: str, result: dict[str, Any]) -> None:
    d.put(evolve(d.stages[name], status="completed", result=result, released=True))


def _decide(d: Draft, stage: DecisionStage) -> None:
    # the compiler lists the stages each branch reads; without that list, offer them all
    names = {n for b in stage.branches for n in b.references} or [s.name for s in d.plan.stages]
    view = {
        n: {"result": s.result or {}, "state": s.status}
        for n in names
        if (s := d.stages.get(n)) is not None
    }
    try:
        for index, branch in enumerate(stage.branches):
            if evaluate(branch.when, d.context, view):
                _complete(d, stage.name, {"next": branch.next, "branch": index})
                route(d, stage.name, branch.next)
                return
        message = "no branch matched (the fallback must be last and true)"
    except ExpressionError as exc:
        message = exc.message
    error = {"code": "evaluation-error", "message": message}
    d.put(evolve(d.stages[stage.name], status="failed", error=error, released=True))
    route(d, stage.name, stage.on_evaluation_error, "failed")


def _arrive(d: Draft, join: JoinStage, source: str, state: str) -> None:
    """Persist one branch arrival; release the join's successor once all required arrived."""
    source_stage = d.plan.stage(source)
    branch = source_stage.branch or source
    arrivals = d.join_arrivals.get(join.name, ())
    if branch in arrivals:
        return
    arrivals = (*arrivals, branch)
    d.join_arrivals = {**d.join_arrivals, join.name: arrivals}
    d.branch_states = {**d.branch_states, branch: state}
    if not set(join.required) <= set(arrivals):
        return
    states = {b: d.branch_states[b] for b in join.required}
    ok = all(s in join.acceptable_terminal_states for s in states.values())
    if ok:
        _complete(d, join.name, {"branches": states})
        route(d, join.name, join.on_success)
    else:
        error = {"code": "join-unsatisfied", "branches": states}
        d.put(evolve(d.stages[join.name], status="failed", error=error, released=True))
        route(d, join.name, join.on_failure, "failed")
