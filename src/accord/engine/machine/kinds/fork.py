"""Fork stages at run time: resolved at once, recording and releasing every branch in order.

Releasing stops at the first branch that sets a terminal intent (say, a binding error failing its
first task): :func:`~accord.engine.machine.flow.route` starts nothing once an intent exists.
"""

from __future__ import annotations

from accord.engine.machine.draft import Draft
from accord.engine.machine.kinds.base import Handler, Moves, complete, pending
from accord.workflow.plan import ForkStage

__all__ = ["HANDLER"]


def reached(d: Draft, stage: ForkStage, source: str, state: str) -> Moves:
    if not pending(d, stage.name):
        return ()
    complete(d, stage.name, {"branches": list(stage.branches)})
    return tuple((branch, "completed") for branch in stage.branches)


HANDLER: Handler[ForkStage] = Handler("fork", ForkStage, reached)
