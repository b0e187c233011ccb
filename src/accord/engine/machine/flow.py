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
from accord.workflow.plan import TaskStage

__all__ = ["enter_task", "route", "route_failure"]


def route(d: Draft, source: str, target: str, state: str = "completed") -> None:
    """Release ``source->target`` once; ``state`` is how ``source`` ended (for joins)."""
    if d.intent is not None or not d.release(source, target):
        return
    if d.plan.is_terminal(target):
        set_intent(d, target, source)
        return
    stage = d.plan.stage(target)
    _follow(d, target, handler_of(stage).reached(d, stage, source, state))


def _follow(d: Draft, name: str, moves: Moves) -> None:
    for target, state in moves:
        route(d, name, target, state)


def route_failure(d: Draft, name: str, status: str, error: dict[str, Any]) -> None:
    """End task stage ``name`` in ``status`` (failed, timed-out, quarantined) along on_failure."""
    _follow(d, name, task.fail(d, name, status, error))


def enter_task(d: Draft, stage: TaskStage, number: int, *, first: bool) -> None:
    """Dispatch attempt ``number``; a binding error fails the stage terminally, no retry."""
    _follow(d, stage.name, task.enter(d, stage, number, first=first))
