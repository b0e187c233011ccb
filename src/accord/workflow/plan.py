"""The compiled plan: the frozen, canonical, digest-pinned artefact the engine executes.

This module is the interface between the compiler (which builds plans) and the engine (which only
reads them). A plan is complete: every stage resolved, every default explicit, every capability
pinned to the exact request/result contract versions and their artefact digests. Nothing in a plan
refers back to YAML; the digest covers the canonical JSON of :meth:`Plan.body` (everything but the
digest itself and source line numbers, so cosmetic YAML edits keep the digest).

Edges are stage names or one of the plan's ``terminals`` (``completed``/``failed``), which set the
run's terminal *intent*; finalisers then run and the run ends.

Each stage's plan class and its canonical JSON belong to its kind (:mod:`accord.workflow.kinds`);
the values stages are made of are in :mod:`accord.workflow.values`. Both are re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from accord.canonical import canonical_json, digest_of
from accord.workflow.kinds import (
    ApprovalStage,
    Approvers,
    DecisionBranch,
    DecisionStage,
    ForkStage,
    JoinStage,
    Stage,
    TaskStage,
    kind_for_type,
    kind_of,
)
from accord.workflow.kinds.task import ActionPolicy, policy_from_json, policy_to_json
from accord.workflow.triggers import (
    Budgets,
    Trigger,
    budgets_from_json,
    budgets_to_json,
    trigger_from_json,
    trigger_to_json,
)
from accord.workflow.values import (
    DSL_VERSION,
    TERMINALS,
    Binding,
    CachePolicy,
    CapabilityPin,
    InputValue,
    RetryPolicy,
    Timeouts,
    pin_from_json,
    pin_to_json,
)

__all__ = [
    "DSL_VERSION",
    "TERMINALS",
    "ActionPolicy",
    "ApprovalStage",
    "Approvers",
    "Binding",
    "CachePolicy",
    "CapabilityPin",
    "DecisionBranch",
    "DecisionStage",
    "ForkStage",
    "InputValue",
    "JoinStage",
    "Plan",
    "RetryPolicy",
    "Stage",
    "TaskStage",
    "TerminalPolicy",
    "Timeouts",
]


@dataclass(frozen=True, slots=True)
class TerminalPolicy:
    fork_branch_failure: str = "request-cancellation-and-fence"
    late_callbacks: str = "reject-and-record"
    finalisers: str = "declared-order"
    finaliser_failure_terminal: str = "failed"


@dataclass(frozen=True, slots=True)
class Plan:
    """A compiled workflow. Build with :meth:`create`; ``digest`` is derived, never supplied."""

    name: str
    version: str
    entry: str
    stages: tuple[Stage, ...]
    terminals: tuple[str, ...] = TERMINALS
    terminal_policy: TerminalPolicy = TerminalPolicy()
    finalisers: tuple[CapabilityPin, ...] = ()
    deadline_ms: int | None = None
    context_contract: str | None = None  # message contract ref for the run input
    owner: str | None = None
    status: Literal["planned", "active"] = "active"
    dsl_version: str = DSL_VERSION
    compiler_version: str = "1"
    contracts: Mapping[str, str] = field(default_factory=dict)  # ref → artefact digest
    source: str = field(default="", compare=False)  # file the plan came from (not digested)
    digest: str = field(default="", compare=False)
    _index: Mapping[str, Stage] = field(default_factory=dict, compare=False, repr=False)
    review_date: str | None = None  # planned definitions only (digested when set)
    promotion_criteria: str | None = None  # planned definitions only (digested when set)
    triggers: tuple[Trigger, ...] = ()  # what may start runs (digested when any)
    # one per finaliser, ``None`` for one written as a bare reference (digested when any is set)
    finaliser_policies: tuple[ActionPolicy | None, ...] = ()
    evidence: tuple[str, ...] = ()  # result fields a completed run must carry (digested when any)
    budgets: Budgets | None = None  # admission limits (digested when declared)

    def trigger(self, name: str) -> Trigger | None:
        return next((t for t in self.triggers if t.name == name), None)

    @classmethod
    def create(cls, **kwargs: Any) -> Plan:
        """Build a plan and derive its digest and stage index."""
        plan = cls(**kwargs)
        index = MappingProxyType({s.name: s for s in plan.stages})
        object.__setattr__(plan, "_index", index)
        object.__setattr__(plan, "contracts", MappingProxyType(dict(plan.contracts)))
        object.__setattr__(plan, "digest", digest_of(plan.body()))
        return plan

    def stage(self, name: str) -> Stage:
        return self._index[name]

    def finaliser_policy(self, index: int) -> ActionPolicy | None:
        """Finaliser ``index``'s own retry policy and clocks, when it was given them."""
        policies = self.finaliser_policies
        return policies[index] if index < len(policies) else None

    def has_stage(self, name: str) -> bool:
        return name in self._index

    def is_terminal(self, target: str) -> bool:
        return target in self.terminals

    def body(self) -> dict[str, Any]:
        """The digested content: canonical, without line numbers, source or digest."""
        return _plan_to_json(self, with_lines=False)

    def to_json(self) -> dict[str, Any]:
        """Full canonical document (body + digest + source lines for review tooling)."""
        doc = _plan_to_json(self, with_lines=True)
        doc["digest"] = self.digest
        return doc

    def canonical_bytes(self) -> bytes:
        return canonical_json(self.to_json())

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Plan:
        plan = _plan_from_json(doc)
        if doc.get("digest") and doc["digest"] != plan.digest:
            raise ValueError(
                f"plan digest mismatch: stored {doc['digest']}, computed {plan.digest}"
            )
        return plan


# --- serialisation --------------------------------------------------------------------------


def _stage_to_json(stage: Stage, with_lines: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": stage.name, "type": stage.type}
    doc |= kind_of(stage).to_json(stage)
    if with_lines:
        doc["line"] = stage.line
    return doc


def _stage_from_json(doc: Mapping[str, Any]) -> Stage:
    kind = kind_for_type(doc["type"])
    if kind is None:
        raise ValueError(f"unknown stage type {doc['type']!r}")
    stage: Stage = kind.from_json(doc, int(doc.get("line", 0)))
    return stage


def _plan_to_json(plan: Plan, with_lines: bool) -> dict[str, Any]:
    tp = plan.terminal_policy
    doc: dict[str, Any] = {
        "name": plan.name,
        "version": plan.version,
        "entry": plan.entry,
        "stages": [_stage_to_json(s, with_lines) for s in plan.stages],
        "terminals": list(plan.terminals),
        "terminal_policy": {
            "fork_branch_failure": tp.fork_branch_failure,
            "late_callbacks": tp.late_callbacks,
            "finalisers": tp.finalisers,
            "finaliser_failure_terminal": tp.finaliser_failure_terminal,
        },
        "finalisers": [pin_to_json(f) for f in plan.finalisers],
        "deadline_ms": plan.deadline_ms,
        "context_contract": plan.context_contract,
        "owner": plan.owner,
        "status": plan.status,
        "dsl_version": plan.dsl_version,
        "compiler_version": plan.compiler_version,
        "contracts": dict(sorted(plan.contracts.items())),
    }
    # Optional additions are written only when set, so earlier plans keep their digests.
    if plan.review_date is not None:
        doc["review_date"] = plan.review_date
    if plan.promotion_criteria is not None:
        doc["promotion_criteria"] = plan.promotion_criteria
    if plan.evidence:
        doc["evidence"] = list(plan.evidence)
    if any(plan.finaliser_policies):
        doc["finaliser_policies"] = [policy_to_json(p) for p in plan.finaliser_policies]
    if plan.triggers:
        doc["triggers"] = [trigger_to_json(t, with_lines) for t in plan.triggers]
    if plan.budgets is not None:
        doc["budgets"] = budgets_to_json(plan.budgets)
    if with_lines:
        doc["source"] = plan.source
    return doc


def _plan_from_json(doc: Mapping[str, Any]) -> Plan:
    tp = doc["terminal_policy"]
    finalisers = tuple(p for p in (pin_from_json(f) for f in doc["finalisers"]) if p is not None)
    return Plan.create(
        name=doc["name"],
        version=doc["version"],
        entry=doc["entry"],
        stages=tuple(_stage_from_json(s) for s in doc["stages"]),
        terminals=tuple(doc["terminals"]),
        terminal_policy=TerminalPolicy(
            fork_branch_failure=tp["fork_branch_failure"],
            late_callbacks=tp["late_callbacks"],
            finalisers=tp["finalisers"],
            finaliser_failure_terminal=tp["finaliser_failure_terminal"],
        ),
        finalisers=finalisers,
        deadline_ms=doc.get("deadline_ms"),
        context_contract=doc.get("context_contract"),
        owner=doc.get("owner"),
        status=doc.get("status", "active"),
        dsl_version=doc.get("dsl_version", DSL_VERSION),
        compiler_version=doc.get("compiler_version", "1"),
        contracts=dict(doc.get("contracts", {})),
        source=doc.get("source", ""),
        review_date=doc.get("review_date"),
        promotion_criteria=doc.get("promotion_criteria"),
        triggers=tuple(trigger_from_json(t) for t in doc.get("triggers", ())),
        finaliser_policies=tuple(policy_from_json(p) for p in doc.get("finaliser_policies", ())),
        evidence=tuple(doc.get("evidence", ())),
        budgets=budgets_from_json(doc["budgets"]) if "budgets" in doc else None,
    )
