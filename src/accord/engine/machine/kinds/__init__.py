"""The run-time half of each stage kind, one module each, registered under the same names as
the compile-time half (:data:`accord.workflow.kinds.KINDS`).

==============  ===========================================================================
kind            what reaching a stage of the kind does (:mod:`.base` has the contract)
==============  ===========================================================================
``task``        :mod:`.task` — dispatch the first fenced attempt (or fail on a binding error)
``decision``    :mod:`.decision` — evaluate the branches, leave along the first that holds
``fork``        :mod:`.fork` — complete, then release every branch
``join``        :mod:`.join` — record the arrival; leave once every required branch arrived
``approval``    :mod:`.approval` — wait (durably, with a timeout timer) for people to decide
==============  ===========================================================================

:func:`handler_of` is the only way the machine finds a kind's handler. A kind the compiler knows
but this table does not is a wiring mistake, refused with :class:`~accord.errors.EngineError`
rather than ignored (an ignored stage would leave its run waiting for ever).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, assert_never, get_args

from accord.engine.machine.kinds import approval, decision, fork, join, task
from accord.engine.machine.kinds.base import Handler, Moves
from accord.errors import EngineError
from accord.workflow.kinds import KindName

__all__ = ["HANDLERS", "Handler", "Moves", "handler_of"]


def _registered(name: KindName) -> Handler[Any]:
    match name:
        case "task":
            return task.HANDLER
        case "decision":
            return decision.HANDLER
        case "fork":
            return fork.HANDLER
        case "join":
            return join.HANDLER
        case "approval":
            return approval.HANDLER
        case _:
            assert_never(name)


HANDLERS: Mapping[KindName, Handler[Any]] = MappingProxyType(
    {name: _registered(name) for name in get_args(KindName)}
)
_BY_CLASS: Mapping[type, Handler[Any]] = MappingProxyType({h.stage: h for h in HANDLERS.values()})


def handler_of(stage: object) -> Handler[Any]:
    """The handler for a plan stage; :class:`EngineError` when no kind handles its class."""
    found = _BY_CLASS.get(type(stage))
    if found is None:
        name = getattr(stage, "name", "?")
        kind = getattr(stage, "type", type(stage).__name__)
        raise EngineError(
            f"stage {name!r} is of kind {kind!r}, which this engine cannot run "
            f"(it runs {', '.join(sorted(HANDLERS))})"
        )
    return found
