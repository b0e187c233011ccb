"""Properties of the diff over generated contracts: self-diff is empty, directions mirror, and any
single mutation anywhere in a payload tree is detected at its path."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from accord.contracts.compat import diff
from accord.contracts.model import FieldSpec, FieldType, MessageContract

NAMES = st.sampled_from(["a", "b", "c", "d", "e"])
Path = tuple[str, ...]
Payload = Mapping[str, FieldSpec]
SCALARS: list[FieldType] = ["string", "integer", "number", "boolean"]


@st.composite
def scalars(draw: st.DrawFn) -> FieldSpec:
    kind = draw(st.sampled_from(SCALARS))
    kw: dict[str, Any] = {
        "required": draw(st.booleans()),
        "nullable": draw(st.booleans()),
        "sensitive": draw(st.booleans()),
        "unit": draw(st.none() | st.sampled_from(["px", "mm"])),
        "description": draw(st.none() | st.sampled_from(["one", "Semantic: two"])),
    }
    if kind == "string":
        kw["max_length"] = draw(st.none() | st.integers(1, 40))
        kw["pattern"] = draw(st.none() | st.sampled_from(["^a", "^[0-9]+$"]))
        kw["enum"] = draw(st.none() | st.sampled_from([("x",), ("x", "y")]))
        default: object = draw(st.sampled_from([None, "x"]))
    elif kind in ("integer", "number"):
        kw["minimum"] = draw(st.none() | st.integers(-5, 5))
        kw["maximum"] = draw(st.none() | st.integers(6, 50))
        kw["multiple_of"] = draw(st.none() | st.sampled_from([1, 2, 3]))
        default = draw(st.sampled_from([None, 6, 7]))
    else:
        default = None
    if default is not None:  # None here means "no default declared"
        kw["default"] = default
    return FieldSpec(kind, **kw)


def _containers(children: st.SearchStrategy[FieldSpec]) -> st.SearchStrategy[FieldSpec]:
    objects = st.builds(
        lambda fields, required: FieldSpec("object", required=required, fields=fields),
        st.dictionaries(NAMES, children, max_size=3),
        st.booleans(),
    )
    arrays = st.builds(
        lambda item, required, most: FieldSpec(
            "array", required=required, items=item, max_items=most
        ),
        children,
        st.booleans(),
        st.none() | st.integers(1, 9),
    )
    return objects | arrays


SPECS = st.recursive(scalars(), _containers, max_leaves=6)
PAYLOADS = st.dictionaries(NAMES, SPECS, min_size=1, max_size=4)
OUTCOMES = st.lists(st.sampled_from(["done", "failed", "progress"]), unique=True).map(tuple)


def msg(payload: Payload, version: int, outcomes: tuple[str, ...] = ()) -> MessageContract:
    return MessageContract("m", version, "team", payload, outcomes=outcomes)


@settings(deadline=None)
@given(PAYLOADS, OUTCOMES)
def test_a_contract_never_differs_from_itself(payload: Payload, outcomes: tuple[str, ...]) -> None:
    report = diff(msg(payload, 1, outcomes), msg(dict(payload), 2, outcomes))
    assert report.changes == ()
    assert report.semver_bump() == "none" and report.compatible("full")


@settings(deadline=None)
@given(PAYLOADS, PAYLOADS, OUTCOMES, OUTCOMES)
def test_backward_one_way_is_forward_the_other_way(
    a: Payload, b: Payload, oa: tuple[str, ...], ob: tuple[str, ...]
) -> None:
    ab, ba = diff(msg(a, 1, oa), msg(b, 2, ob)), diff(msg(b, 1, ob), msg(a, 2, oa))
    assert ab.backward_compatible == ba.forward_compatible
    assert ab.forward_compatible == ba.backward_compatible
    # change by change: every verdict pair has its mirror
    assert sorted((c.backward, c.forward) for c in ab.changes) == sorted(
        (c.forward, c.backward) for c in ba.changes
    )


def _paths(payload: Payload, base: Path = ()) -> Iterator[Path]:
    for name, spec in sorted(payload.items()):
        yield (*base, name)
        yield from _inner(spec, (*base, name))


def _inner(spec: FieldSpec, path: Path) -> Iterator[Path]:
    if spec.type == "object":
        yield from _paths(spec.fields or {}, path)
    elif spec.type == "array" and spec.items is not None:
        yield (*path, "[]")
        yield from _inner(spec.items, (*path, "[]"))


def _replace(payload: Payload, path: Path, fn: Callable[[FieldSpec], FieldSpec | None]) -> Payload:
    head, rest = path[0], path[1:]
    out = dict(payload)
    if not rest:
        new = fn(payload[head])
        if new is None:
            del out[head]
        else:
            out[head] = new
        return out
    out[head] = _descend(payload[head], rest, fn)
    return out


def _descend(spec: FieldSpec, rest: Path, fn: Callable[[FieldSpec], FieldSpec | None]) -> FieldSpec:
    if rest[0] == "[]":
        assert spec.items is not None
        item = fn(spec.items) if len(rest) == 1 else _descend(spec.items, rest[1:], fn)
        assert item is not None
        return dataclasses.replace(spec, items=item)
    return dataclasses.replace(spec, fields=_replace(spec.fields or {}, rest, fn))


def _text(path: Path) -> str:
    return "payload" + "".join(seg if seg == "[]" else f".{seg}" for seg in path)


OTHER_TYPE: dict[str, FieldType] = {
    "string": "integer",
    "integer": "boolean",
    "number": "string",
    "boolean": "number",
}
MUTATIONS: dict[str, tuple[Callable[[FieldSpec], FieldSpec | None], set[str]]] = {
    "nullable": (
        lambda s: dataclasses.replace(s, nullable=not s.nullable),
        {"nullable-added", "nullable-removed"},
    ),
    "sensitive": (
        lambda s: dataclasses.replace(s, sensitive=not s.sensitive),
        {"sensitive-added", "sensitive-removed"},
    ),
    "deprecated": (lambda s: dataclasses.replace(s, deprecated=True), {"deprecated-changed"}),
    "description": (
        lambda s: dataclasses.replace(s, description="fresh words"),
        {"description-changed", "meaning-changed"},
    ),
    "unit": (lambda s: dataclasses.replace(s, unit="kg"), {"unit-changed"}),
    "type": (
        lambda s: dataclasses.replace(s, type=OTHER_TYPE.get(s.type, "string")),
        {"type-changed", "type-widened", "type-narrowed"},
    ),
    "required": (
        lambda s: dataclasses.replace(s, required=not s.required),
        {"optional-to-required", "optional-to-required-with-default", "required-to-optional"},
    ),
    "remove": (
        lambda s: None,
        {"field-removed-optional", "field-removed-required", "field-removed-required-with-default"},
    ),
    "add-member": (
        lambda s: dataclasses.replace(
            s, type="object", fields={**(s.fields or {}), "zz": FieldSpec("string")}
        ),
        {"field-added-optional"},
    ),
}


def _limit(spec: FieldSpec) -> FieldSpec:
    if spec.type == "string":
        return dataclasses.replace(spec, max_length=1000)
    if spec.type in ("integer", "number"):
        return dataclasses.replace(spec, maximum=1000)
    if spec.type == "array":
        return dataclasses.replace(spec, max_items=1000)
    if spec.type == "boolean":
        return dataclasses.replace(spec, enum=(True,))
    return dataclasses.replace(spec, min_items=1, type="array", items=FieldSpec("string"))


MUTATIONS["limit"] = (_limit, {"limit-tightened", "limit-relaxed", "type-changed"})
MUTATIONS["default"] = (
    lambda s: dataclasses.replace(s, default="fresh"),
    {"default-changed", "default-added-to-required"},
)
ITEM_SAFE = {"nullable", "sensitive", "deprecated", "description", "unit", "type", "limit"}


@settings(deadline=None)
@given(PAYLOADS, st.data())
def test_every_single_mutation_is_detected_at_its_path(
    payload: Payload, data: st.DataObject
) -> None:
    path = data.draw(st.sampled_from(sorted(_paths(payload))))
    allowed = sorted(ITEM_SAFE if path[-1] == "[]" else MUTATIONS)
    name = data.draw(st.sampled_from(allowed))
    mutate, expected = MUTATIONS[name]
    if name == "add-member" and payload_spec(payload, path).type != "object":
        name, (mutate, expected) = "type", MUTATIONS["type"]
    mutated = _replace(payload, path, mutate)
    report = diff(msg(payload, 1), msg(mutated, 2))
    where = _text(path) + (".zz" if name == "add-member" else "")
    found = {c.code for c in report.changes if c.path == where}
    assert found & expected, (name, where, [c.key for c in report.changes])


def payload_spec(payload: Payload, path: Path) -> FieldSpec:
    spec = payload[path[0]]
    for seg in path[1:]:
        if seg == "[]":
            assert spec.items is not None
            spec = spec.items
        else:
            spec = (spec.fields or {})[seg]
    return spec
