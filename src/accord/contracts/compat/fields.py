"""Field-by-field comparison of two payloads, recursive through objects and array items.

Paths start at ``payload``; members are joined with ``.`` and array items are ``[]``, so a field
inside the items of ``views`` is ``payload.views[].angle``. At each object the walk first pairs
removed and added members of the same *shape* (type, requiredness, nullability and nested shape,
ignoring annotations and limits) as rename candidates: a closed reader cannot tell a rename from
a removal plus an addition, so a candidate is classed as breaking (row 17) rather than as two
milder changes that would each pass a tolerant reader. A member present on both sides is compared
for type, presence (required/default), nullability, limits and annotations; limits are compared
only when the types agree (or are both numeric), and a type change stops the descent.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from accord.contracts.compat.rules import Change, is_semantic, make, value_key
from accord.contracts.model import FieldSpec

__all__ = ["payload_changes"]

_UPPER = (
    ("max_length", "maxLength"),
    ("maximum", "maximum"),
    ("exclusive_maximum", "exclusiveMaximum"),
    ("max_items", "maxItems"),
)
_LOWER = (
    ("min_length", "minLength"),
    ("minimum", "minimum"),
    ("exclusive_minimum", "exclusiveMinimum"),
    ("min_items", "minItems"),
)
_NUMERIC = frozenset({"integer", "number"})


def payload_changes(
    old: Mapping[str, FieldSpec], new: Mapping[str, FieldSpec], base: str = "payload"
) -> list[Change]:
    out: list[Change] = []
    removed = sorted(set(old) - set(new))
    added = sorted(set(new) - set(old))
    renamed: dict[str, str] = {}
    for name in removed:
        for candidate in added:
            if candidate not in renamed.values() and _shape(old[name]) == _shape(new[candidate]):
                renamed[name] = candidate
                break
    for name, target in renamed.items():
        was = f"{base}.{name}"
        out.append(
            make(
                "field-renamed",
                f"{base}.{target}",
                f"'{was}' removed and '{base}.{target}' added with the same shape: a rename "
                "candidate, breaking for every reader",
                was,
                location=new[target].location,
            )
        )
    for name in removed:
        if name not in renamed:
            out.append(_removed(old[name], f"{base}.{name}"))
    for name in added:
        if name not in renamed.values():
            out.append(_added(new[name], f"{base}.{name}"))
    for name in sorted(set(old) & set(new)):
        out.extend(_field(old[name], new[name], f"{base}.{name}", item=False))
    return out


def _shape(spec: FieldSpec) -> object:
    nested = tuple((k, _shape(v)) for k, v in sorted((spec.fields or {}).items()))
    items = _shape(spec.items) if spec.items is not None else None
    return (spec.type, spec.required, spec.nullable, nested, items)


def _presence_kind(spec: FieldSpec) -> str:
    if not spec.required:
        return "optional"
    return "required-with-default" if spec.has_default else "required"


def _added(spec: FieldSpec, path: str) -> Change:
    kind = _presence_kind(spec)
    message = f"{kind.replace('-', ' ')} field '{path}' added"
    return make(f"field-added-{kind}", path, message, location=spec.location)


def _removed(spec: FieldSpec, path: str) -> Change:
    kind = _presence_kind(spec)
    return make(f"field-removed-{kind}", path, f"{kind.replace('-', ' ')} field '{path}' removed")


def _at(spec: FieldSpec) -> dict[str, Any]:
    return {"location": spec.location}


def _field(f: FieldSpec, g: FieldSpec, path: str, *, item: bool) -> list[Change]:
    out: list[Change] = []
    at = _at(g)
    if f.type != g.type:
        code = {("integer", "number"): "type-widened", ("number", "integer"): "type-narrowed"}.get(
            (f.type, g.type), "type-changed"
        )
        out.append(make(code, path, f"type of '{path}' {f.type} -> {g.type}", **at))
    if not item:
        out.extend(_presence(f, g, path))
    if f.nullable != g.nullable:
        code = "nullable-added" if g.nullable else "nullable-removed"
        out.append(make(code, path, f"'{path}' {'now' if g.nullable else 'no longer'} nullable"))
    if f.unit != g.unit:
        out.append(make("unit-changed", path, f"unit of '{path}' {f.unit} -> {g.unit}", **at))
    if f.description != g.description:
        semantic = is_semantic(f.description) or is_semantic(g.description)
        code = "meaning-changed" if semantic else "description-changed"
        out.append(make(code, path, f"description of '{path}' changed", **at))
    if f.sensitive != g.sensitive:
        code = "sensitive-added" if g.sensitive else "sensitive-removed"
        out.append(make(code, path, f"'{path}' {'now' if g.sensitive else 'no longer'} sensitive"))
    if f.deprecated != g.deprecated:
        what = "deprecated" if g.deprecated else "no longer deprecated"
        out.append(make("deprecated-changed", path, f"'{path}' {what}", **at))
    if f.type == g.type or {f.type, g.type} <= _NUMERIC:
        out.extend(_limits(f, g, path))
    if f.type == g.type == "object":
        out.extend(payload_changes(f.fields or {}, g.fields or {}, path))
    elif f.type == g.type == "array":
        if f.items is not None and g.items is not None:
            out.extend(_field(f.items, g.items, f"{path}[]", item=True))
        elif f.items is not g.items:
            out.append(make("type-changed", f"{path}[]", f"item type of '{path}' changed", **at))
    return out


def _presence(f: FieldSpec, g: FieldSpec, path: str) -> list[Change]:
    """Requiredness and default: what a reader does when the field is missing."""
    out: list[Change] = []
    at = _at(g)
    default_differs = f.has_default != g.has_default or (
        f.has_default and value_key(f.default) != value_key(g.default)
    )
    if f.required != g.required:
        if g.required:
            code = "optional-to-required-with-default" if g.has_default else "optional-to-required"
            out.append(make(code, path, f"'{path}' optional -> required", **at))
        else:
            # an old reader supplies its own default when the new producer omits the field
            out.append(
                make(
                    "required-to-optional",
                    path,
                    f"'{path}' required -> optional",
                    forward=f.has_default,
                    **at,
                )
            )
    elif default_differs and f.required and not f.has_default:
        out.append(make("default-added-to-required", path, f"required '{path}' gains a default"))
        return out
    elif default_differs and f.required and not g.has_default:
        out.append(
            make("default-removed-from-required", path, f"required '{path}' loses its default")
        )
        return out
    if default_differs:
        old = value_key(f.default) if f.has_default else "none"
        new = value_key(g.default) if g.has_default else "none"
        out.append(
            make("default-changed", path, f"default of '{path}' changed", f"{old} -> {new}", **at)
        )
    return out


def _limits(f: FieldSpec, g: FieldSpec, path: str) -> list[Change]:
    out: list[Change] = []
    at = _at(g)
    for attr, name in (*_UPPER, *_LOWER):
        a, b = getattr(f, attr), getattr(g, attr)
        if a == b:
            continue
        upper = (attr, name) in _UPPER
        tighter = b is not None and (a is None or (b < a if upper else b > a))
        code = "limit-tightened" if tighter else "limit-relaxed"
        out.append(make(code, path, f"{name} of '{path}' {a} -> {b}", f"{name} {a} -> {b}", **at))
    a, b = f.multiple_of, g.multiple_of
    if a != b:
        if a is None or b is None:
            code = "limit-tightened" if a is None else "limit-relaxed"
        elif _divides(a, b):
            code = "limit-tightened"
        else:
            code = "limit-relaxed" if _divides(b, a) else "limit-changed"
        out.append(make(code, path, f"multipleOf of '{path}' {a} -> {b}", f"multipleOf {a} -> {b}"))
    for attr, name in (("pattern", "pattern"), ("format", "format")):
        a, b = getattr(f, attr), getattr(g, attr)
        if a != b:
            code = f"{name}-added" if a is None else f"{name}-removed" if b is None else ""
            code = code or f"{name}-changed"
            out.append(make(code, path, f"{name} of '{path}' {a!r} -> {b!r}", name, **at))
    out.extend(_enum(f, g, path))
    return out


def _divides(small: float, big: float) -> bool:
    """Every multiple of ``big`` is a multiple of ``small`` (exact, no float drift)."""
    ratio = Fraction(str(big)) / Fraction(str(small)) if small else Fraction(1, 3)
    return ratio.denominator == 1


def _enum(f: FieldSpec, g: FieldSpec, path: str) -> list[Change]:
    if f.enum is None and g.enum is None:
        return []
    if f.enum is None or g.enum is None:
        code = "limit-tightened" if f.enum is None else "limit-relaxed"
        what = "enum added" if f.enum is None else "enum removed"
        return [make(code, path, f"{what} on '{path}'", what, **_at(g))]
    old = {value_key(v) for v in f.enum}
    new = {value_key(v) for v in g.enum}
    out = [
        make("enum-value-added", path, f"enum value {v} added to '{path}'", v, **_at(g))
        for v in sorted(new - old)
    ]
    out += [
        make("enum-value-removed", path, f"enum value {v} removed from '{path}'", v, **_at(g))
        for v in sorted(old - new)
    ]
    return out
