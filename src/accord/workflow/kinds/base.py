"""What a stage kind is: the :class:`StageKind` record every kind module fills in, and the small
interfaces the check layers hand to a kind.

A kind module defines its DSL class (a :class:`StageDef`), its plan class (frozen, canonical) and
one function per hook, then ends with ``KIND = StageKind(...)``. Every field of the record is
required, so a kind that forgets a hook does not type-check; hooks that do nothing for a kind say
so with the helpers at the end of this module. The layers call hooks only through the registry
(:mod:`accord.workflow.kinds`), never by testing a stage's class.

Nothing here imports a check layer: the layers sit above the kinds, so they reach a kind through
the protocols below (:class:`References` for the graph layer, :class:`TypeContext` for the type
layer) and the plain records :class:`Placement` and :class:`Resolved`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeAlias, TypeVar

from accord.contracts.model import CapabilityContract, FieldSpec, MessageContract
from accord.contracts.yamlsource import Node, location_of
from accord.errors import Diagnostic, Location
from accord.workflow.catalog import ContractCatalogLike
from accord.workflow.schema_fields import SchemaReader
from accord.workflow.values import Binding, CapabilityPin, InputValue

__all__ = [
    "Arrow",
    "Edge",
    "Placement",
    "References",
    "Resolved",
    "Shape",
    "StageDef",
    "StageKind",
    "TypeContext",
    "costs_nothing",
    "plain_label",
    "reads_nothing",
    "runs_nothing",
]


@dataclass(frozen=True, slots=True)
class StageDef:
    """A stage as written, keeping its source node so findings point at the right line."""

    name: str
    node: Node = field(compare=False, repr=False)

    def at(self, key: str | None = None) -> Location:
        return location_of(self.node, key)

    def diag(self, code: str, message: str, key: str | None = None, **kw: Any) -> Diagnostic:
        return Diagnostic(code, message, self.at(key), path=key or "", stage=self.name, **kw)


@dataclass(frozen=True, slots=True)
class Edge:
    source: str
    target: str
    kind: str  # success | failure | evaluation-error | branch | fork
    key: str  # the DSL field the edge is written in, for locations


@dataclass(frozen=True, slots=True)
class Placement:
    """What the graph layer learned about one stage, for its plan form."""

    line: int
    fork: str | None = None  # the fork whose branch holds the stage
    branch: str | None = None  # that branch's entry stage
    matching: str | None = None  # a fork's join, or a join's fork


@dataclass(slots=True)
class Resolved:
    """What the type layer pinned, by stage name; the plan is built from it."""

    pins: dict[str, CapabilityPin] = field(default_factory=dict)  # stage → capability
    compensations: dict[str, CapabilityPin] = field(default_factory=dict)
    finalisers: list[CapabilityPin] = field(default_factory=list)
    inputs: dict[str, dict[str, InputValue]] = field(default_factory=dict)
    queues: dict[str, str | None] = field(default_factory=dict)
    capabilities: dict[str, CapabilityContract] = field(default_factory=dict)  # ref → contract
    contracts: dict[str, str] = field(default_factory=dict)  # ref → digest


class References(Protocol):
    """The graph layer, as a kind's reference check sees it (all findings name the stage)."""

    def target(
        self, name: str, key: str, *, stage_only: bool = False, where: Location | None = None
    ) -> None:
        """``name`` (written in ``key``) must be a stage, or a declared terminal unless
        ``stage_only``."""

    def report(self, code: str, message: str, key: str, where: Location | None = None) -> None:
        """A finding at ``key`` (or at ``where``)."""

    def duplicates(self, names: tuple[str, ...], key: str) -> None:
        """``names`` (written in ``key``) may not list one name twice."""


# Given a binding, the fields it reads from (or an error code + message).
BindingSource: TypeAlias = tuple[Mapping[str, FieldSpec] | None, str, str]


class TypeContext(Protocol):
    """The type layer, as a kind's type checks see it."""

    @property
    def out(self) -> Resolved: ...
    @property
    def diags(self) -> list[Diagnostic]: ...
    @property
    def catalog(self) -> ContractCatalogLike: ...
    @property
    def context(self) -> MessageContract | None: ...

    def pin(self, text: str, kind: str, where: StageDef | None, key: str) -> CapabilityPin | None:
        """Resolve capability ``text`` of ``kind`` (reporting what is wrong at ``key``)."""

    def source(self, b: Binding, at: str) -> BindingSource:
        """The fields binding ``b`` reads, as seen from stage ``at``."""

    def result_fields(self, stage: str) -> Mapping[str, FieldSpec] | None:
        """The result contract's fields of ``stage``, when pinned."""

    def has_result(self, stage: str) -> bool:
        """Whether ``stage`` exists and is of a kind that produces a result."""

    def guaranteed(self, at: str, stage: str, part: str) -> bool:
        """Whether ``stage`` has completed (``part == "result"``) or at least run (any other
        ``part``) on every path to ``at``."""


Shape: TypeAlias = Literal["box", "diamond", "hexagon"]
Arrow: TypeAlias = tuple[str, str, str]  # target, style (success|failure|decision|fork), label

D = TypeVar("D", bound=StageDef)
S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class StageKind(Generic[D, S]):
    """One stage kind: the DSL class ``D``, the plan class ``S`` and every hook over them.

    The hooks, in pipeline order:

    - schema (layer 1): ``fields`` maps each DSL ``type`` value of the kind to its closed set of
      fields; ``read`` turns a checked node into the definition, recording findings on the reader;
    - graph (layer 2): ``edges`` are the stage's outgoing edges (fork → join edges aside);
      ``references`` checks the names it refers to;
    - types (layer 3): ``has_result`` says whether bindings and expressions may read the stage's
      result; ``resolve`` pins what the stage runs (called in topological order, producers before
      consumers); ``check_reads`` types what it reads (called once every stage is resolved);
    - budget (layer 4): ``cost_ms`` is the stage's worst-case duration;
    - plan: ``plan`` builds the plan form; ``to_json``/``from_json`` are its canonical JSON
      (everything but ``name``, ``type`` and ``line``, which the plan writes for every stage);
    - rendering: ``shape``, ``style`` (a class of :mod:`accord.workflow.render`, or ``None``),
      ``label`` and ``arrows`` (the drawn edges).
    """

    name: str  # the registry key, shared with the engine's table
    definition: type[D]
    stage: type[S]
    fields: Mapping[str, frozenset[str]]
    read: Callable[[SchemaReader, Node, str, str], D]
    edges: Callable[[D], list[Edge]]
    references: Callable[[D, References], None]
    has_result: bool
    resolve: Callable[[TypeContext, D], None]
    check_reads: Callable[[TypeContext, D], None]
    cost_ms: Callable[[D], int]
    plan: Callable[[D, Placement, Resolved], S]
    to_json: Callable[[S], dict[str, Any]]
    from_json: Callable[[Mapping[str, Any], int], S]
    shape: Shape
    style: Literal["decision", "forkjoin"] | None
    label: Callable[[S], str]
    arrows: Callable[[S], list[Arrow]]

    @property
    def types(self) -> tuple[str, ...]:
        """The DSL (and plan) ``type`` values of this kind."""
        return tuple(self.fields)


# --- hooks that do nothing for a kind -------------------------------------------------------


def runs_nothing(ctx: TypeContext, stage: StageDef) -> None:
    """``resolve`` of a kind that runs no capability."""


def reads_nothing(ctx: TypeContext, stage: StageDef) -> None:
    """``check_reads`` of a kind that reads nothing."""


def costs_nothing(stage: StageDef) -> int:
    """``cost_ms`` of a kind that resolves inside one engine transition."""
    return 0


class _Named(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def type(self) -> str: ...


def plain_label(stage: _Named) -> str:
    """``label`` of a kind drawn with its name and type only."""
    return f"{stage.name}<br/>{stage.type}"
