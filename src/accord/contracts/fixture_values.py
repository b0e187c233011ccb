"""Example values for golden fixtures: one valid value per field, and values that break a rule.

:func:`example` picks a deterministic value inside every declared constraint: an enum member, a
string synthesised from the field's ``pattern`` (shortest match, by walking the parsed regular
expression), a fixed sample per known ``format``, a number inside its bounds and on its
``multipleOf``. :func:`violations_of` lists ``(kind, bad value, path suffix)`` for every rule the
field declares, each value chosen to break exactly that rule at a known path.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Mapping
from typing import Any

from accord.contracts.formats import FORMAT_PATTERNS
from accord.contracts.model import FieldSpec

# the stdlib's own regex parser (private, unstubbed): exact, and no new dependency
_sre: Any = importlib.import_module("re._parser")

__all__ = ["example", "message_of", "value_of", "violations_of"]

_FORMAT_EXAMPLES = {
    "date": "2026-01-31",
    "date-time": "2026-01-31T12:30:00Z",
    "digest": "sha256:" + "0" * 64,
    "duration-ms": "1500",
    "object-key": "models/example/model.stl",
    "uri": "https://example.invalid/model",
    "uuid": "123e4567-e89b-12d3-a456-426614174000",
}
_FORMAT_BREAKERS = {
    "date": "2026-13-45",
    "date-time": "yesterday at noon",
    "digest": "sha256:xyz",
    "duration-ms": "-5",
    "object-key": "../outside/bucket",
    "uri": "no scheme here",
    "uuid": "not-a-uuid",
}
_PATTERN_BREAKERS = ("", "!", " bad value ", "é" * 3, "x" * 300)


def _from_regex(pattern: str) -> str:
    return "".join(_emit(_sre.parse(pattern).data))


def _emit(items: Any) -> list[str]:
    out: list[str] = []
    for op, arg in items:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(arg))
        elif name == "IN":
            out.append(_first_of(arg))
        elif name == "ANY":
            out.append("a")
        elif name in {"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"}:
            low, _high, body = arg
            out.extend(_emit(body) * max(low, 0))
        elif name == "SUBPATTERN":
            out.extend(_emit(arg[-1]))
        elif name == "BRANCH":
            out.extend(_emit(arg[1][0]))
        elif name in {"AT", "ASSERT", "ASSERT_NOT"}:
            continue
        else:
            raise ValueError(f"cannot synthesise an example for regex element {name}")
    return out


def _first_of(members: Any) -> str:
    for op, arg in members:
        name = str(op)
        if name == "LITERAL":
            return chr(arg)
        if name == "RANGE":
            return chr(arg[0])
        if name == "CATEGORY":
            return {"CATEGORY_DIGIT": "0", "CATEGORY_SPACE": " "}.get(str(arg), "a")
    raise ValueError("cannot synthesise a character for a negated class")


def _string(spec: FieldSpec) -> str:
    if spec.format in _FORMAT_EXAMPLES:
        return _FORMAT_EXAMPLES[spec.format]
    if spec.pattern is not None:
        value = _from_regex(spec.pattern)
        if len(value) < (spec.min_length or 0):
            raise ValueError(f"pattern {spec.pattern!r} example is shorter than minLength")
        return value
    low, high = spec.min_length or 0, spec.max_length
    if high is None or high >= 7:
        return "example" + "x" * max(low - 7, 0)
    return "x" * max(low, min(high, 1))


def _number(spec: FieldSpec) -> int | float:
    low = spec.minimum
    if spec.exclusive_minimum is not None:
        low = spec.exclusive_minimum + (1 if spec.type == "integer" else 0.5)
    high = spec.maximum
    if spec.exclusive_maximum is not None:
        high = spec.exclusive_maximum - (1 if spec.type == "integer" else 0.5)
    if low is None and high is None:
        value: float = 1
    elif low is None:
        value = high if high is not None and high < 1 else 1
    elif high is None:
        value = low
    else:
        value = low if spec.type == "integer" else (low + high) / 2
        if spec.type == "number" and float(low).is_integer():
            value = low
    step = spec.multiple_of
    if step:
        value = math.ceil(value / step) * step
    if spec.type == "integer" or float(value).is_integer():
        return int(value)
    return value


def example(spec: FieldSpec) -> Any:
    """A valid scalar (or empty container) for ``spec``."""
    if spec.enum is not None:
        return next(v for v in spec.enum if v is not None)
    if spec.type == "string":
        return _string(spec)
    if spec.type in {"integer", "number"}:
        return _number(spec)
    if spec.type == "boolean":
        return True
    if spec.type == "object":
        return {"anything": [1, "two", None]}
    return []


def message_of(fields: Mapping[str, FieldSpec], *, full: bool) -> dict[str, Any]:
    """A valid object: every field (``full``) or only required fields without a default."""
    return {
        name: value_of(spec, full=full)
        for name, spec in sorted(fields.items())
        if full or (spec.required and not spec.has_default)
    }


def value_of(spec: FieldSpec, *, full: bool) -> Any:
    """A valid value for ``spec``, recursing into object fields and array items."""
    if spec.type == "object" and spec.fields is not None:
        return message_of(spec.fields, full=full)
    if spec.type == "array" and spec.items is not None:
        count = max(spec.min_items or 0, 1)
        if spec.max_items is not None:
            count = min(count, spec.max_items)
        return [value_of(spec.items, full=full) for _ in range(count)]
    return example(spec)


def violations_of(spec: FieldSpec) -> list[tuple[str, Any, str]]:
    """``(kind, value, suffix)``: ``value`` breaks one rule; the failure is at path + suffix."""
    out: list[tuple[str, Any, str]] = []
    if spec.enum is not None:
        strings = all(isinstance(v, str) for v in spec.enum if v is not None)
        out.append(("enum", "zzz-not-a-member" if strings else 987654321, ""))
    if spec.type == "string":
        if spec.max_length is not None:
            out.append(("too-long", "x" * (spec.max_length + 1), ""))
        if spec.min_length:
            out.append(("too-short", "x" * (spec.min_length - 1), ""))
        if spec.pattern is not None:
            bad = next(s for s in _PATTERN_BREAKERS if not re.search(spec.pattern, s))
            out.append(("pattern", bad, ""))
        if spec.format is not None and spec.format in FORMAT_PATTERNS:
            out.append(("format", _FORMAT_BREAKERS[spec.format], ""))
    if spec.type in {"integer", "number"}:
        if spec.minimum is not None:
            out.append(("too-small", spec.minimum - 1, ""))
        if spec.exclusive_minimum is not None:
            out.append(("too-small-exclusive", spec.exclusive_minimum, ""))
        if spec.maximum is not None:
            out.append(("too-large", spec.maximum + 1, ""))
        if spec.exclusive_maximum is not None:
            out.append(("too-large-exclusive", spec.exclusive_maximum, ""))
        if spec.type == "integer":
            out.append(("fraction", 1.5, ""))
    if spec.type == "array" and spec.items is not None:
        item = value_of(spec.items, full=True)
        if spec.max_items is not None:
            out.append(("too-many-items", [item] * (spec.max_items + 1), ""))
        if spec.min_items:
            out.append(("too-few-items", [item] * (spec.min_items - 1), ""))
        wrong = {"string": 7, "object": "not an object"}.get(spec.items.type, "not valid")
        out.append(("item-type", [item, wrong], "[1]"))
    return out
