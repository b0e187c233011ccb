"""Bindings: parsing (whole-string only, one canonical spelling) and the pure resolver."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accord.workflow.bindings import (
    BindingError,
    find_bindings,
    parse_binding,
    parse_input,
    resolve_inputs,
)
from accord.workflow.plan import Binding


@pytest.mark.parametrize(
    ("text", "source", "stage", "path"),
    [
        ("${context.modelId}", "context", None, ("modelId",)),
        ("${ context.a.b }", "context", None, ("a", "b")),
        ('${context["odd-key"].x}', "context", None, ("odd-key", "x")),
        ('${stages["cache-lookup"].result.hit}', "stage", "cache-lookup", ("hit",)),
        ("${stages.render.result.previews}", "stage", "render", ("previews",)),
        ("${stages['s'].result}", "stage", "s", ()),
    ],
)
def test_parses_bindings(text: str, source: str, stage: str | None, path: tuple[str, ...]) -> None:
    b = parse_binding(text)
    assert (b.source, b.stage, b.path) == (source, stage, path)


def test_equal_bindings_have_one_spelling() -> None:
    a = parse_binding('${stages["s"].result["x"]}')
    b = parse_binding("${stages.s.result.x}")
    assert a == b
    assert a.raw == '${stages["s"].result.x}'


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("model-${context.modelId}", "binding-interpolation"),
        ("${context.a}${context.b}", "binding-interpolation"),
        ("${ctx.modelId}", "binding-syntax"),
        ("${stages.s.output.x}", "binding-syntax"),
        ("${context..a}", "binding-syntax"),
        ("${stages}", "binding-syntax"),
    ],
)
def test_refuses_malformed_bindings(text: str, code: str) -> None:
    with pytest.raises(BindingError) as err:
        parse_input(text)
    assert err.value.code == code


def test_escaped_dollar_is_a_literal() -> None:
    assert parse_input("cost $${context.x}") == "cost ${context.x}"


def test_resolves_nested_inputs() -> None:
    raw = {
        "id": "${context.id}",
        "opts": {"n": "${stages.a.result.n}", "list": ["${context.id}", 3]},
    }
    inputs = {k: parse_input(v) for k, v in raw.items()}
    out = resolve_inputs(inputs, {"id": "m1"}, {"a": {"n": 4}})
    assert out == {"id": "m1", "opts": {"n": 4, "list": ["m1", 3]}}
    assert len(find_bindings(inputs)) == 3


@pytest.mark.parametrize(
    ("binding", "context", "results", "code", "path"),
    [
        (Binding("context", ("a",)), {}, {}, "binding-missing", "x"),
        (Binding("stage", ("a",), "s"), {}, {}, "binding-missing", "x"),
        (Binding("stage", ("a", "b"), "s"), {}, {"s": {"a": {}}}, "binding-missing", "x"),
        (Binding("context", ("a",)), {"a": None}, {}, "binding-null", "x"),
        (Binding("context", ("a", "b")), {"a": None}, {}, "binding-null", "x"),
        (Binding("context", ("a", "b")), {"a": 3}, {}, "binding-type", "x"),
        (Binding("context", ("a",), expected_type="integer"), {"a": True}, {}, "binding-type", "x"),
        (Binding("context", ("a",), expected_type="string"), {"a": 1}, {}, "binding-type", "x"),
        (Binding("context", ("a",), expected_type="object"), {"a": []}, {}, "binding-type", "x"),
    ],
)
def test_three_distinct_resolution_errors(
    binding: Binding, context: dict[str, Any], results: dict[str, Any], code: str, path: str
) -> None:
    with pytest.raises(BindingError) as err:
        resolve_inputs({"x": binding}, context, results)
    assert (err.value.code, err.value.path) == (code, path)


def test_number_accepts_integers_but_integer_rejects_floats() -> None:
    number = Binding("context", ("a",), expected_type="number")
    integer = Binding("context", ("a",), expected_type="integer")
    assert resolve_inputs({"x": number}, {"a": 3}, {}) == {"x": 3}
    with pytest.raises(BindingError):
        resolve_inputs({"x": integer}, {"a": 3.5}, {})


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet="abc ", max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("xyz"), inner),
    max_leaves=8,
)


@given(_json)
def test_literals_resolve_to_themselves(value: Any) -> None:
    assert resolve_inputs({"v": parse_input(value)}, {}, {}) == {"v": value}


@given(st.dictionaries(st.sampled_from(["a", "b", "c"]), _json, min_size=1))
def test_context_bindings_read_exactly_the_value(context: dict[str, Any]) -> None:
    inputs = {k: parse_binding(f"${{context.{k}}}") for k in context}
    nulls = [k for k, v in context.items() if v is None]
    if nulls:
        with pytest.raises(BindingError) as err:
            resolve_inputs(inputs, context, {})
        assert err.value.code == "binding-null"
    else:
        assert resolve_inputs(inputs, context, {}) == context
