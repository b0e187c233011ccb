"""Result checks: a hook chain the shell runs over every success before the machine sees it.

One input dataclass per hook (:class:`ResultCheck`: the plan, the run record, the event); a hook
answers with violation messages, empty when the result is fine. When any hook objects, the shell
hands the machine a terminal ``invalid-result`` failure for that attempt instead of the success,
and that failure is what the history records — so replay never needs the hooks again (I12).

:func:`contract_result_check` is the standard hook: the stage's pinned result contract, looked up
in a contract catalog and validated with :class:`~accord.contracts.validate.Validator`. The
engine runs without any hook when no catalog is at hand.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from accord.contracts.model import MessageContract
from accord.contracts.validate import Validator
from accord.engine.machine.events import StageFailed, StageSucceeded
from accord.engine.machine.state import RunState
from accord.workflow.plan import Plan, TaskStage

__all__ = ["ResultCheck", "ResultHook", "contract_result_check", "run_result_checks"]


@dataclass(frozen=True, slots=True)
class ResultCheck:
    plan: Plan
    run: RunState
    event: StageSucceeded


ResultHook = Callable[[ResultCheck], Sequence[str]]


class MessageCatalog(Protocol):
    def message(self, ref: str) -> MessageContract | None: ...

    def messages(self) -> list[MessageContract]: ...


def contract_result_check(catalog: MessageCatalog) -> ResultHook:
    """Validate a task stage's result against the result contract its capability pins."""

    def check(c: ResultCheck) -> Sequence[str]:
        if not c.plan.has_stage(c.event.stage):
            return ()  # pseudo-stages (finalisers, compensations) carry no stage contract
        stage = c.plan.stage(c.event.stage)
        if not isinstance(stage, TaskStage):
            return ()
        contract = catalog.message(stage.capability.result)
        if contract is None:
            return (f"result contract {stage.capability.result} is not in the catalog",)
        result = Validator.for_contract(contract).validate(c.event.result)
        return [f"{v.path or '$'}: {v.message}" for v in result.violations]

    return check


def run_result_checks(
    hooks: Sequence[ResultHook], plan: Plan, run: RunState, event: StageSucceeded
) -> StageSucceeded | StageFailed:
    """The event the machine should see: the success, or the failure the hooks turned it into."""
    violations = [v for hook in hooks for v in hook(ResultCheck(plan, run, event))]
    if not violations:
        return event
    return StageFailed(
        run_id=event.run_id,
        stage=event.stage,
        attempt=event.attempt,
        fence=event.fence,
        message_id=event.message_id,
        at_ms=event.at_ms,
        entropy=event.entropy,
        retryable=False,
        code="invalid-result",
        message="; ".join(violations)[:2000],
    )
