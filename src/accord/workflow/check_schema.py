"""Layer 1 — schema and admission bounds: positioned nodes → a typed :class:`Definition`.

Stage shapes are discriminated by ``type``; each type has a closed set of properties, so a typo
is an error rather than an ignored key. Each stage kind reads its own shape
(:mod:`accord.workflow.kinds`); this layer reads the workflow around them. Bounds keep every plan
small enough to check, store and run predictably (:mod:`accord.workflow.limits`). Bindings are
parsed here (syntax only; their types are checked by the contract layer) and decision expressions
are compiled here (syntax, result type, size and cost; :mod:`accord.workflow.expressions`).

Codes: ``schema-not-mapping``, ``schema-missing-field``, ``schema-unknown-field``,
``schema-type``, ``schema-enum``, ``schema-bound``, ``schema-name``, ``schema-capability-ref``,
``schema-too-many-stages``, ``schema-fan-out``, ``schema-payload-too-large``,
``schema-duplicate-deadline``, plus ``binding-syntax``/``binding-interpolation`` and the
``expression-*`` codes of the expression compiler. Field readers live in :mod:`.schema_fields`.
"""

from __future__ import annotations

from accord.errors import Diagnostic
from accord.workflow import limits
from accord.workflow.dsl import Definition, Node
from accord.workflow.kinds import TYPES, AnyStage, kind_for_type
from accord.workflow.kinds.task import read_actions, read_evidence
from accord.workflow.plan import TerminalPolicy
from accord.workflow.schema_fields import SchemaReader

__all__ = ["check_schema"]

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
    "evidence",
}
# The policies the engine implements; anything else is a typo, refused rather than ignored.
_POLICY_VALUES = {
    # fail-run: a branch arriving at its join in an unaccepted state fails the whole run
    "fork_branch_failure": ("request-cancellation-and-fence", "fail-run"),
    "late_callbacks": ("reject-and-record",),
    "finalisers": ("declared-order",),
}


def check_schema(root: Node) -> tuple[Definition | None, list[Diagnostic]]:
    """Check shapes and bounds; return the typed definition when there are no errors."""
    r = SchemaReader()
    if root.kind != "map":
        return None, [Diagnostic("schema-not-mapping", "a workflow is a mapping", root.location)]
    r.closed(root, _TOP_KEYS, "")
    stages_node = r.child(root, "stages", "", kind="seq")
    stage_nodes = stages_node.items if stages_node is not None else ()
    if len(stage_nodes) > limits.MAX_STAGES:
        r.error_at(
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
            r.error_at(
                "schema-enum", f"terminal {t!r} is not one of {limits.TERMINALS}", root, "terminals"
            )
    finalisers, finaliser_policies = read_actions(r, root, "finalisers")
    definition = Definition(
        name=r.name(root, "name", ""),
        version=r.text(root, "version", ""),
        entry=r.text(root, "entry", ""),
        stages=stages,
        terminals=terminals,
        node=root,
        terminal_policy=policy,
        finalisers=finalisers,
        finaliser_policies=finaliser_policies,
        evidence=read_evidence(r, root, ""),
        deadline_ms=r.integer(root, "deadline_ms", "", (1, limits.MAX_DEADLINE_MS), None),
        context=r.optional_ref(root, "context", ""),
        owner=r.text(root, "owner", "", default=None),
        status="planned" if status == "planned" else "active",
        review_date=r.text(root, "review_date", "", default=None),
        promotion_criteria=r.text(root, "promotion_criteria", "", default=None),
    )
    return (None if r.failed else definition), r.diagnostics


def _stage(r: SchemaReader, node: Node) -> AnyStage | None:
    if node.kind != "map":
        r.error_at("schema-type", "a stage is a mapping", node)
        return None
    name = r.name(node, "name", "")
    type_: str | None = r.choice(node, "type", name, TYPES, default=None)
    kind = kind_for_type(type_) if type_ is not None else None
    if type_ is None or kind is None:  # an unknown type is already a ``schema-enum`` finding
        return None
    r.closed(node, set(kind.fields[type_]), name)
    stage: AnyStage = kind.read(r, node, name, type_)
    return stage
