"""The compiled plan: the frozen, canonical, digest-pinned artefact the engine executes.

This module is the interface between the compiler (which builds plans) and the engine (which only
reads them). A plan is complete: every stage resolved, every default explicit, every capability
pinned to the exact request/result contract versions and their artefact digests. Nothing in a plan
refers back to YAML; the digest covers the canonical JSON of :meth:`Plan.body` (everything but the
digest itself and source line numbers, so cosmetic YAML edits keep the digest).

Edges are stage names or one of the plan's ``terminals`` (``completed``/``failed``), which set the
run's terminal *intent*; finalisers then run and the run ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, TypeAlias

from accord.canonical import canonical_json, digest_of

__all__ = [
    "DSL_VERSION",
    "TERMINALS",
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

DSL_VERSION = "1"
TERMINALS: tuple[str, ...] = ("completed", "failed")

JsonValue: TypeAlias = Any


@dataclass(frozen=True, slots=True)
class CapabilityPin:
    """A capability ``name@version`` pinned to its request/result contracts."""

    kind: Literal["worker", "action"]
    name: str
    version: int
    request: str  # message contract ref, ``thumbnail-generation-request@2``
    result: str  # message contract ref, ``thumbnail-generated@1``
    request_digest: str
    result_digest: str

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"


@dataclass(frozen=True, slots=True)
class Binding:
    """A typed reference: ``${context.a.b}`` or ``${stages["s"].result.a}``, bound at run time."""

    source: Literal["context", "stage"]
    path: tuple[str, ...]
    stage: str | None = None
    expected_type: str | None = None  # contract field type at the destination, when known
    raw: str = ""


InputValue: TypeAlias = Binding | JsonValue


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded exponential backoff. ``max_attempts`` counts the first attempt."""

    max_attempts: int = 3
    initial_backoff_ms: int = 1_000
    max_backoff_ms: int = 30_000
    multiplier: float = 2.0
    jitter: float = 0.2  # fraction of the delay, drawn uniformly in [-jitter, +jitter]
    retry_on: tuple[str, ...] = ("retryable", "timeout")

    def backoff_ms(self, attempt: int, unit_random: float = 0.5) -> int:
        """Delay before attempt ``attempt + 1`` (``attempt`` ≥ 1); ``unit_random`` in [0, 1)."""
        base = min(self.initial_backoff_ms * self.multiplier ** (attempt - 1), self.max_backoff_ms)
        spread = base * self.jitter * (2.0 * unit_random - 1.0)
        return max(0, min(int(base + spread), int(self.max_backoff_ms * (1 + self.jitter))))

    def worst_case_backoff_ms(self) -> int:
        """Sum of the longest possible delays between all attempts."""
        return sum(self.backoff_ms(a, 1.0) for a in range(1, self.max_attempts))


@dataclass(frozen=True, slots=True)
class Timeouts:
    queue_deadline_ms: int = 60_000  # dispatch → acceptance
    execution_deadline_ms: int = 300_000  # acceptance → result
    heartbeat_timeout_ms: int | None = None  # max silence while running


@dataclass(frozen=True, slots=True)
class CachePolicy:
    enabled: bool = False
    ttl_ms: int = 0


@dataclass(frozen=True, slots=True)
class TaskStage:
    """A ``worker`` (dispatched over ``queue``) or ``action`` (invoked in the engine) stage."""

    name: str
    type: Literal["worker", "action"]
    capability: CapabilityPin
    input: Mapping[str, InputValue]
    on_success: str
    on_failure: str
    retry: RetryPolicy = RetryPolicy()
    timeouts: Timeouts = Timeouts()
    queue: str | None = None
    cache: CachePolicy = CachePolicy()
    compensate: CapabilityPin | None = None
    fork: str | None = None  # enclosing fork, when the stage is on a fork branch
    branch: str | None = None  # that branch's entry stage name
    line: int = field(default=0, compare=False)


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


@dataclass(frozen=True, slots=True)
class ForkStage:
    name: str
    branches: tuple[str, ...]
    join: str  # the join every branch reaches
    type: Literal["fork"] = "fork"
    fork: str | None = None
    branch: str | None = None
    line: int = field(default=0, compare=False)


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


Stage: TypeAlias = TaskStage | DecisionStage | ForkStage | JoinStage


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


def _pin_to_json(pin: CapabilityPin | None) -> dict[str, Any] | None:
    if pin is None:
        return None
    return {
        "kind": pin.kind,
        "name": pin.name,
        "version": pin.version,
        "request": pin.request,
        "result": pin.result,
        "request_digest": pin.request_digest,
        "result_digest": pin.result_digest,
    }


def _pin_from_json(doc: Mapping[str, Any] | None) -> CapabilityPin | None:
    if doc is None:
        return None
    return CapabilityPin(
        kind=doc["kind"],
        name=doc["name"],
        version=int(doc["version"]),
        request=doc["request"],
        result=doc["result"],
        request_digest=doc["request_digest"],
        result_digest=doc["result_digest"],
    )


def _value_to_json(value: InputValue) -> Any:
    if isinstance(value, Binding):
        return {
            "$binding": {
                "source": value.source,
                "stage": value.stage,
                "path": list(value.path),
                "expected_type": value.expected_type,
                "raw": value.raw,
            }
        }
    return value


def _value_from_json(doc: Any) -> InputValue:
    if isinstance(doc, Mapping) and set(doc) == {"$binding"}:
        b = doc["$binding"]
        return Binding(
            source=b["source"],
            stage=b.get("stage"),
            path=tuple(b["path"]),
            expected_type=b.get("expected_type"),
            raw=b.get("raw", ""),
        )
    return doc


def _stage_to_json(stage: Stage, with_lines: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": stage.name, "type": stage.type}
    if isinstance(stage, TaskStage):
        r, t, c = stage.retry, stage.timeouts, stage.cache
        doc |= {
            "capability": _pin_to_json(stage.capability),
            "queue": stage.queue,
            "input": {k: _value_to_json(v) for k, v in stage.input.items()},
            "on_success": stage.on_success,
            "on_failure": stage.on_failure,
            "retry": {
                "max_attempts": r.max_attempts,
                "initial_backoff_ms": r.initial_backoff_ms,
                "max_backoff_ms": r.max_backoff_ms,
                "multiplier": r.multiplier,
                "jitter": r.jitter,
                "retry_on": list(r.retry_on),
            },
            "timeouts": {
                "queue_deadline_ms": t.queue_deadline_ms,
                "execution_deadline_ms": t.execution_deadline_ms,
                "heartbeat_timeout_ms": t.heartbeat_timeout_ms,
            },
            "cache": {"enabled": c.enabled, "ttl_ms": c.ttl_ms},
            "compensate": _pin_to_json(stage.compensate),
            "fork": stage.fork,
            "branch": stage.branch,
        }
    elif isinstance(stage, DecisionStage):
        doc |= {
            "branches": [
                {
                    "when": b.when,
                    "next": b.next,
                    "references": list(b.references),
                    "checked": b.checked,
                }
                for b in stage.branches
            ],
            "on_evaluation_error": stage.on_evaluation_error,
            "fork": stage.fork,
            "branch": stage.branch,
        }
    elif isinstance(stage, ForkStage):
        doc |= {
            "branches": list(stage.branches),
            "join": stage.join,
            "fork": stage.fork,
            "branch": stage.branch,
        }
    else:
        doc |= {
            "fork": stage.fork,
            "required": list(stage.required),
            "acceptable_terminal_states": list(stage.acceptable_terminal_states),
            "on_success": stage.on_success,
            "on_failure": stage.on_failure,
            "branch": stage.branch,
        }
    if with_lines:
        doc["line"] = stage.line
    return doc


def _stage_from_json(doc: Mapping[str, Any]) -> Stage:
    kind = doc["type"]
    line = int(doc.get("line", 0))
    if kind in ("worker", "action"):
        cap = _pin_from_json(doc["capability"])
        assert cap is not None
        r, t, c = doc["retry"], doc["timeouts"], doc["cache"]
        return TaskStage(
            name=doc["name"],
            type=kind,
            capability=cap,
            queue=doc.get("queue"),
            input={k: _value_from_json(v) for k, v in doc["input"].items()},
            on_success=doc["on_success"],
            on_failure=doc["on_failure"],
            retry=RetryPolicy(
                max_attempts=r["max_attempts"],
                initial_backoff_ms=r["initial_backoff_ms"],
                max_backoff_ms=r["max_backoff_ms"],
                multiplier=r["multiplier"],
                jitter=r["jitter"],
                retry_on=tuple(r["retry_on"]),
            ),
            timeouts=Timeouts(
                queue_deadline_ms=t["queue_deadline_ms"],
                execution_deadline_ms=t["execution_deadline_ms"],
                heartbeat_timeout_ms=t["heartbeat_timeout_ms"],
            ),
            cache=CachePolicy(enabled=c["enabled"], ttl_ms=c["ttl_ms"]),
            compensate=_pin_from_json(doc.get("compensate")),
            fork=doc.get("fork"),
            branch=doc.get("branch"),
            line=line,
        )
    if kind == "decision":
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
    if kind == "fork":
        return ForkStage(
            name=doc["name"],
            branches=tuple(doc["branches"]),
            join=doc["join"],
            fork=doc.get("fork"),
            branch=doc.get("branch"),
            line=line,
        )
    if kind == "join":
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
    raise ValueError(f"unknown stage type {kind!r}")


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
        "finalisers": [_pin_to_json(f) for f in plan.finalisers],
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
    if with_lines:
        doc["source"] = plan.source
    return doc


def _plan_from_json(doc: Mapping[str, Any]) -> Plan:
    tp = doc["terminal_policy"]
    finalisers = tuple(p for p in (_pin_from_json(f) for f in doc["finalisers"]) if p is not None)
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
    )
