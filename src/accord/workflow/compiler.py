"""The workflow compiler: definition text → checked, canonical, digest-pinned :class:`Plan`.

Five check layers run in order, each its own module with its own codes (docs/architecture.md §3):

1. :mod:`.check_schema` — shapes, required and allowed fields, bounds, binding syntax, CEL
   compilation (size, cost, result type);
2. :mod:`.check_graph` — every edge namespace, cycles, reachability, forks and joins;
3. :mod:`.check_types` — capabilities, contracts, input and binding types, expression fields,
   completion guarantees;
4. :mod:`.check_budget` — the longest path against ``deadline_ms``;
5. :mod:`.admission` — planned definitions and capabilities fail closed.

Layers 1 and 2 gate the rest (a malformed graph has no meaningful types); 3–5 all run so an
author sees every contract, budget and admission finding at once. Any error means no plan.
The plan makes every default explicit and pins each capability to its request/result contract
versions and artefact digests; its digest covers none of the YAML's cosmetics (comments, key
order, quoting, flow or block style) because it is computed from the resolved plan, never from
the text. Pure: the caller reads files and supplies the catalog.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from accord.errors import Diagnostic, PlanError
from accord.workflow.admission import check_planned
from accord.workflow.catalog import ContractCatalogLike
from accord.workflow.check_budget import check_budget
from accord.workflow.check_graph import check_graph
from accord.workflow.check_schema import check_schema
from accord.workflow.check_types import Resolved, check_types
from accord.workflow.dsl import Definition, Node, parse_data, parse_text
from accord.workflow.graph import Graph
from accord.workflow.kinds import AnyStage, Stage, kind_of
from accord.workflow.kinds.base import Placement
from accord.workflow.plan import TERMINALS, Plan
from accord.workflow.triggers import Budgets, Trigger, check_intake

__all__ = ["CompileResult", "ContractCatalogLike", "compile_definition", "compile_workflow"]


@dataclass(frozen=True, slots=True)
class CompileResult:
    plan: Plan | None
    diagnostics: tuple[Diagnostic, ...]

    @property
    def ok(self) -> bool:
        return self.plan is not None

    @property
    def errors(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in self.diagnostics if d.severity == "error")

    @property
    def warnings(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in self.diagnostics if d.severity != "error")

    def unwrap(self) -> Plan:
        """The plan, or :class:`~accord.errors.PlanError` carrying every error."""
        if self.plan is None:
            raise PlanError(self.errors, f"workflow refused: {len(self.errors)} error(s)")
        return self.plan


def compile_workflow(
    source_text: str, filename: str, catalog: ContractCatalogLike
) -> CompileResult:
    """Compile YAML text; findings name ``filename:line:column`` and the stage."""
    root, diags = parse_text(source_text, filename)
    if root is None or any(d.severity == "error" for d in diags):
        return CompileResult(None, tuple(diags))
    return _compile(root, filename, catalog, diags)


def compile_definition(
    data: Mapping[str, Any], catalog: ContractCatalogLike, filename: str = "<data>"
) -> CompileResult:
    """Compile an already-parsed definition (findings carry no line numbers)."""
    return _compile(parse_data(data, filename), filename, catalog, [])


def _compile(
    root: Node, filename: str, catalog: ContractCatalogLike, diags: list[Diagnostic]
) -> CompileResult:
    intake = check_intake(root, catalog, filename)  # triggers and budgets (docs/triggers.md)
    definition, found = check_schema(_without(root, ("triggers", "budgets")))
    diags += found
    if definition is None:
        return CompileResult(None, tuple(diags))
    graph, found = check_graph(definition)
    diags += found
    if graph is None:
        return CompileResult(None, tuple(diags))
    resolved, found = check_types(definition, graph, catalog)
    diags += found
    diags += check_budget(definition, graph)
    diags += check_planned(definition, resolved.capabilities)
    diags += intake[3]
    if any(d.severity == "error" for d in diags):
        return CompileResult(None, tuple(diags))
    resolved.contracts.update(intake[2])
    plan = _plan(definition, graph, resolved, filename, triggers=intake[0], budgets=intake[1])
    return CompileResult(plan, tuple(diags))


def _without(root: Node, keys: tuple[str, ...]) -> Node:
    """``root`` without the top-level ``keys`` the intake layer reads itself."""
    if root.kind != "map":
        return root
    return replace(root, entries=tuple(e for e in root.entries if e[0] not in keys))


def _stage(s: AnyStage, g: Graph, r: Resolved) -> Stage:
    fork, branch = g.member.get(s.name, (None, None))
    matching = g.fork_join.get(s.name) or g.join_fork.get(s.name)
    at = Placement(s.node.location.line, fork, branch, matching)
    stage: Stage = kind_of(s).plan(s, at, r)
    return stage


def _plan(
    d: Definition,
    g: Graph,
    r: Resolved,
    filename: str,
    *,
    triggers: tuple[Trigger, ...] = (),
    budgets: Budgets | None = None,
) -> Plan:
    return Plan.create(
        name=d.name,
        version=d.version,
        entry=d.entry,
        stages=tuple(_stage(s, g, r) for s in d.stages),
        terminals=tuple(t for t in TERMINALS if t in d.terminals),
        terminal_policy=d.terminal_policy,
        finalisers=tuple(r.finalisers),
        finaliser_policies=d.finaliser_policies if any(d.finaliser_policies) else (),
        evidence=d.evidence,
        deadline_ms=d.deadline_ms,
        context_contract=d.context,
        owner=d.owner,
        status=d.status,
        contracts=dict(sorted(r.contracts.items())),
        source=filename,
        review_date=d.review_date,
        promotion_criteria=d.promotion_criteria,
        triggers=triggers,
        budgets=budgets,
    )
