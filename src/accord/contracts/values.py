"""Check one plain value against a :class:`~accord.contracts.model.FieldSpec`.

Used by the linter to prove that every ``default`` and ``enum`` entry satisfies the constraints of
its own field (a default that fails its own contract would be applied and then rejected). It is a
small, exact reading of the DSL rules — not the runtime validator, which is compiled from the
JSON Schema export and is far faster — so it only has to be obviously right.
"""

from __future__ import annotations

import math
import re
from typing import Any

from accord.contracts.formats import FORMAT_PATTERNS
from accord.contracts.model import FieldSpec

__all__ = ["check_value", "type_matches"]


def type_matches(field_type: str, value: Any) -> bool:
    """Whether ``value`` has the JSON type ``field_type`` (``1.0`` counts as an integer)."""
    if isinstance(value, bool):
        return field_type == "boolean"
    if field_type == "string":
        return isinstance(value, str)
    if field_type == "integer":
        return isinstance(value, int) or (
            isinstance(value, float) and math.isfinite(value) and value.is_integer()
        )
    if field_type == "number":
        return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
    if field_type == "object":
        return isinstance(value, dict)
    if field_type == "array":
        return isinstance(value, list)
    return False


def check_value(spec: FieldSpec, value: Any, path: str = "$") -> list[str]:
    """Every way ``value`` violates ``spec``, as ``"path: reason"`` strings (empty when valid)."""
    if value is None:
        return [] if spec.nullable else [f"{path}: null is not allowed (field is not nullable)"]
    if not type_matches(spec.type, value):
        return [f"{path}: expected {spec.type}, got {type(value).__name__}"]
    problems: list[str] = []
    if spec.enum is not None and value not in spec.enum:
        problems.append(f"{path}: {value!r} is not one of {list(spec.enum)}")
    if isinstance(value, str):
        problems += _string(spec, value, path)
    elif isinstance(value, int | float):
        problems += _number(spec, value, path)
    elif isinstance(value, list):
        if spec.min_items is not None and len(value) < spec.min_items:
            problems.append(f"{path}: fewer than {spec.min_items} items")
        if spec.max_items is not None and len(value) > spec.max_items:
            problems.append(f"{path}: more than {spec.max_items} items")
        if spec.items is not None:
            for index, item in enumerate(value):
                problems += check_value(spec.items, item, f"{path}[{index}]")
    elif isinstance(value, dict) and spec.fields is not None:
        for key in value:
            if key not in spec.fields:
                problems.append(f"{path}.{key}: unknown field")
        for name, child in spec.fields.items():
            if name in value:
                problems += check_value(child, value[name], f"{path}.{name}")
            elif child.required and not child.has_default:
                problems.append(f"{path}.{name}: required field is missing")
    return problems


def _string(spec: FieldSpec, value: str, path: str) -> list[str]:
    problems = []
    if spec.min_length is not None and len(value) < spec.min_length:
        problems.append(f"{path}: shorter than {spec.min_length} characters")
    if spec.max_length is not None and len(value) > spec.max_length:
        problems.append(f"{path}: longer than {spec.max_length} characters")
    if spec.pattern is not None and re.search(spec.pattern, value) is None:
        problems.append(f"{path}: does not match pattern {spec.pattern!r}")
    known = FORMAT_PATTERNS.get(spec.format or "")
    if known is not None and re.fullmatch(known, value) is None:
        problems.append(f"{path}: is not a valid {spec.format}")
    return problems


def _number(spec: FieldSpec, value: float, path: str) -> list[str]:
    problems = []
    if spec.minimum is not None and value < spec.minimum:
        problems.append(f"{path}: below the minimum {spec.minimum}")
    if spec.maximum is not None and value > spec.maximum:
        problems.append(f"{path}: above the maximum {spec.maximum}")
    if spec.exclusive_minimum is not None and value <= spec.exclusive_minimum:
        problems.append(f"{path}: not above {spec.exclusive_minimum}")
    if spec.exclusive_maximum is not None and value >= spec.exclusive_maximum:
        problems.append(f"{path}: not below {spec.exclusive_maximum}")
    if spec.multiple_of is not None:
        quotient = value / spec.multiple_of
        if not math.isclose(quotient, round(quotient), rel_tol=0, abs_tol=1e-9):
            problems.append(f"{path}: not a multiple of {spec.multiple_of}")
    return problems
