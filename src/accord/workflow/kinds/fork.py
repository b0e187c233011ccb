"""The fork kind: releases every branch at once; the branches meet again at one join.

A fork resolves inside the engine transition that reaches it. Its per-stage rules are here: at
least two branches, at most :data:`~accord.workflow.limits.MAX_FAN_OUT`, each a stage, none listed
twice. How branches, forks and joins fit together across the graph (one join per fork, nesting,
no branch escape) is the graph layer's topology check, :mod:`accord.workflow.check_graph`,
because it relates stages of several kinds.

Codes: ``schema-fan-out``; ``graph-unknown-target``, ``graph-duplicate-reference``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from accord.contracts.yamlsource import Node
from accord.workflow import limits
from accord.workflow.kinds.base import (
    Arrow,
    Edge,
    Placement,
    References,
    Resolved,
    StageDef,
    StageKind,
    costs_nothing,
    plain_label,
    reads_nothing,
    runs_nothing,
)
from accord.workflow.schema_fields import SchemaReader

__all__ = ["KIND", "ForkDef", "ForkStage"]


@dataclass(frozen=True, slots=True)
class ForkDef(StageDef):
    branches: tuple[str, ...] = ()
    type: Literal["fork"] = "fork"


@dataclass(frozen=True, slots=True)
class ForkStage:
    name: str
    branches: tuple[str, ...]
    join: str  # the join every branch reaches
    type: Literal["fork"] = "fork"
    fork: str | None = None
    branch: str | None = None
    line: int = field(default=0, compare=False)


FIELDS = {"fork": frozenset({"name", "type", "branches"})}


def read(r: SchemaReader, node: Node, name: str, kind: str) -> ForkDef:
    branches = r.names(node, "branches", name)
    if len(branches) > limits.MAX_FAN_OUT:
        r.error_at(
            "schema-fan-out",
            f"{len(branches)} fork branches (limit {limits.MAX_FAN_OUT})",
            node,
            "branches",
            name,
        )
    if len(branches) < 2:
        r.error_at("schema-fan-out", "a fork needs at least two branches", node, "branches", name)
    return ForkDef(name, node, branches)


def edges(s: ForkDef) -> list[Edge]:
    return [Edge(s.name, b, "fork", "branches") for b in s.branches]


def references(s: ForkDef, refs: References) -> None:
    for entry in s.branches:
        refs.target(entry, "branches", stage_only=True)
    refs.duplicates(s.branches, "branches")


def plan(s: ForkDef, at: Placement, r: Resolved) -> ForkStage:
    if at.matching is None:
        raise ValueError(f"fork {s.name!r} has no join")  # the graph layer refuses that
    # a nested fork sits on a branch of the enclosing fork (``None`` for a top-level fork)
    return ForkStage(s.name, s.branches, at.matching, fork=at.fork, branch=at.branch, line=at.line)


def to_json(stage: ForkStage) -> dict[str, Any]:
    return {
        "branches": list(stage.branches),
        "join": stage.join,
        "fork": stage.fork,
        "branch": stage.branch,
    }


def from_json(doc: Mapping[str, Any], line: int) -> ForkStage:
    return ForkStage(
        name=doc["name"],
        branches=tuple(doc["branches"]),
        join=doc["join"],
        fork=doc.get("fork"),
        branch=doc.get("branch"),
        line=line,
    )


def arrows(stage: ForkStage) -> list[Arrow]:
    return [(b, "fork", "fork") for b in stage.branches]


KIND: StageKind[ForkDef, ForkStage] = StageKind(
    name="fork",
    definition=ForkDef,
    stage=ForkStage,
    fields=FIELDS,
    read=read,
    edges=edges,
    references=references,
    has_result=False,
    resolve=runs_nothing,
    check_reads=reads_nothing,
    cost_ms=costs_nothing,
    plan=plan,
    to_json=to_json,
    from_json=from_json,
    shape="hexagon",
    style="forkjoin",
    label=plain_label,
    arrows=arrows,
)
