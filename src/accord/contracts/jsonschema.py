"""Export a message contract as JSON Schema 2020-12.

The schema is the contract's *structural* half: types, constraints, closed objects and where
``null`` is allowed. The DSL's own semantics that JSON Schema cannot express are kept as
annotations and applied by the validators (:mod:`accord.contracts.validate`, the TypeScript
binding), never by a schema engine's defaults:

- ``default`` is an annotation only; a default fills a field only when it is *missing*;
- every object with declared ``fields`` is closed (``additionalProperties: false``), recursively;
  an ``object`` field declared without ``fields`` is an opaque value (a free-form map);
- ``null`` is allowed only where ``nullable`` (``type: [T, "null"]``, and ``null`` joins ``enum``);
- ``x-accord-unit`` and ``x-accord-sensitive`` carry the unit and redaction annotations.

Output is deterministic: properties and ``required`` are sorted by name and the document holds
only JSON values, so ``canonical_json(export(c))`` is stable across runs and platforms.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from accord.contracts.model import FieldSpec, MessageContract

__all__ = ["SCHEMA_DIALECT", "export", "field_schema", "object_schema", "schema_id"]

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

_CONSTRAINTS: tuple[tuple[str, str], ...] = (
    ("min_length", "minLength"),
    ("max_length", "maxLength"),
    ("pattern", "pattern"),
    ("format", "format"),
    ("minimum", "minimum"),
    ("maximum", "maximum"),
    ("exclusive_minimum", "exclusiveMinimum"),
    ("exclusive_maximum", "exclusiveMaximum"),
    ("multiple_of", "multipleOf"),
    ("min_items", "minItems"),
    ("max_items", "maxItems"),
)


def schema_id(name: str, version: int) -> str:
    """The stable ``$id`` of a message contract's schema."""
    return f"urn:accord:contract:{name}:{version}"


def export(contract: MessageContract) -> dict[str, Any]:
    """The JSON Schema 2020-12 document of ``contract``'s payload (closed, deterministic)."""
    schema: dict[str, Any] = {
        "$schema": SCHEMA_DIALECT,
        "$id": schema_id(contract.name, contract.wire_version),
        "title": f"{contract.name}@{contract.wire_version}",
    }
    if contract.description:
        schema["description"] = contract.description
    schema.update(object_schema(contract.payload))
    if contract.status == "deprecated":
        schema["deprecated"] = True
    schema["x-accord-contract"] = {
        "name": contract.name,
        "wireVersion": contract.wire_version,
        "owner": contract.owner,
        "status": contract.status,
    }
    return schema


def object_schema(
    fields: Mapping[str, FieldSpec], extra: Iterable[str] = (), nullable: bool = False
) -> dict[str, Any]:
    """A closed object over ``fields``; names in ``extra`` are admitted as any value."""
    properties: dict[str, Any] = {name: field_schema(fields[name]) for name in sorted(fields)}
    for name in sorted(set(extra) - set(fields)):
        properties[name] = {}
    out: dict[str, Any] = {"type": ["object", "null"] if nullable else "object"}
    out["properties"] = properties
    required = sorted(name for name, spec in fields.items() if spec.required)
    if required:
        out["required"] = required
    out["additionalProperties"] = False
    return out


def field_schema(spec: FieldSpec) -> dict[str, Any]:
    """The schema of one field, recursively through object fields and array items."""
    if spec.type == "object" and spec.fields is not None:
        out = object_schema(spec.fields, nullable=spec.nullable)
    else:
        out = {"type": [spec.type, "null"] if spec.nullable else spec.type}
    for attr, keyword in _CONSTRAINTS:
        value = getattr(spec, attr)
        if value is not None:
            out[keyword] = value
    if spec.enum is not None:
        values = list(spec.enum)
        if spec.nullable and None not in values:
            values.append(None)
        out["enum"] = values
    if spec.type == "array" and spec.items is not None:
        out["items"] = field_schema(spec.items)
    if spec.has_default:
        out["default"] = _plain(spec.default)
    if spec.description:
        out["description"] = spec.description
    if spec.deprecated:
        out["deprecated"] = True
    if spec.unit:
        out["x-accord-unit"] = spec.unit
    if spec.sensitive:
        out["x-accord-sensitive"] = True
    return out


def _plain(value: Any) -> Any:
    """Defaults may arrive as tuples or mappings from a frozen model; emit plain JSON values."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in sorted(value.items())}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
