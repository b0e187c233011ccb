"""Contract typing of stage inputs and of the paths bindings and expressions read.

A stage's ``input`` must satisfy its capability's request contract: every required field without
a default present, no unknown field, literal values of the declared type, bindings whose source
type agrees with the destination. A binding source is a path into the context contract (when the
workflow declares one) or into the result contract of a stage *guaranteed to have completed* on
every path to the binding (:func:`accord.workflow.graph.guaranteed`).

Three compile-time binding errors mirror the run-time codes of :mod:`accord.workflow.bindings`:
``type-binding-missing`` (the path names no field), ``type-binding-null`` (a nullable source
into a non-nullable destination), ``type-binding-type`` (types disagree; ``integer`` fits
``number``). A source that is optional without a default may be absent at run time, which fails
the stage with ``binding-missing``; that is reported as the warning ``type-binding-optional``.
Other codes: ``type-input-missing-field``, ``type-input-unknown-field``, ``type-input-type``,
``type-binding-unknown-stage``, ``type-binding-no-result``, ``type-binding-not-completed``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from accord.contracts.model import FieldSpec
from accord.contracts.yamlsource import location_of
from accord.errors import Diagnostic
from accord.workflow.bindings import type_matches
from accord.workflow.values import Binding, InputValue

if TYPE_CHECKING:  # the task kind imports this module to type its input
    from accord.workflow.kinds.task import TaskDef

__all__ = ["Source", "may_be_missing", "type_input", "walk"]

# Given a binding, the fields it reads from (or an error code + message).
Source = Callable[[Binding], tuple[Mapping[str, FieldSpec] | None, str, str]]


def may_be_missing(spec: FieldSpec) -> bool:
    return not spec.required and not spec.has_default


def walk(
    fields: Mapping[str, FieldSpec] | None, path: tuple[str, ...]
) -> tuple[list[FieldSpec], str]:
    """The specs along ``path`` (shorter when it enters an object of unknown shape), or an
    explanation of why ``path`` names no field."""
    specs: list[FieldSpec] = []
    for i, key in enumerate(path):
        if fields is None:
            return specs, ""
        spec = fields.get(key)
        if spec is None:
            return specs, f"no field {'.'.join(path[: i + 1])!r}"
        specs.append(spec)
        if i < len(path) - 1:
            if spec.type != "object":
                return specs, f"{'.'.join(path[: i + 1])!r} is {spec.type}, not an object"
            fields = spec.fields
    return specs, ""


def _compatible(source: str, destination: str | None) -> bool:
    return (
        destination is None
        or source == destination
        or (source, destination)
        == (
            "integer",
            "number",
        )
    )


def type_input(
    stage: TaskDef, request: Mapping[str, FieldSpec], source: Source
) -> tuple[dict[str, InputValue], list[Diagnostic]]:
    """Check ``stage.input`` against ``request``; return the input with typed bindings."""
    typer = _InputTyper(stage, source)
    return typer.object(stage.input, request, "input"), typer.diags


class _InputTyper:
    def __init__(self, stage: TaskDef, source: Source) -> None:
        self.stage, self.source = stage, source
        self.diags: list[Diagnostic] = []

    def report(self, code: str, message: str, severity: str = "error") -> None:
        diag = self.stage.diag(code, message, "input", severity=severity)
        top = message.split(" ", 1)[0].split(".")  # ``input.<field>…`` names the field
        node = self.stage.node.get("input")
        if node is not None and len(top) > 1 and node.kind == "map":
            diag = replace(diag, location=location_of(node, top[1].split("[")[0]))
        self.diags.append(diag)

    def object(
        self, value: Mapping[str, Any], fields: Mapping[str, FieldSpec], where: str
    ) -> dict[str, InputValue]:
        for name, spec in fields.items():
            if spec.required and not spec.has_default and name not in value:
                self.report("type-input-missing-field", f"{where}.{name} is required")
        out: dict[str, InputValue] = {}
        for key, item in value.items():
            found = fields.get(key)
            if found is None:
                self.report("type-input-unknown-field", f"{where}.{key} is not a request field")
                out[key] = item
            else:
                out[key] = self.value(item, found, f"{where}.{key}")
        return out

    def value(self, item: InputValue, spec: FieldSpec, where: str) -> InputValue:
        if isinstance(item, Binding):
            typed = Binding(item.source, item.path, item.stage, spec.type, item.raw)
            return self.binding(typed, spec, where)
        if item is None:
            if not spec.nullable:
                self.report("type-input-type", f"{where} may not be null")
            return item
        if not type_matches(spec.type, item):
            self.report(
                "type-input-type", f"{where} must be {spec.type}, got {type(item).__name__}"
            )
            return item
        if isinstance(item, Mapping) and spec.fields is not None:
            return self.object(item, spec.fields, where)
        if isinstance(item, list) and spec.items is not None:
            items = spec.items
            return [self.value(v, items, f"{where}[{i}]") for i, v in enumerate(item)]
        return item

    def binding(self, b: Binding, destination: FieldSpec, where: str) -> Binding:
        fields, code, message = self.source(b)
        if code:
            self.report(code, f"{where} ← {b.raw}: {message}")
            return b
        if fields is None:
            return b  # no contract for the source (undeclared context): checked at bind time
        specs, problem = walk(fields, b.path)
        if problem:
            self.report("type-binding-missing", f"{where} ← {b.raw}: {problem}")
            return b
        if not specs or len(specs) < len(b.path):
            return b  # the whole source object, or a path into an object of unknown shape
        last = specs[-1]
        if not _compatible(last.type, destination.type):
            self.report(
                "type-binding-type",
                f"{where} ← {b.raw}: source is {last.type}, destination is {destination.type}",
            )
        elif any(s.nullable for s in specs) and not destination.nullable:
            self.report(
                "type-binding-null", f"{where} ← {b.raw}: source is nullable, destination is not"
            )
        elif any(may_be_missing(s) for s in specs):
            self.report(
                "type-binding-optional",
                f"{where} ← {b.raw}: source is optional and may be absent at run time",
                severity="warning",
            )
        return b
