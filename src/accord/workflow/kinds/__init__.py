"""Stage kinds, one module each, and the one table that registers them.

A stage kind owns everything the compiler knows about it: its DSL shape and schema checks, its
graph edges and reference checks, its type checks and budget, its frozen plan class with that
class's canonical JSON, and how it is drawn (:class:`~accord.workflow.kinds.base.StageKind`
lists the hooks). The check layers, the plan and the renderer reach a kind only through
:data:`KINDS` and :func:`kind_of`, so none of them branches on stage classes. The engine keeps
the run-time half of each kind in :mod:`accord.engine.machine.kinds`, under the same names.

============  ======================  =========================================================
kind          DSL ``type`` values     module
============  ======================  =========================================================
``task``      ``worker``, ``action``  :mod:`.task` — runs a pinned capability, retries
``decision``  ``decision``            :mod:`.decision` — CEL branches, ``"true"`` fallback last
``fork``      ``fork``                :mod:`.fork` — releases every branch at once
``join``      ``join``                :mod:`.join` — waits for its fork's branches
``approval``  ``approval``            :mod:`.approval` — waits for people to approve or reject
============  ======================  =========================================================

**Adding a kind** (say ``approval``): write ``kinds/approval.py`` (its ``Def`` and ``Stage``
classes and ``KIND = StageKind(...)``), add its name to :data:`KindName`, its classes to
:data:`AnyStage` and :data:`Stage`, and one case to :func:`_registered` and to :func:`kind_of`;
then write ``accord/engine/machine/kinds/approval.py`` and register it there. mypy points at
every ``match`` left without a case, and ``tests/unit/workflow/test_stage_kinds.py`` fails until
both tables, both unions and every hook agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal, TypeAlias, assert_never, get_args

from accord.workflow.kinds import approval, decision, fork, join, task
from accord.workflow.kinds.approval import ApprovalDef, ApprovalStage, Approvers
from accord.workflow.kinds.base import StageKind
from accord.workflow.kinds.decision import BranchDef, DecisionBranch, DecisionDef, DecisionStage
from accord.workflow.kinds.fork import ForkDef, ForkStage
from accord.workflow.kinds.join import JoinDef, JoinStage
from accord.workflow.kinds.task import TaskDef, TaskStage

__all__ = [
    "KINDS",
    "TYPES",
    "AnyStage",
    "ApprovalDef",
    "ApprovalStage",
    "Approvers",
    "BranchDef",
    "DecisionBranch",
    "DecisionDef",
    "DecisionStage",
    "ForkDef",
    "ForkStage",
    "JoinDef",
    "JoinStage",
    "KindName",
    "Stage",
    "StageKind",
    "TaskDef",
    "TaskStage",
    "kind_for_type",
    "kind_of",
]

KindName: TypeAlias = Literal["task", "decision", "fork", "join", "approval"]

AnyStage: TypeAlias = TaskDef | DecisionDef | ForkDef | JoinDef | ApprovalDef  # as written
Stage: TypeAlias = (  # a stage as planned
    TaskStage | DecisionStage | ForkStage | JoinStage | ApprovalStage
)


def _registered(name: KindName) -> StageKind[Any, Any]:
    match name:
        case "task":
            return task.KIND
        case "decision":
            return decision.KIND
        case "fork":
            return fork.KIND
        case "join":
            return join.KIND
        case "approval":
            return approval.KIND
        case _:
            assert_never(name)


KINDS: Mapping[KindName, StageKind[Any, Any]] = MappingProxyType(
    {name: _registered(name) for name in get_args(KindName)}
)
_BY_TYPE: Mapping[str, StageKind[Any, Any]] = MappingProxyType(
    {t: kind for kind in KINDS.values() for t in kind.types}
)
TYPES: tuple[str, ...] = tuple(_BY_TYPE)  # every DSL ``type`` value, in registry order


def kind_for_type(type_: str) -> StageKind[Any, Any] | None:
    """The kind a DSL or plan ``type`` value belongs to (``None`` when no kind claims it)."""
    return _BY_TYPE.get(type_)


def kind_of(stage: AnyStage | Stage) -> StageKind[Any, Any]:
    """The kind of a stage, as written or as planned."""
    match stage:
        case TaskDef() | TaskStage():
            return task.KIND
        case DecisionDef() | DecisionStage():
            return decision.KIND
        case ForkDef() | ForkStage():
            return fork.KIND
        case JoinDef() | JoinStage():
            return join.KIND
        case ApprovalDef() | ApprovalStage():
            return approval.KIND
        case _:
            assert_never(stage)
