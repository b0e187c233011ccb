"""Layer 1 — schema and admission bounds: positioned nodes → a typed :class:`Definition`.

Stage shapes are discriminated by ``type``; each type has a closed set of properties, so a typo
is an error rather than an ignored key. Bounds keep every plan small enough to check, store and
run predictably (:mod:`accord.workflow.limits`). Bindings are parsed here (syntax only; their
types are checked by the contract layer) and decision expressions are compiled here (syntax,
result type, size and cost; :mod:`accord.workflow.expressions`).

Codes: ``schema-not-mapping``, ``schema-missing-field``, ``schema-unknown-field``,
``schema-type``, ``schema-enum``, ``schema-bound``, ``schema-name``, ``schema-capability-ref``,
``schema-too-many-stages``, ``schema-fan-out``, ``schema-payload-too-large``,
``schema-duplicate-deadline``, plus ``binding-syntax``/``binding-interpolation`` and the
``expression-*`` codes of the expression compiler. Field readers live in :mod:`.schema_fields`.
"""

from __future__ import annotations

from typing import Any

from accord.canonical import canonical_json
from accord.errors import Diagnostic
from accord.workflow import limits
from accord.workflow.bindings import BindingError, parse_input
from accord.workflow.dsl import (
    AnyStage,
    BranchDef,
    DecisionDef,
    Definition,
    ForkDef,
    JoinDef,
    Node,
    TaskDef,
)
from accord.workflow.expressions import ExpressionError, compile_expression
from accord.workflow.plan import CachePolicy, TerminalPolicy
from accord.workflow.schema_fields import Reader

__all__ = ["check_schema"]

_TASK_KEYS = {
    "name",
    "type",
    "input",
    "on_success",
    "on_failure",
    "retry",
    "timeouts",
    "execution_deadline_ms",
    "cache",
    "compensate",
}
_KEYS = {
    "worker": _TASK_KEYS | {"worker", "queue"},
    "action": _TASK_KEYS | {"action"},
    "decision": {"name", "type", "branches", "on_evaluation_error"},
    "fork": {"name", "type", "branches"},
    "join": {"name", "type", "required", "acceptable_terminal_states", "on_success", "on_failure"},
}
_TOP_KEYS = {
    "name",
    "version",
    "entry",
    "stages",
    "terminals",
    "terminal_policy",
    "finalisers",
    "deadline_ms",
    "context",
    "owner",
    "status",
    "review_date",
    "promotion_criteria",
}
_BRANCH_STATES = ("completed", "failed", "cancelled")
# The policies the engine implements; anything else is a typo, refused rather than ignored.
_POLICY_VALUES = {
    "fork_branch_failure": ("request-cancellation-and-fence",),
    "late_callbacks": ("reject-and-record",),
    "finalisers": ("declared-order",),
}


def check_schema(root: Node) -> tuple[Definition | None, list[Diagnostic]]:
    """Check shapes and bounds; return the typed definition when there are no errors."""
    r = Reader()
    if root.kind != "map":
        return None, [Diagnostic("schema-not-mapping", "a workflow is a mapping", root.location)]
    r.closed(root, _TOP_KEYS, "")
    stages_node = r.child(root, "stages", "", kind="seq")
    stage_nodes = stages_node.items if stages_node is not None else ()
    if len(stage_nodes) > limits.MAX_STAGES:
        r.error(
            "schema-too-many-stages",
            f"{len(stage_nodes)} stages (limit {limits.MAX_STAGES})",
            root,
            "stages",
        )
    stages = tuple(s for s in (_stage(r, n) for n in stage_nodes) if s is not None)
    tp_node = r.child(root, "terminal_policy", "", kind="map", required=False)
    policy = TerminalPolicy()
    if tp_node is not None:
        fields = set(TerminalPolicy.__dataclass_fields__)
        r.closed(tp_node, fields, "")
        for key, allowed in _POLICY_VALUES.items():
            r.choice(tp_node, key, "", allowed, default=getattr(policy, key))
        policy = TerminalPolicy(
            **{k: r.text(tp_node, k, "", default=getattr(policy, k)) for k in sorted(fields)}
        )
    status = r.choice(root, "status", "", ("planned", "active"), default="active")
    terminals = r.names(root, "terminals", "")
    for t in terminals:
        if t not in limits.TERMINALS:
            r.error(
                "schema-enum", f"terminal {t!r} is not one of {limits.TERMINALS}", root, "terminals"
            )
    definition = Definition(
        name=r.name(root, "name", ""),
        version=r.text(root, "version", ""),
        entry=r.text(root, "entry", ""),
        stages=stages,
        terminals=terminals,
        node=root,
        terminal_policy=policy,
        finalisers=r.capability_refs(root, "finalisers"),
        deadline_ms=r.integer(root, "deadline_ms", "", (1, limits.MAX_DEADLINE_MS), None),
        context=r.optional_ref(root, "context", ""),
        owner=r.text(root, "owner", "", default=None),
        status="planned" if status == "planned" else "active",
        review_date=r.text(root, "review_date", "", default=None),
        promotion_criteria=r.text(root, "promotion_criteria", "", default=None),
    )
    return (None if r.failed else definition), r.diagnostics


def _stage(r: Reader, node: Node) -> AnyStage | None:
    if node.kind != "map":
        r.error("schema-type", "a stage is a mapping", node)
        return None
    name = r.name(node, "name", "")
    kind = r.choice(node, "type", name, tuple(_KEYS), default=None)
    if kind is None:
        return None
    r.closed(node, _KEYS[kind], name)
    if kind in ("worker", "action"):
        return _task(r, node, name, kind)
    if kind == "decision":
        branches = []
        seq = r.child(node, "branches", name, kind="seq")
        items = seq.items if seq is not None else ()
        if len(items) > limits.MAX_DECISION_BRANCHES:
            r.error(
                "schema-fan-out",
                f"{len(items)} decision branches (limit {limits.MAX_DECISION_BRANCHES})",
                node,
                "branches",
                name,
            )
        for item in items:
            if item.kind != "map":
                r.error("schema-type", "a decision branch is {when, next}", item, None, name)
                continue
            r.closed(item, {"when", "next"}, name)
            when, nxt = r.text(item, "when", name), r.text(item, "next", name)
            try:
                compile_expression(when)
            except ExpressionError as exc:
                r.error(exc.code, exc.message, item, "when", name)
            branches.append(BranchDef(when, nxt, item))
        return DecisionDef(name, node, tuple(branches), r.text(node, "on_evaluation_error", name))
    if kind == "fork":
        branches_ = r.names(node, "branches", name)
        if len(branches_) > limits.MAX_FAN_OUT:
            r.error(
                "schema-fan-out",
                f"{len(branches_)} fork branches (limit {limits.MAX_FAN_OUT})",
                node,
                "branches",
                name,
            )
        if len(branches_) < 2:
            r.error("schema-fan-out", "a fork needs at least two branches", node, "branches", name)
        return ForkDef(name, node, branches_)
    states = r.names(node, "acceptable_terminal_states", name, required=False) or ("completed",)
    for s in states:
        if s not in _BRANCH_STATES:
            r.error(
                "schema-enum",
                f"branch state {s!r} is not one of {_BRANCH_STATES}",
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


def _task(r: Reader, node: Node, name: str, kind: str) -> TaskDef:
    capability = r.capability_ref(node, kind, name)
    raw_input = r.child(node, "input", name, kind="map", required=False)
    value: dict[str, Any] = raw_input.plain() if raw_input is not None else {}
    parsed: dict[str, Any] = {}
    try:
        parsed = {k: parse_input(v) for k, v in value.items()}
    except BindingError as exc:
        r.error(exc.code, exc.message, node, "input", name)
    if _rough_size(value) > limits.MAX_INPUT_BYTES // 2 and (
        len(canonical_json(value)) > limits.MAX_INPUT_BYTES
    ):
        r.error(
            "schema-payload-too-large",
            f"literal input exceeds {limits.MAX_INPUT_BYTES} bytes",
            node,
            "input",
            name,
        )
    cache = CachePolicy()
    cache_node = r.child(node, "cache", name, kind="map", required=False)
    if cache_node is not None:
        r.closed(cache_node, {"enabled", "ttl_ms"}, name)
        cache = CachePolicy(
            enabled=r.boolean(cache_node, "enabled", name, False),
            ttl_ms=r.integer(cache_node, "ttl_ms", name, (0, limits.MAX_CACHE_TTL_MS), 0) or 0,
        )
    return TaskDef(
        name,
        node,
        type="worker" if kind == "worker" else "action",
        capability=capability,
        queue=r.text(node, "queue", name, default=None),
        input=parsed,
        on_success=r.text(node, "on_success", name),
        on_failure=r.text(node, "on_failure", name),
        retry=r.retry(node, name),
        timeouts=r.timeouts(node, name),
        cache=cache,
        compensate=r.optional_ref(node, "compensate", name),
    )


def _rough_size(value: Any) -> int:
    """At least half the canonical JSON size (escapes only add), cheaply."""
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, dict):
        return sum(len(k) + 3 + _rough_size(v) for k, v in value.items()) + 2
    if isinstance(value, list):
        return sum(_rough_size(v) + 1 for v in value) + 2
    return 8
