"""Layer 3 — contracts and types, against a contract catalog.

Every capability ``name@version`` (tasks, compensations, finalisers) must exist in the catalog
with its request and result messages; a ``worker`` stage needs a worker capability and an
``action`` stage (and every compensation and finaliser) an action capability. An ``active``
workflow may not use a ``planned`` capability (planned workflows are judged by the admission
layer). A worker's ``queue`` defaults to its capability's; a different one is a warning.
Inputs and bindings are typed by :mod:`accord.workflow.check_inputs`. Decision expressions may
read only fields that exist (context contract, result contracts), only stages guaranteed to have
completed (``result``) or run (``state``) on every path to the decision, and an optional field
only under a ``has()`` test of that field.

Codes: ``type-unknown-capability``, ``type-unknown-contract``, ``type-capability-kind``,
``type-capability-planned``, ``type-capability-deprecated`` (warning), ``type-queue-missing``,
``type-queue-mismatch`` (warning), ``type-cache-not-cacheable``, ``type-retry-unknown-error``,
``type-expression-unknown-stage``, ``type-expression-unknown-field``,
``type-expression-not-completed``, ``type-expression-unguarded-optional``, and the input codes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from accord.contracts.model import CapabilityContract, ContractRef, FieldSpec, MessageContract
from accord.errors import Diagnostic
from accord.workflow.catalog import ContractCatalogLike
from accord.workflow.cel_refs import Reference
from accord.workflow.check_inputs import may_be_missing, type_input, walk
from accord.workflow.dsl import DecisionDef, Definition, StageDef, TaskDef, location_of
from accord.workflow.expressions import compile_expression
from accord.workflow.graph import Graph, guaranteed
from accord.workflow.plan import Binding, CapabilityPin, InputValue

__all__ = ["Resolved", "check_types"]


@dataclass(slots=True)
class Resolved:
    pins: dict[str, CapabilityPin] = field(default_factory=dict)  # stage → capability
    compensations: dict[str, CapabilityPin] = field(default_factory=dict)
    finalisers: list[CapabilityPin] = field(default_factory=list)
    inputs: dict[str, dict[str, InputValue]] = field(default_factory=dict)
    queues: dict[str, str | None] = field(default_factory=dict)
    capabilities: dict[str, CapabilityContract] = field(default_factory=dict)  # ref → contract
    contracts: dict[str, str] = field(default_factory=dict)  # ref → digest


def _a(kind: str) -> str:
    return f"an {kind}" if kind == "action" else f"a {kind}"


class _Typer:
    def __init__(self, d: Definition, graph: Graph, catalog: ContractCatalogLike) -> None:
        self.d, self.graph, self.catalog = d, graph, catalog
        self.out = Resolved()
        self.diags: list[Diagnostic] = []
        self.completed = guaranteed(graph, success_only=True)
        self.ran = guaranteed(graph, success_only=False)
        self.position = {n: i for i, n in enumerate(graph.topo)}
        self.context: MessageContract | None = None
        self.digests: dict[str, str] = {}
        self.pinned: dict[tuple[str, str], CapabilityPin] = {}

    def digest(self, ref: ContractRef) -> str:
        key = str(ref)
        if key not in self.digests:
            self.digests[key] = self.catalog.digest(ref)
        return self.digests[key]

    def message(self, ref: ContractRef, where: StageDef | None, key: str) -> MessageContract | None:
        found = self.catalog.message(ref)
        if found is None:
            text = f"message contract {ref} is not in the catalog"
            self.diags.append(
                where.diag("type-unknown-contract", text, key)
                if where
                else self.d.diag("type-unknown-contract", text, key)
            )
            return None
        self.out.contracts[str(ref)] = self.digest(ref)
        return found

    def pin(self, text: str, kind: str, where: StageDef | None, key: str) -> CapabilityPin | None:
        def report(code: str, message: str, severity: str = "error") -> None:
            owner = where if where is not None else self.d
            self.diags.append(owner.diag(code, message, key, severity=severity))

        if (text, kind) in self.pinned:  # checked once per capability, not once per stage
            return self.pinned[(text, kind)]
        ref = ContractRef.parse(text)
        cap = self.catalog.capability(ref)
        if cap is None:
            report("type-unknown-capability", f"capability {text} is not in the catalog")
            return None
        if cap.kind != kind:
            report(
                "type-capability-kind",
                f"{text} is {_a(cap.kind)} capability; {key} needs {_a(kind)}",
            )
            return None
        if cap.status == "planned" and self.d.status == "active":
            report(
                "type-capability-planned", f"{text} is planned; an active workflow may not use it"
            )
        elif cap.status == "deprecated":
            report("type-capability-deprecated", f"{text} is deprecated", "warning")
        request = self.message(cap.request, where, key)
        result = self.message(cap.result, where, key)
        if request is None or result is None:
            return None
        self.out.capabilities[text] = cap
        self.out.contracts[text] = self.digest(ref)
        c = self.out.contracts
        pin = CapabilityPin(
            cap.kind,
            cap.name,
            cap.version,
            str(cap.request),
            str(cap.result),
            c[str(cap.request)],
            c[str(cap.result)],
        )
        self.pinned[(text, kind)] = pin
        return pin

    def result_fields(self, stage: str) -> Mapping[str, FieldSpec] | None:
        pin = self.out.pins.get(stage)
        msg = self.catalog.message(ContractRef.parse(pin.result)) if pin else None
        return msg.payload if msg is not None else None

    def source(self, b: Binding, at: str) -> tuple[Mapping[str, FieldSpec] | None, str, str]:
        if b.source == "context":
            return (self.context.payload if self.context else None), "", ""
        name = b.stage or ""
        target = self.graph.stages.get(name)
        if target is None:
            return None, "type-binding-unknown-stage", f"no stage {name!r}"
        if not isinstance(target, TaskDef):
            return None, "type-binding-no-result", f"{target.type} stage {name!r} has no result"
        if not self.completed[at] >> self.position[name] & 1:
            return (
                None,
                "type-binding-not-completed",
                f"stage {name!r} has not completed on every path to this stage",
            )
        return self.result_fields(name), "", ""

    def task(self, s: TaskDef) -> None:
        pin = self.pin(s.capability, s.type, s, s.type)
        if s.compensate:
            comp = self.pin(s.compensate, "action", s, "compensate")
            if comp is not None:
                self.out.compensations[s.name] = comp
        if pin is None:
            return
        self.out.pins[s.name] = pin
        cap = self.out.capabilities[s.capability]
        queue = s.queue
        if s.type == "worker":
            queue = s.queue or cap.queue
            if queue is None:
                self.diags.append(
                    s.diag(
                        "type-queue-missing", "no queue on the stage or its capability", "worker"
                    )
                )
            elif cap.queue and queue != cap.queue:
                self.diags.append(
                    s.diag(
                        "type-queue-mismatch",
                        f"queue {queue!r} differs from the capability's {cap.queue!r}",
                        "queue",
                        severity="warning",
                    )
                )
        self.out.queues[s.name] = queue
        if s.cache.enabled and not cap.cacheable:
            self.diags.append(
                s.diag("type-cache-not-cacheable", f"{s.capability} is not cacheable", "cache")
            )
        for cls in s.retry.retry_on:
            if cls not in ("retryable", "timeout") and cls not in cap.errors:
                self.diags.append(
                    s.diag(
                        "type-retry-unknown-error",
                        f"retry_on {cls!r} is neither a class nor an error of {s.capability}",
                        "retry",
                    )
                )
        request = self.catalog.message(cap.request)
        if request is not None:
            typed, found = type_input(s, request.payload, lambda b: self.source(b, s.name))
            self.out.inputs[s.name] = typed
            self.diags += found

    def decision(self, s: DecisionDef) -> None:
        for branch in s.branches:
            compiled = compile_expression(branch.when)
            guards = {(r.stage, r.path) for r in compiled.references if r.kind == "has"}
            for ref in compiled.references:
                problem = self.reference(s, ref, guards)
                if problem:
                    code, message = problem
                    where = location_of(branch.node, "when")
                    text = f"`{branch.when}`: {message}"
                    self.diags.append(Diagnostic(code, text, where, "branches.when", s.name))

    def reference(
        self, s: DecisionDef, ref: Reference, guards: set[tuple[str | None, tuple[str, ...]]]
    ) -> tuple[str, str] | None:
        fields: Mapping[str, FieldSpec] | None
        if ref.stage is None:
            fields = self.context.payload if self.context else None
        else:
            target = self.graph.stages.get(ref.stage)
            if not isinstance(target, TaskDef):
                return "type-expression-unknown-stage", f"no task stage {ref.stage!r}"
            sets = self.completed if ref.part == "result" else self.ran
            if not sets[s.name] >> self.position[ref.stage] & 1:
                verb = "completed" if ref.part == "result" else "run"
                return (
                    "type-expression-not-completed",
                    f"stage {ref.stage!r} has not {verb} on every path to this decision",
                )
            fields = self.result_fields(ref.stage) if ref.part == "result" else None
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


def check_types(
    d: Definition, graph: Graph, catalog: ContractCatalogLike
) -> tuple[Resolved, list[Diagnostic]]:
    """Type the definition against ``catalog``; return pins, typed inputs and findings."""
    t = _Typer(d, graph, catalog)
    if d.context:
        t.context = t.message(ContractRef.parse(d.context), None, "context")
    for name in graph.topo:  # producers before consumers
        stage = graph.stages[name]
        if isinstance(stage, TaskDef):
            t.task(stage)
    for stage in graph.stages.values():
        if isinstance(stage, DecisionDef):
            t.decision(stage)
    for ref in d.finalisers:
        pin = t.pin(ref, "action", None, "finalisers")
        if pin is not None:
            t.out.finalisers.append(pin)
    return t.out, t.diags
