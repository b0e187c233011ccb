"""What a stage kind does at run time: the :class:`Handler` record each kind module fills in.

A handler never routes by itself. ``reached`` is called when an edge into a stage of its kind is
released; it changes the draft (dispatches, records a result or an arrival) and returns the edges
the stage now leaves along, as :data:`Moves`. :func:`accord.engine.machine.flow.route` releases
them, so releasing an edge once (I4) and starting nothing after a terminal intent stay in one
place, and no handler recurses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

from accord.engine.machine.draft import Draft
from accord.engine.machine.state import evolve

__all__ = ["Handler", "Moves", "complete", "pending"]

# The edges a stage leaves along, in order: (target, how the stage ended, for joins downstream).
Moves: TypeAlias = tuple[tuple[str, str], ...]

S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class Handler(Generic[S]):
    """The run-time half of one stage kind, registered under the kind's name."""

    name: str  # the same key as the kind's in ``accord.workflow.kinds.KINDS``
    stage: type[S]  # the plan class it handles
    reached: Callable[[Draft, S, str, str], Moves]  # (draft, stage, source, source's state)


def pending(d: Draft, name: str) -> bool:
    """Whether stage ``name`` has not started yet (a stage may be reached by several edges)."""
    return d.stages[name].status == "pending"


def complete(d: Draft, name: str, result: dict[str, Any]) -> None:
    """Resolve an instantaneous stage (decision, fork, join) with ``result``."""
    d.put(evolve(d.stages[name], status="completed", result=result, released=True))
