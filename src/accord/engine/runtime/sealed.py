"""Where the engine seals: a run's context as it starts, and each stage's result as it commits.

The machine builds the run record, its history and every job payload from the context and the
stage results (:func:`accord.workflow.bindings.resolve_inputs`), so sealing those two at the door
is enough for all three to hold only ciphertext where a field is ``sensitive``
(:mod:`accord.contracts.sealing`):

* the context, by the plan's context contract, after :meth:`Engine.start_run` has validated it
  in clear (a plan without a context contract has nothing marked sensitive to seal);
* a result, by the result contract its stage's capability pins (finalisers and compensations
  too), after the result hooks have checked it in clear. A worker holding the key seals its
  results itself; this catches the ones that arrive in clear (a worker without the key), and
  the results of the engine's own actions.

Both need the contract catalog: an engine without one seals nothing (and says so at start-up
where the key is configured).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from accord.contracts.model import MessageContract
from accord.contracts.sealing import Keyring, seal_fields
from accord.engine.machine.envelope import target_of
from accord.engine.machine.events import StageSucceeded
from accord.engine.runtime.checks import MessageCatalog
from accord.workflow.plan import Plan, TaskStage

__all__ = ["seal_context", "seal_result"]


def seal_context(
    catalog: MessageCatalog | None, plan: Plan, context: dict[str, Any], keyring: Keyring | None
) -> dict[str, Any]:
    """``context`` with the fields of the plan's context contract marked sensitive sealed."""
    if keyring is None or catalog is None or plan.context_contract is None:
        return context
    sealed: dict[str, Any] = seal_fields(catalog.message(plan.context_contract), context, keyring)
    return sealed


def _result_contract(catalog: MessageCatalog, plan: Plan, stage: str) -> MessageContract | None:
    if plan.has_stage(stage):
        found = plan.stage(stage)
        return catalog.message(found.capability.result) if isinstance(found, TaskStage) else None
    try:
        pin = target_of(plan, stage).pin
    except (AssertionError, IndexError, KeyError, ValueError, LookupError):
        return None  # not a stage of this plan: the machine refuses the event
    return catalog.message(pin.result)


def seal_result(
    catalog: MessageCatalog | None, plan: Plan, event: StageSucceeded, keyring: Keyring | None
) -> StageSucceeded:
    """``event`` with the sensitive fields of its result (by its stage's result contract)
    sealed; the same event when there is nothing to seal."""
    if keyring is None or catalog is None or not event.result:
        return event
    contract = _result_contract(catalog, plan, event.stage)
    sealed: Mapping[str, Any] = seal_fields(contract, event.result, keyring)
    if sealed is event.result:
        return event
    return dataclasses.replace(event, result=dict(sealed))
