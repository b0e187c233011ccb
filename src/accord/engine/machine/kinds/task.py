"""Task stages at run time: entering one dispatches its first fenced attempt.

Everything after dispatch — callbacks, clocks, retries, poison, re-drive — is the attempt
protocol of :mod:`~accord.engine.machine.outcomes` and :mod:`~accord.engine.machine.clocks`,
which reach back here through :func:`enter` (a new attempt) and :func:`fail` (leave along
``on_failure``), wrapped by :mod:`~accord.engine.machine.flow`.
"""

from __future__ import annotations

from typing import Any

from accord.engine.machine.draft import Draft
from accord.engine.machine.envelope import payload_for, start_attempt
from accord.engine.machine.kinds.base import Handler, Moves, pending
from accord.engine.machine.state import evolve
from accord.workflow.bindings import BindingError
from accord.workflow.plan import TaskStage

__all__ = ["HANDLER", "enter", "fail"]


def reached(d: Draft, stage: TaskStage, source: str, state: str) -> Moves:
    return enter(d, stage, 1, first=True) if pending(d, stage.name) else ()


def enter(d: Draft, stage: TaskStage, number: int, *, first: bool) -> Moves:
    """Dispatch attempt ``number``; a binding error fails the stage terminally, no retry."""
    try:
        payload = payload_for(d.plan, d.base, d.stages, stage.name, intent=d.intent, error=d.error)
    except BindingError as exc:
        error = {"code": exc.code, "message": exc.message, "path": exc.path, "retryable": False}
        return fail(d, stage.name, "failed", error)
    start_attempt(d, stage.name, number, payload, first=first)
    return ()


def fail(d: Draft, name: str, status: str, error: dict[str, Any]) -> Moves:
    """End task stage ``name`` in ``status`` (failed, timed-out, quarantined) along on_failure."""
    stage = d.plan.stage(name)
    assert isinstance(stage, TaskStage)
    d.put(evolve(d.stages[name], status=status, error=error, released=True))
    d.telemetry("stage.failed", name, status=status, code=error.get("code", status))
    return ((stage.on_failure, status),)


HANDLER: Handler[TaskStage] = Handler("task", TaskStage, reached)
