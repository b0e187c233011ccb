"""Every stage kind appears everywhere a stage kind must appear, and both registries agree.

A stage kind is one module on each side of the compiler/engine line, registered once per side:
``accord.workflow.kinds`` (DSL shape, checks, plan form, rendering) and
``accord.engine.machine.kinds`` (what reaching a stage of the kind does). mypy refuses a
``match`` over kind names or stage classes that misses a kind; these tests refuse everything
else a new kind could forget. :data:`PLACES` lists the places; each is checked for every
registered kind, on a compiled sample workflow that holds a stage of that kind (:data:`SAMPLES`:
a new kind adds its sample there, with the results that drive a run through it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import pytest

from accord.contracts.catalog import Catalog
from accord.engine.machine.kinds import HANDLERS, handler_of
from accord.errors import EngineError, Location
from accord.workflow.check_graph import check_graph
from accord.workflow.check_schema import check_schema
from accord.workflow.compiler import compile_workflow
from accord.workflow.dsl import Definition, parse_text
from accord.workflow.graph import Graph
from accord.workflow.kinds import (
    KINDS,
    TYPES,
    AnyStage,
    KindName,
    Stage,
    StageKind,
    kind_for_type,
    kind_of,
)
from accord.workflow.plan import Plan
from accord.workflow.render import to_dot, to_mermaid
from accord.workflow.schema_fields import SchemaReader
from tests.unit.engine.sim import Sim

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "workflows"
MODEL_INGEST = GOLDEN / "model-ingest.yaml"
GATED = GOLDEN / "model-ingest-gated.yaml"

# kind → (a workflow holding a stage of that kind, stage results that drive a run to its end)
SAMPLES: Mapping[str, tuple[Path, dict[str, dict[str, Any]]]] = {
    "task": (MODEL_INGEST, {"cache-lookup": {"hit": False}}),
    "decision": (MODEL_INGEST, {"cache-lookup": {"hit": False}}),
    "fork": (MODEL_INGEST, {"cache-lookup": {"hit": False}}),
    "join": (MODEL_INGEST, {"cache-lookup": {"hit": False}}),
    "approval": (GATED, {"cache-lookup": {"hit": False}}),
}


@dataclass(frozen=True)
class Sample:
    """One kind's sample: its definition and plan stage, in their compiled workflow."""

    name: KindName
    kind: StageKind[Any, Any]
    definition: Definition
    graph: Graph
    plan: Plan
    written: AnyStage
    planned: Stage
    results: dict[str, dict[str, Any]]


@pytest.fixture(scope="module", params=sorted(KINDS))
def sample(request: pytest.FixtureRequest, catalog: Catalog) -> Sample:
    name: KindName = request.param
    kind = KINDS[name]
    assert name in SAMPLES, f"kind {name!r} has no sample workflow in SAMPLES"
    path, results = SAMPLES[name]
    text = path.read_text(encoding="utf-8")
    root, _ = parse_text(text, path.name)
    assert root is not None
    definition, _ = check_schema(root)
    assert definition is not None
    graph, _ = check_graph(definition)
    assert graph is not None
    plan = compile_workflow(text, path.name, catalog).unwrap()
    written = next(s for s in definition.stages if isinstance(s, kind.definition))
    planned = plan.stage(written.name)
    return Sample(name, kind, definition, graph, plan, written, planned, results)


# --- the registries -----------------------------------------------------------------------


def test_the_compile_and_machine_tables_have_exactly_the_same_kinds() -> None:
    names = set(get_args(KindName))
    assert set(KINDS) == names
    assert set(HANDLERS) == names
    for name in names:
        assert KINDS[name].name == name
        assert HANDLERS[name].name == name
        assert HANDLERS[name].stage is KINDS[name].stage, name


def test_the_stage_unions_are_exactly_the_registered_classes() -> None:
    assert set(get_args(AnyStage)) == {k.definition for k in KINDS.values()}
    assert set(get_args(Stage)) == {k.stage for k in KINDS.values()}


def test_every_dsl_type_belongs_to_exactly_one_kind() -> None:
    types = [t for k in KINDS.values() for t in k.types]
    assert len(types) == len(set(types)) == len(TYPES)
    for kind in KINDS.values():
        assert kind.types, kind.name
        for t in kind.types:
            assert kind_for_type(t) is kind
    assert kind_for_type("signal-of-nothing") is None


@pytest.mark.parametrize("name", sorted(KINDS))
def test_each_kind_provides_every_hook(name: KindName) -> None:
    kind = KINDS[name]
    for f in dataclasses.fields(kind):
        value = getattr(kind, f.name)
        assert value is not None or f.name == "style", f"{name} has no {f.name}"
        if "Callable" in str(f.type):
            assert callable(value), f"{name}.{f.name} is not callable"
    assert callable(HANDLERS[name].reached)


# --- every place a kind must appear ---------------------------------------------------------


class _Recorder:
    """A :class:`~accord.workflow.kinds.base.References` that records what a kind checks."""

    def __init__(self) -> None:
        self.checked: set[str] = set()
        self.findings: list[str] = []

    def target(
        self, name: str, key: str, *, stage_only: bool = False, where: Location | None = None
    ) -> None:
        self.checked.add(name)

    def report(self, code: str, message: str, key: str, where: Location | None = None) -> None:
        self.findings.append(code)

    def duplicates(self, names: tuple[str, ...], key: str) -> None:
        if len(set(names)) != len(names):
            self.findings.append("duplicate")


def _dsl(s: Sample) -> None:
    t = s.written.type
    assert t in s.kind.types
    assert {"name", "type"} <= s.kind.fields[t]
    assert {key for key, _, _ in s.written.node.entries} <= s.kind.fields[t]
    reader = SchemaReader()
    assert s.kind.read(reader, s.written.node, s.written.name, t) == s.written
    assert not reader.diagnostics


def _graph(s: Sample) -> None:
    edges = s.kind.edges(s.written)
    assert edges and all(e.source == s.written.name for e in edges)
    assert s.graph.out[s.written.name] == edges
    refs = _Recorder()
    s.kind.references(s.written, refs)
    assert {e.target for e in edges} <= refs.checked  # every edge is a checked reference
    assert not refs.findings


def _types_and_budget(s: Sample) -> None:
    assert isinstance(s.kind.has_result, bool)
    assert callable(s.kind.resolve) and callable(s.kind.check_reads)
    assert s.kind.cost_ms(s.written) >= 0


def _plan_form(s: Sample) -> None:
    assert isinstance(s.planned, s.kind.stage)
    assert kind_of(s.planned) is s.kind and kind_of(s.written) is s.kind
    assert s.planned.type == s.written.type and s.planned.line == s.written.node.location.line


def _serialisation(s: Sample) -> None:
    doc = {"name": s.planned.name, "type": s.planned.type, **s.kind.to_json(s.planned)}
    assert s.kind.from_json(doc, s.planned.line) == s.planned
    again = Plan.from_json(s.plan.to_json())
    assert again.stage(s.planned.name) == s.planned
    assert again.canonical_bytes() == s.plan.canonical_bytes()


def _rendering(s: Sample) -> None:
    label = s.kind.label(s.planned)
    assert s.planned.name in label
    drawn = s.kind.arrows(s.planned)
    assert {target for target, _, _ in drawn} <= {e.target for e in s.kind.edges(s.written)}
    assert s.kind.shape in ("box", "diamond", "hexagon")
    assert label.replace('"', "#quot;") in to_mermaid(s.plan)
    assert label.replace("<br/>", "\\n") in to_dot(s.plan)


def _machine(s: Sample) -> None:
    assert handler_of(s.planned) is HANDLERS[s.name]
    sim = Sim(s.plan)
    sim.start(modelId="m-1")
    run = sim.drain(s.results)
    assert run.status == "completed", run.error
    for stage in s.plan.stages:
        if kind_of(stage) is s.kind:
            assert run.stages[stage.name].status != "pending", f"{stage.name} was never handled"


PLACES: Mapping[str, Callable[[Sample], None]] = {
    "DSL shape and schema read (kinds.<kind>.read, fields)": _dsl,
    "graph edges and reference checks (edges, references)": _graph,
    "type checks and budget (has_result, resolve, check_reads, cost_ms)": _types_and_budget,
    "plan form (plan, the frozen plan class)": _plan_form,
    "canonical JSON round trip (to_json, from_json)": _serialisation,
    "rendering (shape, style, label, arrows)": _rendering,
    "machine handling (engine.machine.kinds.<kind>.reached)": _machine,
}


@pytest.mark.parametrize("place", list(PLACES))
def test_each_kind_appears_in(place: str, sample: Sample) -> None:
    PLACES[place](sample)


# --- unknown kinds are refused, never ignored ---------------------------------------------


@dataclass(frozen=True)
class _Unheard:
    name: str = "gate"
    type: str = "signal"


def test_the_machine_refuses_a_stage_of_a_kind_it_has_no_handler_for() -> None:
    with pytest.raises(EngineError, match=r"stage 'gate' is of kind 'signal'"):
        handler_of(_Unheard())


def test_a_plan_with_an_unknown_stage_type_does_not_load(catalog: Catalog) -> None:
    text = MODEL_INGEST.read_text(encoding="utf-8")
    doc = compile_workflow(text, "x.yaml", catalog).unwrap().to_json()
    doc["stages"][0]["type"] = "signal"
    del doc["digest"]
    with pytest.raises(ValueError, match="unknown stage type 'signal'"):
        Plan.from_json(doc)
