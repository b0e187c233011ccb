"""The decision kind: guarded branches evaluated with CEL, first match wins, and a ``"true"``
fallback that must come last; ``on_evaluation_error`` is taken when an expression fails.

Expressions are compiled when read (syntax, result type, size and cost). The type layer then lets
a branch read only fields that exist (context contract, result contracts), only stages guaranteed
to have completed (``result``) or run (``state``) on every path to the decision, and an optional
field only under a ``has()`` test of that field.

Codes: ``schema-fan-out`` and the ``expression-*`` codes; ``graph-decision-fallback-missing``,
``graph-decision-fallback-not-last``; ``type-expression-unknown-stage``,
``type-expression-unknown-field``, ``type-expression-not-completed``,
``type-expression-unguarded-optional``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from accord.contracts.model import FieldSpec
from accord.contracts.yamlsource import Node, location_of
from accord.errors import Diagnostic
from accord.workflow import limits
from accord.workflow.cel_refs import Reference
from accord.workflow.check_inputs import may_be_missing, walk
from accord.workflow.expressions import ExpressionError, compile_expression
from accord.workflow.kinds.base import (
    Arrow,
    Edge,
    Placement,
    References,
    Resolved,
    StageDef,
    StageKind,
    TypeContext,
    costs_nothing,
    plain_label,
    runs_nothing,
)
from accord.workflow.schema_fields import SchemaReader

__all__ = ["KIND", "BranchDef", "DecisionBranch", "DecisionDef", "DecisionStage"]


@dataclass(frozen=True, slots=True)
class BranchDef:
    when: str
    next: str
    node: Node = field(compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class DecisionDef(StageDef):
    branches: tuple[BranchDef, ...] = ()
    on_evaluation_error: str = ""
    type: Literal["decision"] = "decision"


@dataclass(frozen=True, slots=True)
class DecisionBranch:
    when: str  # CEL source
    next: str
    references: tuple[str, ...] = ()  # stage names whose results the expression reads
    checked: str = ""  # the checked form (type-checked AST, serialised), for review tooling


@dataclass(frozen=True, slots=True)
class DecisionStage:
    name: str
    branches: tuple[DecisionBranch, ...]  # the last one is the ``"true"`` fallback
    on_evaluation_error: str
    type: Literal["decision"] = "decision"
    fork: str | None = None
    branch: str | None = None
    line: int = field(default=0, compare=False)


# --- schema ---------------------------------------------------------------------------------

FIELDS = {"decision": frozenset({"name", "type", "branches", "on_evaluation_error"})}


def read(r: SchemaReader, node: Node, name: str, kind: str) -> DecisionDef:
    branches = []
    seq = r.child(node, "branches", name, kind="seq")
    items = seq.items if seq is not None else ()
    if len(items) > limits.MAX_DECISION_BRANCHES:
        r.error_at(
            "schema-fan-out",
            f"{len(items)} decision branches (limit {limits.MAX_DECISION_BRANCHES})",
            node,
            "branches",
            name,
        )
    for item in items:
        if item.kind != "map":
            r.error_at("schema-type", "a decision branch is {when, next}", item, None, name)
            continue
        r.closed(item, {"when", "next"}, name)
        when, nxt = r.text(item, "when", name), r.text(item, "next", name)
        try:
            compile_expression(when)
        except ExpressionError as exc:
            r.error_at(exc.code, exc.message, item, "when", name)
        branches.append(BranchDef(when, nxt, item))
    return DecisionDef(name, node, tuple(branches), r.text(node, "on_evaluation_error", name))


# --- graph ----------------------------------------------------------------------------------


def edges(s: DecisionDef) -> list[Edge]:
    out = [Edge(s.name, b.next, "branch", "branches") for b in s.branches]
    return [*out, Edge(s.name, s.on_evaluation_error, "evaluation-error", "on_evaluation_error")]


def references(s: DecisionDef, refs: References) -> None:
    for i, b in enumerate(s.branches):
        refs.target(b.next, "branches", where=location_of(b.node, "next"))
        if b.when.strip() == "true" and i != len(s.branches) - 1:
            message = f'branch {i + 1} is the "true" fallback but is not last'
            refs.report(
                "graph-decision-fallback-not-last", message, "branches", location_of(b.node, "when")
            )
    if not s.branches or s.branches[-1].when.strip() != "true":
        last = location_of(s.branches[-1].node, "when") if s.branches else None
        message = 'the last branch must be the "true" fallback'
        refs.report("graph-decision-fallback-missing", message, "branches", last)
    refs.target(s.on_evaluation_error, "on_evaluation_error")


# --- types ----------------------------------------------------------------------------------


def check_reads(ctx: TypeContext, s: DecisionDef) -> None:
    """Type every field each branch's expression reads."""
    for branch in s.branches:
        compiled = compile_expression(branch.when)
        guards = {(r.stage, r.path) for r in compiled.references if r.kind == "has"}
        for ref in compiled.references:
            problem = _reference(ctx, s, ref, guards)
            if problem:
                code, message = problem
                where = location_of(branch.node, "when")
                text = f"`{branch.when}`: {message}"
                ctx.diags.append(Diagnostic(code, text, where, "branches.when", s.name))


def _reference(
    ctx: TypeContext,
    s: DecisionDef,
    ref: Reference,
    guards: set[tuple[str | None, tuple[str, ...]]],
) -> tuple[str, str] | None:
    fields: Mapping[str, FieldSpec] | None
    if ref.stage is None:
        fields = ctx.context.payload if ctx.context else None
    else:
        if not ctx.has_result(ref.stage):
            return "type-expression-unknown-stage", f"no task stage {ref.stage!r}"
        if not ctx.guaranteed(s.name, ref.stage, ref.part):
            verb = "completed" if ref.part == "result" else "run"
            return (
                "type-expression-not-completed",
                f"stage {ref.stage!r} has not {verb} on every path to this decision",
            )
        fields = ctx.result_fields(ref.stage) if ref.part == "result" else None
    specs, problem = walk(fields, ref.path)
    if problem:
        return "type-expression-unknown-field", problem
    checked = specs if ref.kind == "read" else specs[:-1]
    for i, spec in enumerate(checked):
        if may_be_missing(spec) and (ref.stage, ref.path[: i + 1]) not in guards:
            field_path = ".".join(ref.path[: i + 1])
            return (
                "type-expression-unguarded-optional",
                f"{field_path!r} is optional; read it under has(…{field_path})",
            )
    return None


# --- plan -----------------------------------------------------------------------------------


def plan(s: DecisionDef, at: Placement, r: Resolved) -> DecisionStage:
    branches = []
    for b in s.branches:
        compiled = compile_expression(b.when)
        branches.append(DecisionBranch(b.when, b.next, compiled.stages, compiled.summary))
    return DecisionStage(
        s.name,
        tuple(branches),
        s.on_evaluation_error,
        fork=at.fork,
        branch=at.branch,
        line=at.line,
    )


def to_json(stage: DecisionStage) -> dict[str, Any]:
    return {
        "branches": [
            {"when": b.when, "next": b.next, "references": list(b.references), "checked": b.checked}
            for b in stage.branches
        ],
        "on_evaluation_error": stage.on_evaluation_error,
        "fork": stage.fork,
        "branch": stage.branch,
    }


def from_json(doc: Mapping[str, Any], line: int) -> DecisionStage:
    return DecisionStage(
        name=doc["name"],
        branches=tuple(
            DecisionBranch(
                when=b["when"],
                next=b["next"],
                references=tuple(b.get("references", ())),
                checked=b.get("checked", ""),
            )
            for b in doc["branches"]
        ),
        on_evaluation_error=doc["on_evaluation_error"],
        fork=doc.get("fork"),
        branch=doc.get("branch"),
        line=line,
    )


# --- rendering ------------------------------------------------------------------------------


def arrows(stage: DecisionStage) -> list[Arrow]:
    out: list[Arrow] = [(b.next, "decision", b.when) for b in stage.branches]
    return [*out, (stage.on_evaluation_error, "failure", "evaluation error")]


KIND: StageKind[DecisionDef, DecisionStage] = StageKind(
    name="decision",
    definition=DecisionDef,
    stage=DecisionStage,
    fields=FIELDS,
    read=read,
    edges=edges,
    references=references,
    has_result=False,
    resolve=runs_nothing,
    check_reads=check_reads,
    cost_ms=costs_nothing,
    plan=plan,
    to_json=to_json,
    from_json=from_json,
    shape="diamond",
    style="decision",
    label=plain_label,
    arrows=arrows,
)
