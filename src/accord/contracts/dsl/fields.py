"""Payload fields of the contract DSL: parse, and prove each one is self-consistent.

A field is a mapping such as ``{type: integer, minimum: 64, default: 512, unit: px}``.
The keys a field may carry depend on its ``type``; a known key that does not fit the type (for
example ``maxLength`` on an integer) is ``dsl-constraint-not-applicable``, an unknown key is
``dsl-unknown-key``. Bounds must be ordered, patterns must compile, formats must be known, enum
entries must have the field's type, and every ``default`` and ``enum`` entry must satisfy the
field's own constraints (``dsl-bad-default``). Array ``items`` are fields themselves but cannot be
``required`` or carry a ``default`` (those are properties of a member, not of an element).
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Any, cast

from accord.contracts.dsl.reader import ContractReader, join_path
from accord.contracts.formats import FORMAT_PATTERNS
from accord.contracts.model import FIELD_TYPES, FieldSpec, FieldType
from accord.contracts.values import check_value, type_matches
from accord.contracts.yamlsource import Node

__all__ = ["FIELD_NAME", "parse_fields"]

FIELD_NAME = r"^[a-z][A-Za-z0-9]*$"
_COMMON = frozenset(
    {"type", "required", "nullable", "default", "description", "unit", "sensitive", "deprecated"}
)
_BY_TYPE: dict[str, frozenset[str]] = {
    "string": frozenset({"minLength", "maxLength", "pattern", "format", "enum"}),
    "integer": frozenset(
        {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "enum"}
    ),
    "boolean": frozenset(),
    "object": frozenset({"fields"}),
    "array": frozenset({"items", "minItems", "maxItems"}),
}
_BY_TYPE["number"] = _BY_TYPE["integer"]
_ALL_KEYS = _COMMON.union(*_BY_TYPE.values())
_LENGTHS = {
    "minLength": "min_length",
    "maxLength": "max_length",
    "minItems": "min_items",
    "maxItems": "max_items",
}
_BOUNDS = {
    "minimum": "minimum",
    "maximum": "maximum",
    "exclusiveMinimum": "exclusive_minimum",
    "exclusiveMaximum": "exclusive_maximum",
    "multipleOf": "multiple_of",
}
_CAMEL = {v: k for k, v in {**_LENGTHS, **_BOUNDS}.items()}
_FLAGS = {
    "required": "required",
    "nullable": "nullable",
    "sensitive": "sensitive",
    "deprecated": "deprecated",
}


def parse_fields(reader: ContractReader, node: Node, path: str) -> dict[str, FieldSpec] | None:
    """The fields of a ``payload`` or nested ``fields`` mapping, keyed by field name."""
    if node.kind != "map":
        reader.error(
            "dsl-wrong-type",
            f"{path} must be a mapping of field names to fields",
            node.location,
            path,
        )
        return None
    out: dict[str, FieldSpec] = {}
    for name, child, key_loc in node.entries:
        child_path = join_path(path, name)
        if not re.fullmatch(FIELD_NAME, name):
            reader.error(
                "dsl-bad-field-name",
                f"field name {name!r} must be lowerCamelCase ({FIELD_NAME})",
                key_loc,
                child_path,
            )
        spec = _parse_field(reader, child, child_path, is_item=False)
        if spec is not None:
            out[name] = spec
    return out


def _parse_field(
    reader: ContractReader, node: Node, path: str, *, is_item: bool
) -> FieldSpec | None:
    entries = reader.mapping(node, path, _ALL_KEYS, required=("type",), what=f"field {path}")
    if entries is None or "type" not in entries:
        return None
    type_node = entries["type"]
    ftype = reader.scalar(type_node, join_path(path, "type"), str)
    if ftype is None:
        return None
    if ftype not in FIELD_TYPES:
        reader.error(
            "dsl-bad-field-type",
            f"unknown field type {ftype!r}; expected one of {', '.join(FIELD_TYPES)}",
            type_node.location,
            join_path(path, "type"),
        )
        return None
    ok = True
    kwargs: dict[str, Any] = {}
    for key, value in entries.items():
        key_path = join_path(path, key)
        if key not in _COMMON and key not in _BY_TYPE[ftype]:
            reader.error(
                "dsl-constraint-not-applicable",
                f"{key!r} does not apply to a field of type {ftype}",
                value.location,
                key_path,
            )
            ok = False
        elif is_item and key in ("required", "default"):
            reader.error(
                "dsl-item-annotation",
                f"array items cannot be {key!r}; declare it on the array field",
                value.location,
                key_path,
            )
            ok = False
        elif key == "unit" and ftype not in ("integer", "number"):
            reader.error(
                "dsl-constraint-not-applicable",
                "'unit' applies to numbers only",
                value.location,
                key_path,
            )
            ok = False
        elif not _read_key(reader, ftype, key, value, key_path, kwargs=kwargs):
            ok = False
    if ftype == "array" and "items" not in entries:
        reader.error(
            "dsl-missing-key",
            "an array field needs 'items'",
            node.location,
            join_path(path, "items"),
        )
        ok = False
    if not ok:
        return None
    spec = FieldSpec(type=cast(FieldType, ftype), location=node.location, **kwargs)
    return spec if _consistent(reader, spec, entries, path) else None


def _read_key(
    reader: ContractReader, ftype: str, key: str, node: Node, path: str, *, kwargs: dict[str, Any]
) -> bool:
    if key == "type":
        return True
    if key in _FLAGS:
        value = reader.scalar(node, path, bool)
        kwargs[_FLAGS[key]] = value
    elif key in ("description", "unit", "pattern", "format"):
        value = reader.scalar(node, path, str)
        kwargs[key] = value
    elif key in _LENGTHS:
        value = reader.positive_int(node, path, minimum=0)
        kwargs[_LENGTHS[key]] = value
    elif key in _BOUNDS:
        value = reader.scalar(node, path, int if ftype == "integer" else float)
        kwargs[_BOUNDS[key]] = value
    elif key == "default":
        value = node.plain()
        kwargs["default"] = value
        return True
    elif key == "enum":
        if node.kind != "seq" or not node.items:
            reader.error("dsl-bad-enum", "enum must be a non-empty list", node.location, path)
            return False
        value = tuple(item.plain() for item in node.items)
        kwargs["enum"] = value
    elif key == "fields":
        value = parse_fields(reader, node, path.removesuffix(".fields"))
        kwargs["fields"] = MappingProxyType(value) if value is not None else None
    else:  # items
        value = _parse_field(reader, node, path.removesuffix(".items") + "[]", is_item=True)
        kwargs["items"] = value
    return value is not None


def _consistent(
    reader: ContractReader, spec: FieldSpec, entries: dict[str, Node], path: str
) -> bool:
    """Cross-key rules of one field; every violation is reported."""
    errors: list[tuple[str, str, str]] = []  # code, message, key
    for low, high in (
        ("min_length", "max_length"),
        ("min_items", "max_items"),
        ("minimum", "maximum"),
    ):
        lo, hi = getattr(spec, low), getattr(spec, high)
        if lo is not None and hi is not None and lo > hi:
            message = f"{_CAMEL[low]} {lo} exceeds {_CAMEL[high]} {hi}"
            errors.append(("dsl-bad-constraint", message, high))
    if spec.multiple_of is not None and spec.multiple_of <= 0:
        errors.append(("dsl-bad-constraint", "multipleOf must be positive", "multiple_of"))
    if spec.pattern is not None:
        try:
            re.compile(spec.pattern)
        except re.error as exc:
            errors.append(("dsl-bad-pattern", f"pattern does not compile: {exc}", "pattern"))
    if spec.format is not None and spec.format not in FORMAT_PATTERNS:
        known = ", ".join(sorted(FORMAT_PATTERNS))
        errors.append(
            ("dsl-unknown-format", f"unknown format {spec.format!r}; known: {known}", "format")
        )
    if spec.enum is not None:
        if len(set(map(repr, spec.enum))) != len(spec.enum):
            errors.append(("dsl-bad-enum", "enum entries must be unique", "enum"))
        bare = FieldSpec(
            type=spec.type,
            min_length=spec.min_length,
            max_length=spec.max_length,
            pattern=spec.pattern if not errors else None,
            minimum=spec.minimum,
            maximum=spec.maximum,
        )
        for item in spec.enum:
            if not type_matches(spec.type, item):
                errors.append(("dsl-bad-enum", f"enum entry {item!r} is not a {spec.type}", "enum"))
            elif problems := check_value(bare, item, "enum"):
                errors.append(("dsl-bad-enum", "; ".join(problems), "enum"))
    if spec.deprecated and spec.required and not spec.has_default:
        errors.append(
            (
                "dsl-deprecated-required",
                "a deprecated field cannot be required without a default",
                "deprecated",
            )
        )
    if spec.has_default and not any(e[0] == "dsl-bad-pattern" for e in errors):
        for problem in check_value(spec, spec.default, "default"):
            errors.append(
                ("dsl-bad-default", f"default does not satisfy its field: {problem}", "default")
            )
    for code, message, key in errors:
        dsl_key = _CAMEL.get(key, key)
        where = entries.get(dsl_key)
        reader.error(
            code, message, where.location if where else spec.location, join_path(path, dsl_key)
        )
    return not errors
