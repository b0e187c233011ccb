"""Decision expressions: compile once, bounded cost, bool-only, run-time errors as one code."""

from __future__ import annotations

from types import MappingProxyType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accord.workflow.expressions import (
    MAX_SOURCE_CHARS,
    ExpressionError,
    compile_expression,
    evaluate,
)

STAGES = {"cache-lookup": {"result": {"hit": True, "n": 3}, "state": "completed"}}


def test_compiles_once_and_reports_what_it_reads() -> None:
    source = 'stages["cache-lookup"].result.hit == true && has(context.a.b)'
    first = compile_expression(source)
    assert compile_expression(source) is first
    assert first.return_type == "bool"
    assert first.stages == ("cache-lookup",)
    kinds = {(r.source, r.path, r.kind) for r in first.references}
    assert kinds == {("stage", ("hit",), "read"), ("context", ("a", "b"), "has")}


def test_evaluates_against_context_and_stages() -> None:
    assert evaluate('stages["cache-lookup"].result.hit == true', {}, STAGES) is True
    assert evaluate("context.n > 5", {"n": 3}, {}) is False
    frozen = MappingProxyType({"s": MappingProxyType({"result": MappingProxyType({"ok": True})})})
    assert evaluate("stages.s.result.ok", MappingProxyType({}), frozen) is True


@pytest.mark.parametrize(
    ("source", "code"),
    [
        ("1 +", "expression-syntax"),
        ("stages[", "expression-syntax"),
        ("1 + 2", "expression-type"),
        ("'a'", "expression-type"),
        ("[1, 2].all(x, x > 0)", "expression-comprehension"),
        ("[1].exists(x, x == 1)", "expression-comprehension"),
        ("true&&" * 130 + "true", "expression-too-costly"),
        ("x" * (MAX_SOURCE_CHARS + 1), "expression-too-large"),
        ("a # b", "expression-syntax"),
        ("stages[context.name].result.ok", "expression-dynamic-reference"),
        ('"a" in stages', "expression-dynamic-reference"),
    ],
)
def test_refuses_at_compile_time(source: str, code: str) -> None:
    with pytest.raises(ExpressionError) as err:
        compile_expression(source)
    assert err.value.code == code


@pytest.mark.parametrize(
    ("source", "context", "stages"),
    [
        ('stages["missing"].result.hit', {}, STAGES),
        ('stages["cache-lookup"].result.nope == 1', {}, STAGES),
        ('stages["cache-lookup"].result.n', {}, STAGES),  # an int, not a bool
        ("context.a > 1", {"a": "text"}, {}),
        ("context.f", {"f": object()}, {}),
    ],
)
def test_runtime_failures_are_evaluation_errors(
    source: str, context: dict[str, object], stages: dict[str, object]
) -> None:
    with pytest.raises(ExpressionError) as err:
        evaluate(source, context, stages)  # type: ignore[arg-type]
    assert err.value.code == "evaluation-error"


def test_has_guards_optional_reads() -> None:
    source = 'has(stages["s"].result.x) && stages["s"].result.x == 1'
    assert evaluate(source, {}, {"s": {"result": {}}}) is False
    assert evaluate(source, {}, {"s": {"result": {"x": 1}}}) is True


@given(st.integers(-1000, 1000), st.integers(-1000, 1000))
def test_comparison_agrees_with_python(a: int, b: int) -> None:
    assert evaluate("context.a < context.b", {"a": a, "b": b}, {}) is (a < b)
    assert evaluate("context.a == context.b || context.a != context.b", {"a": a, "b": b}, {})


@given(st.text(max_size=40))
def test_compile_never_crashes(source: str) -> None:
    try:
        compiled = compile_expression(source)
    except ExpressionError as exc:
        assert exc.code.startswith("expression-")
    else:
        assert compiled.return_type in ("bool", "dyn")
