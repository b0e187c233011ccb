"""Completion guarantees: a binding or decision reads only stages finished on every path."""

from __future__ import annotations

from typing import Any

import pytest

from accord.contracts.catalog import Catalog


def _task(name: str, on_success: str, on_failure: str = "failed", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "type": "worker",
        "worker": "work.a@1",
        "queue": "q-a",
        "input": {"id": "x", **extra},
        "on_success": on_success,
        "on_failure": on_failure,
    }


def _decision(name: str, when: str, yes: str, no: str) -> dict[str, Any]:
    return {
        "name": name,
        "type": "decision",
        "on_evaluation_error": "failed",
        "branches": [{"when": when, "next": yes}, {"when": "true", "next": no}],
    }


def _doc(*stages: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "d",
        "version": "1",
        "entry": stages[0]["name"],
        "stages": list(stages),
        "terminals": ["completed", "failed"],
    }


def _codes(doc: dict[str, Any], catalog: Catalog) -> list[str]:
    from accord.workflow.compiler import compile_definition

    return [d.code for d in compile_definition(doc, catalog).errors]


READ_A = '${stages["a"].result.nested.x}'


@pytest.mark.parametrize(
    ("stages", "codes"),
    [
        # a → b reads a: a completed on the only path
        ((_task("a", "b"), _task("b", "completed", count=READ_A)), []),
        # a's failure also reaches b: a may not have completed
        (
            (_task("a", "b", "b"), _task("b", "completed", count=READ_A)),
            ["type-binding-not-completed"],
        ),
        # a decision may skip a: not completed on the skipping path
        (
            (
                _decision("d", "context.n > 1", "a", "b"),
                _task("a", "b"),
                _task("b", "completed", count=READ_A),
            ),
            ["type-binding-not-completed"],
        ),
        # a state read needs the stage to have *run*; success or failure both count
        (
            (
                _task("a", "d", "d"),
                _decision("d", 'stages["a"].state == "failed"', "completed", "completed"),
            ),
            [],
        ),
        (
            (
                _task("a", "d", "d"),
                _decision("d", 'stages["a"].result.ok', "completed", "completed"),
            ),
            ["type-expression-not-completed"],
        ),
        (
            (_decision("d", 'stages["a"].state == "x"', "a", "a"), _task("a", "completed")),
            ["type-expression-not-completed"],
        ),
        # optional result fields need has(); required ones do not
        (
            (
                _task("a", "d"),
                _decision("d", 'stages["a"].result.label == "x"', "completed", "completed"),
            ),
            ["type-expression-unguarded-optional"],
        ),
        (
            (
                _task("a", "d"),
                _decision(
                    "d",
                    'has(stages["a"].result.label) && stages["a"].result.label == "x"',
                    "completed",
                    "completed",
                ),
            ),
            [],
        ),
        (
            (
                _task("a", "d"),
                _decision("d", "stages['a'].result.nested.x > 2", "completed", "completed"),
            ),
            [],
        ),
    ],
)
def test_guarantees(
    stages: tuple[dict[str, Any], ...], codes: list[str], synthetic: Catalog
) -> None:
    assert _codes(_doc(*stages), synthetic) == codes


def test_results_of_every_branch_are_available_after_a_strict_join(synthetic: Catalog) -> None:
    doc = _doc(
        {"name": "f", "type": "fork", "branches": ["a", "b"]},
        _task("a", "j"),
        _task("b", "j"),
        {
            "name": "j",
            "type": "join",
            "required": ["a", "b"],
            "on_success": "c",
            "on_failure": "failed",
        },
        _task("c", "completed", count=READ_A),
    )
    assert _codes(doc, synthetic) == []
    doc["stages"][3]["acceptable_terminal_states"] = ["completed", "failed"]
    doc["stages"][1]["on_failure"] = "j"
    assert _codes(doc, synthetic) == ["type-binding-not-completed"]
    doc["stages"][3]["acceptable_terminal_states"] = ["completed"]
    doc["stages"][4]["input"]["count"] = '${stages["b"].result.nested.x}'
    assert _codes(doc, synthetic) == []
