"""The join kind: waits for every branch of its fork and leaves along ``on_success`` when all
arrived in an acceptable state (``acceptable_terminal_states``, ``completed`` by default), else
along ``on_failure``.

A join's ``required`` must be exactly its fork's branch entries; that, and that some fork feeds
the join at all, is checked by the graph layer's fork/join topology check
(:mod:`accord.workflow.check_graph`).

Codes: ``schema-enum``; ``graph-unknown-target``, ``graph-undeclared-terminal``,
``graph-duplicate-reference``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from accord.contracts.yamlsource import Node
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

__all__ = ["BRANCH_STATES", "KIND", "JoinDef", "JoinStage"]

BRANCH_STATES = ("completed", "failed", "cancelled")


@dataclass(frozen=True, slots=True)
class JoinDef(StageDef):
    required: tuple[str, ...] = ()
    acceptable_terminal_states: tuple[str, ...] = ("completed",)
    on_success: str = ""
    on_failure: str = ""
    type: Literal["join"] = "join"


@dataclass(frozen=True, slots=True)
class JoinStage:
    name: str
    fork: str | None  # the fork that feeds this join (``fork`` here is the *matching* fork)
    required: tuple[str, ...]  # exactly the fork's branch entry names
    acceptable_terminal_states: tuple[str, ...]
    on_success: str
    on_failure: str
    type: Literal["join"] = "join"
    branch: str | None = None
    line: int = field(default=0, compare=False)


FIELDS = {
    "join": frozenset(
        {"name", "type", "required", "acceptable_terminal_states", "on_success", "on_failure"}
    )
}


def read(r: SchemaReader, node: Node, name: str, kind: str) -> JoinDef:
    states = r.names(node, "acceptable_terminal_states", name, required=False) or ("completed",)
    for s in states:
        if s not in BRANCH_STATES:
            r.error_at(
                "schema-enum",
                f"branch state {s!r} is not one of {BRANCH_STATES}",
                node,
                "acceptable_terminal_states",
                name,
            )
    return JoinDef(
        name,
        node,
        r.names(node, "required", name),
        states,
        r.text(node, "on_success", name),
        r.text(node, "on_failure", name),
    )


def edges(s: JoinDef) -> list[Edge]:
    return [
        Edge(s.name, s.on_success, "success", "on_success"),
        Edge(s.name, s.on_failure, "failure", "on_failure"),
    ]


def references(s: JoinDef, refs: References) -> None:
    refs.target(s.on_success, "on_success")
    refs.target(s.on_failure, "on_failure")
    for r in s.required:
        refs.target(r, "required", stage_only=True)
    refs.duplicates(s.required, "required")


def plan(s: JoinDef, at: Placement, r: Resolved) -> JoinStage:
    return JoinStage(
        name=s.name,
        fork=at.matching,
        required=s.required,
        acceptable_terminal_states=s.acceptable_terminal_states,
        on_success=s.on_success,
        on_failure=s.on_failure,
        branch=at.branch,  # the enclosing branch of a nested fork's join
        line=at.line,
    )


def to_json(stage: JoinStage) -> dict[str, Any]:
    return {
        "fork": stage.fork,
        "required": list(stage.required),
        "acceptable_terminal_states": list(stage.acceptable_terminal_states),
        "on_success": stage.on_success,
        "on_failure": stage.on_failure,
        "branch": stage.branch,
    }


def from_json(doc: Mapping[str, Any], line: int) -> JoinStage:
    return JoinStage(
        name=doc["name"],
        fork=doc.get("fork"),
        required=tuple(doc["required"]),
        acceptable_terminal_states=tuple(doc["acceptable_terminal_states"]),
        on_success=doc["on_success"],
        on_failure=doc["on_failure"],
        branch=doc.get("branch"),
        line=line,
    )


def arrows(stage: JoinStage) -> list[Arrow]:
    return [(stage.on_success, "success", ""), (stage.on_failure, "failure", "failure")]


KIND: StageKind[JoinDef, JoinStage] = StageKind(
    name="join",
    definition=JoinDef,
    stage=JoinStage,
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
