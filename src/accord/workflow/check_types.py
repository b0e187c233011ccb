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

What each stage needs is its kind's (``StageKind.resolve`` and ``StageKind.check_reads``,
:mod:`accord.workflow.kinds`); this layer is the :class:`~accord.workflow.kinds.base.TypeContext`
they work in, and checks the context contract and the finalisers itself.

Codes: ``type-unknown-capability``, ``type-unknown-contract``, ``type-capability-kind``,
``type-capability-planned``, ``type-capability-deprecated`` (warning), ``type-queue-missing``,
``type-queue-mismatch`` (warning), ``type-cache-not-cacheable``, ``type-retry-unknown-error``,
``type-expression-unknown-stage``, ``type-expression-unknown-field``,
``type-expression-not-completed``, ``type-expression-unguarded-optional``, and the input codes.
"""

from __future__ import annotations

from collections.abc import Mapping

from accord.contracts.model import ContractRef, FieldSpec, MessageContract
from accord.errors import Diagnostic
from accord.workflow.catalog import ContractCatalogLike
from accord.workflow.dsl import Definition, StageDef
from accord.workflow.graph import Graph, guaranteed
from accord.workflow.kinds import kind_of
from accord.workflow.kinds.base import Resolved
from accord.workflow.plan import Binding, CapabilityPin

__all__ = ["Resolved", "check_types"]


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
        if not kind_of(target).has_result:
            return None, "type-binding-no-result", f"{target.type} stage {name!r} has no result"
        if not self.guaranteed(at, name, "result"):
            return (
                None,
                "type-binding-not-completed",
                f"stage {name!r} has not completed on every path to this stage",
            )
        return self.result_fields(name), "", ""

    def has_result(self, stage: str) -> bool:
        target = self.graph.stages.get(stage)
        return target is not None and kind_of(target).has_result

    def guaranteed(self, at: str, stage: str, part: str) -> bool:
        sets = self.completed if part == "result" else self.ran
        return bool(sets[at] >> self.position[stage] & 1)


def check_types(
    d: Definition, graph: Graph, catalog: ContractCatalogLike
) -> tuple[Resolved, list[Diagnostic]]:
    """Type the definition against ``catalog``; return pins, typed inputs and findings."""
    t = _Typer(d, graph, catalog)
    if d.context:
        t.context = t.message(ContractRef.parse(d.context), None, "context")
    for name in graph.topo:  # producers before consumers
        stage = graph.stages[name]
        kind_of(stage).resolve(t, stage)
    for stage in graph.stages.values():
        kind_of(stage).check_reads(t, stage)
    for ref in d.finalisers:
        pin = t.pin(ref, "action", None, "finalisers")
        if pin is not None:
            t.out.finalisers.append(pin)
    return t.out, t.diags
