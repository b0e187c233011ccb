"""The approval kind: a gate that waits, durably, for people to decide.

```yaml
- name: review-listing
  type: approval
  approvers: { role: operator, tenant_scoped: true, min: 1, exclude_requester: true }
  options: [approve, reject]          # each option routes
  on_approve: publish
  on_reject: failed
  timeout_ms: 86400000
  on_timeout: failed                  # or a stage
  form: listing-review@1              # optional contract for the approver's input
```

Reaching a gate dispatches nothing: the run records the gate as ``waiting`` and arms one durable
timer for ``timeout_ms`` (:mod:`accord.engine.machine.kinds.approval`). ``min`` distinct eligible
approvers must approve; one eligible rejection rejects. An approver is eligible when their role is
at least ``approvers.role`` (:data:`ROLES`, the control plane's order), when one of their tenants
is the run's (``tenant_scoped``), and when they did not request the run (``exclude_requester``).
``form`` names a message contract the approver's form data must satisfy; the type layer pins it.

In the deadline budget a gate costs its ``timeout_ms``: the longest it can hold the run.

Codes: ``schema-enum`` (role, option), ``schema-bound`` (``min``, ``timeout_ms``),
``schema-approval-options`` (no ``approve`` option, or ``on_reject`` without ``reject``),
``schema-capability-ref`` (``form``); ``graph-unknown-target``, ``graph-undeclared-terminal``;
``type-unknown-contract`` (``form``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from accord.contracts.model import ContractRef
from accord.contracts.validate import Validator
from accord.contracts.yamlsource import Node
from accord.workflow import limits
from accord.workflow.catalog import ContractCatalogLike
from accord.workflow.kinds.base import (
    Arrow,
    Edge,
    Placement,
    References,
    Resolved,
    StageDef,
    StageKind,
    TypeContext,
    reads_nothing,
)
from accord.workflow.schema_fields import SchemaReader

__all__ = [
    "KIND",
    "OPTIONS",
    "ROLES",
    "ApprovalDef",
    "ApprovalStage",
    "Approvers",
    "form_problems",
    "role_at_least",
]

ROLES = ("viewer", "operator", "author", "admin")  # the control plane's order, weakest first
OPTIONS = ("approve", "reject")
MAX_APPROVERS = 20
MAX_TIMEOUT_MS = limits.MAX_DEADLINE_MS


def role_at_least(role: str, needed: str) -> bool:
    """Whether ``role`` may do what ``needed`` may (unknown roles may nothing)."""
    return role in ROLES and needed in ROLES and ROLES.index(role) >= ROLES.index(needed)


def form_problems(
    stage: ApprovalStage, catalog: ContractCatalogLike | None, form: Mapping[str, Any]
) -> tuple[str, ...]:
    """What is wrong with ``form`` against the gate's form contract (nothing when it has none:
    the machine refuses form data a gate does not take)."""
    if stage.form is None:
        return ()
    contract = catalog.message(ContractRef.parse(stage.form)) if catalog is not None else None
    if contract is None:
        return (f"form contract {stage.form} is not available to check the form",)
    result = Validator.for_contract(contract).validate(dict(form))
    return tuple(f"{v.path or '(form)'}: {v.message}" for v in result.violations)


@dataclass(frozen=True, slots=True)
class Approvers:
    role: str = "operator"
    tenant_scoped: bool = True
    min: int = 1
    exclude_requester: bool = True


@dataclass(frozen=True, slots=True)
class ApprovalDef(StageDef):
    approvers: Approvers = field(default_factory=Approvers)
    options: tuple[str, ...] = OPTIONS
    on_approve: str = ""
    on_reject: str = ""
    timeout_ms: int = 0
    on_timeout: str = ""
    form: str | None = None
    type: Literal["approval"] = "approval"


@dataclass(frozen=True, slots=True)
class ApprovalStage:
    name: str
    approvers: Approvers
    options: tuple[str, ...]
    on_approve: str
    on_reject: str  # empty when ``reject`` is not an option
    timeout_ms: int
    on_timeout: str
    form: str | None = None  # message contract ref of the approver's form data
    type: Literal["approval"] = "approval"
    fork: str | None = None
    branch: str | None = None
    line: int = field(default=0, compare=False)


# --- schema ---------------------------------------------------------------------------------

FIELDS = {
    "approval": frozenset(
        {
            "name",
            "type",
            "approvers",
            "options",
            "on_approve",
            "on_reject",
            "timeout_ms",
            "on_timeout",
            "form",
        }
    )
}


def read(r: SchemaReader, node: Node, name: str, kind: str) -> ApprovalDef:
    approvers = Approvers()
    who = r.child(node, "approvers", name, kind="map")
    if who is not None:
        r.closed(who, {"role", "tenant_scoped", "min", "exclude_requester"}, name)
        approvers = Approvers(
            role=r.choice(who, "role", name, ROLES, "operator") or "operator",
            tenant_scoped=r.boolean(who, "tenant_scoped", name, True),
            min=r.integer(who, "min", name, (1, MAX_APPROVERS), 1) or 1,
            exclude_requester=r.boolean(who, "exclude_requester", name, True),
        )
    options = r.names(node, "options", name, required=False) or OPTIONS
    for option in options:
        if option not in OPTIONS:
            r.error_at(
                "schema-enum", f"option {option!r} is not one of {OPTIONS}", node, "options", name
            )
    if "approve" not in options:
        r.error_at(
            "schema-approval-options", "a gate needs the approve option", node, "options", name
        )
    on_reject = ""
    if "reject" in options:
        on_reject = r.text(node, "on_reject", name)
    elif r.text(node, "on_reject", name, default=None) is not None:
        r.error_at(
            "schema-approval-options",
            "on_reject is set but reject is not an option",
            node,
            "on_reject",
            name,
        )
    form = r.optional_ref(node, "form", name)
    if node.get("timeout_ms") is None:
        r.error_at("schema-missing-field", "missing required field 'timeout_ms'", node, None, name)
    return ApprovalDef(
        name,
        node,
        approvers=approvers,
        options=tuple(dict.fromkeys(options)),
        on_approve=r.text(node, "on_approve", name),
        on_reject=on_reject,
        timeout_ms=r.integer(node, "timeout_ms", name, (1, MAX_TIMEOUT_MS), None) or 0,
        on_timeout=r.text(node, "on_timeout", name),
        form=form,
    )


# --- graph ----------------------------------------------------------------------------------


def edges(s: ApprovalDef) -> list[Edge]:
    out = [Edge(s.name, s.on_approve, "success", "on_approve")]
    if s.on_reject:
        out.append(Edge(s.name, s.on_reject, "failure", "on_reject"))
    return [*out, Edge(s.name, s.on_timeout, "failure", "on_timeout")]


def references(s: ApprovalDef, refs: References) -> None:
    refs.target(s.on_approve, "on_approve")
    if s.on_reject:
        refs.target(s.on_reject, "on_reject")
    refs.target(s.on_timeout, "on_timeout")


# --- types and budget -----------------------------------------------------------------------


def resolve(ctx: TypeContext, s: ApprovalDef) -> None:
    """Pin the form contract, when the gate has one."""
    if s.form is None:
        return
    ref = ContractRef.parse(s.form)
    if ctx.catalog.message(ref) is None:
        text = f"form contract {s.form} is not in the catalog"
        ctx.diags.append(s.diag("type-unknown-contract", text, "form"))
        return
    ctx.out.contracts[s.form] = ctx.catalog.digest(ref)


def cost_ms(s: ApprovalDef) -> int:
    """The longest a gate holds a run: its timeout."""
    return s.timeout_ms


# --- plan -----------------------------------------------------------------------------------


def plan(s: ApprovalDef, at: Placement, r: Resolved) -> ApprovalStage:
    return ApprovalStage(
        name=s.name,
        approvers=s.approvers,
        options=s.options,
        on_approve=s.on_approve,
        on_reject=s.on_reject,
        timeout_ms=s.timeout_ms,
        on_timeout=s.on_timeout,
        form=s.form,
        fork=at.fork,
        branch=at.branch,
        line=at.line,
    )


def to_json(stage: ApprovalStage) -> dict[str, Any]:
    a = stage.approvers
    return {
        "approvers": {
            "role": a.role,
            "tenant_scoped": a.tenant_scoped,
            "min": a.min,
            "exclude_requester": a.exclude_requester,
        },
        "options": list(stage.options),
        "on_approve": stage.on_approve,
        "on_reject": stage.on_reject,
        "timeout_ms": stage.timeout_ms,
        "on_timeout": stage.on_timeout,
        "form": stage.form,
        "fork": stage.fork,
        "branch": stage.branch,
    }


def from_json(doc: Mapping[str, Any], line: int) -> ApprovalStage:
    a = doc["approvers"]
    return ApprovalStage(
        name=doc["name"],
        approvers=Approvers(
            role=a["role"],
            tenant_scoped=a["tenant_scoped"],
            min=a["min"],
            exclude_requester=a["exclude_requester"],
        ),
        options=tuple(doc["options"]),
        on_approve=doc["on_approve"],
        on_reject=doc["on_reject"],
        timeout_ms=doc["timeout_ms"],
        on_timeout=doc["on_timeout"],
        form=doc.get("form"),
        fork=doc.get("fork"),
        branch=doc.get("branch"),
        line=line,
    )


# --- rendering ------------------------------------------------------------------------------


def label(stage: ApprovalStage) -> str:
    a = stage.approvers
    return f"{stage.name}<br/>approval {a.min} x {a.role}"


def arrows(stage: ApprovalStage) -> list[Arrow]:
    out: list[Arrow] = [(stage.on_approve, "success", "approve")]
    if stage.on_reject:
        out.append((stage.on_reject, "failure", "reject"))
    return [*out, (stage.on_timeout, "failure", "timeout")]


KIND: StageKind[ApprovalDef, ApprovalStage] = StageKind(
    name="approval",
    definition=ApprovalDef,
    stage=ApprovalStage,
    fields=FIELDS,
    read=read,
    edges=edges,
    references=references,
    has_result=False,
    resolve=resolve,
    check_reads=reads_nothing,
    cost_ms=cost_ms,
    plan=plan,
    to_json=to_json,
    from_json=from_json,
    shape="box",
    style=None,
    label=label,
    arrows=arrows,
)
