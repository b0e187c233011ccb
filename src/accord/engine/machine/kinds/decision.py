"""Decision stages at run time: evaluated inside the transition that reaches them.

The first branch whose expression holds is taken; an expression error (or, against a plan the
compiler would refuse, no matching branch) fails the decision along ``on_evaluation_error``.
"""

from __future__ import annotations

from accord.engine.machine.draft import Draft
from accord.engine.machine.kinds.base import Handler, Moves, complete, pending
from accord.engine.machine.state import evolve
from accord.workflow.expressions import ExpressionError, evaluate
from accord.workflow.plan import DecisionStage

__all__ = ["HANDLER"]


def reached(d: Draft, stage: DecisionStage, source: str, state: str) -> Moves:
    if not pending(d, stage.name):
        return ()
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
                complete(d, stage.name, {"next": branch.next, "branch": index})
                return ((branch.next, "completed"),)
        message = "no branch matched (the fallback must be last and true)"
    except ExpressionError as exc:
        message = exc.message
    error = {"code": "evaluation-error", "message": message}
    d.put(evolve(d.stages[stage.name], status="failed", error=error, released=True))
    return ((stage.on_evaluation_error, "failed"),)


HANDLER: Handler[DecisionStage] = Handler("decision", DecisionStage, reached)
