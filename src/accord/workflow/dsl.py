"""The workflow DSL as written: positioned source nodes and the typed definition built from them.

Parsing is two steps so every later finding can name ``file:line:column``:

1. :func:`parse_text` composes the YAML (ruamel.yaml, YAML 1.2, via
   :func:`accord.contracts.yamlsource.compose`) into a tree of positioned nodes; syntax errors,
   duplicate keys and extra documents become ``yaml-*`` diagnostics. :func:`parse_data` builds the
   same tree from already-parsed data (generated definitions), with line 0 positions.
2. The schema layer (:mod:`accord.workflow.check_schema`) turns the tree into the typed
   :class:`Definition` below, checking shapes and bounds on the way.

Definitions keep the node they came from; :meth:`StageDef.at` finds the location of one field so
the graph, contract, budget and admission layers point at the exact line they object to. Each
stage's class belongs to its kind (:mod:`accord.workflow.kinds`) and is re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from accord.contracts.yamlsource import Node, compose, location_of
from accord.errors import Diagnostic, Location
from accord.workflow.kinds import AnyStage, DecisionDef, ForkDef, JoinDef, TaskDef
from accord.workflow.kinds.base import StageDef
from accord.workflow.kinds.task import ActionPolicy
from accord.workflow.plan import TerminalPolicy

__all__ = [
    "DecisionDef",
    "Definition",
    "ForkDef",
    "JoinDef",
    "Node",
    "StageDef",
    "TaskDef",
    "parse_data",
    "parse_text",
]


def parse_text(text: str, filename: str) -> tuple[Node | None, list[Diagnostic]]:
    """Compose one YAML document into positioned nodes (``None`` when unusable)."""
    return compose(text, filename)


def parse_data(data: Any, filename: str = "<data>") -> Node:
    """The node tree of already-parsed data; every location is ``filename`` line 0."""
    return _node(data, Location(filename))


def _node(data: Any, where: Location) -> Node:
    kind = type(data)  # exact types first: ABC checks dominate on large definitions
    if kind is dict or (kind is not list and isinstance(data, Mapping)):
        entries = tuple((str(k), _node(v, where), where) for k, v in data.items())
        return Node("map", where, entries=entries)
    if kind is list or kind is tuple:
        return Node("seq", where, items=tuple(_node(v, where) for v in data))
    return Node("scalar", where, data)


@dataclass(frozen=True, slots=True)
class Definition:
    """A workflow definition that passed the schema layer (shapes and bounds hold)."""

    name: str
    version: str
    entry: str
    stages: tuple[AnyStage, ...]
    terminals: tuple[str, ...]
    node: Node = field(compare=False, repr=False)
    terminal_policy: TerminalPolicy = field(default_factory=TerminalPolicy)
    finalisers: tuple[str, ...] = ()
    finaliser_policies: tuple[ActionPolicy | None, ...] = ()  # one per finaliser
    evidence: tuple[str, ...] = ()  # result fields a completed run must carry
    deadline_ms: int | None = None
    context: str | None = None
    owner: str | None = None
    status: Literal["planned", "active"] = "active"
    review_date: str | None = None
    promotion_criteria: str | None = None

    def at(self, key: str | None = None) -> Location:
        return location_of(self.node, key)

    def diag(self, code: str, message: str, key: str | None = None, **kw: Any) -> Diagnostic:
        return Diagnostic(code, message, self.at(key), path=key or "", **kw)
