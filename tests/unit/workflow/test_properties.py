"""Properties over generated valid workflows: determinism, cosmetic invariance, sensitivity to
semantic change, and every rule-breaking mutation caught with its code."""

from __future__ import annotations

import copy
import io
import json
import random
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from accord.contracts.catalog import Catalog
from accord.testing.strategies import synthetic_catalog, valid_workflows
from accord.workflow.compiler import compile_definition, compile_workflow
from accord.workflow.plan import Plan

CATALOG: Catalog = synthetic_catalog()
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _yaml(doc: Any, flow: bool) -> str:
    out = io.StringIO()
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = flow
    yaml.width = 100_000  # one line per scalar, so a trailing comment never splits one
    yaml.dump(doc, out)
    return out.getvalue()


def _shuffled(value: Any, rnd: random.Random) -> Any:
    if isinstance(value, dict):
        keys = list(value)
        rnd.shuffle(keys)
        return {k: _shuffled(value[k], rnd) for k in keys}
    if isinstance(value, list):
        return [_shuffled(v, rnd) for v in value]
    return value


def _commented(text: str) -> str:
    lines = ["# generated definition", *text.splitlines()]
    return (
        "\n".join(f"{ln}  # note" if ln.strip() and not ln.startswith("#") else ln for ln in lines)
        + "\n"
    )


def _plan(doc: dict[str, Any]) -> Plan:
    return compile_definition(doc, CATALOG).unwrap()


@SETTINGS
@given(valid_workflows())
def test_compilation_is_deterministic(doc: dict[str, Any]) -> None:
    first, second = _plan(doc), _plan(copy.deepcopy(doc))
    assert first.canonical_bytes() == second.canonical_bytes()
    assert Plan.from_json(first.to_json()).digest == first.digest


@SETTINGS
@given(valid_workflows(max_segments=5), st.randoms(use_true_random=False))
def test_digest_ignores_yaml_cosmetics(doc: dict[str, Any], rnd: random.Random) -> None:
    digest = _plan(doc).digest
    variants = [
        _yaml(doc, flow=False),
        _yaml(doc, flow=True),
        json.dumps(doc, indent=1),  # JSON is YAML: every string quoted
        _commented(_yaml(_shuffled(doc, rnd), flow=False)),
    ]
    for text in variants:
        result = compile_workflow(text, "variant.yaml", CATALOG)
        assert result.plan is not None, [str(d) for d in result.errors]
        assert result.plan.digest == digest


def _tasks(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in doc["stages"] if s["type"] in ("worker", "action")]


SEMANTIC: list[Callable[[dict[str, Any]], None]] = [
    lambda d: d.update(version=d["version"] + "-next"),
    lambda d: _tasks(d)[0].update(retry={"max_attempts": 7}),
    lambda d: _tasks(d)[0].update(timeouts={"queue_deadline_ms": 123_457}),
    lambda d: _tasks(d)[-1].update(on_failure="completed"),
    lambda d: d.update(deadline_ms=29 * 86_400_000),
    lambda d: _tasks(d)[0]["input"].update(id="another-literal"),
]


@SETTINGS
@given(valid_workflows(), st.sampled_from(range(len(SEMANTIC))))
def test_any_semantic_change_changes_the_digest(doc: dict[str, Any], which: int) -> None:
    assume(_tasks(doc))
    changed = copy.deepcopy(doc)
    SEMANTIC[which](changed)
    if changed == doc:
        return
    assert _plan(changed).digest != _plan(doc).digest


def _first(doc: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((s for s in doc["stages"] if s["type"] == kind), None)


def _need(doc: dict[str, Any], kind: str) -> dict[str, Any]:
    found = _first(doc, kind)
    assert found is not None
    return found


def _mutations(doc: dict[str, Any]) -> list[tuple[str, Callable[[dict[str, Any]], None]]]:
    out: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
        ("graph-unknown-target", lambda d: _tasks(d)[-1].update(on_success="nowhere")),
        ("graph-duplicate-stage", lambda d: d["stages"].append(copy.deepcopy(d["stages"][-1]))),
        ("graph-cycle", lambda d: _tasks(d)[-1].update(on_success=d["entry"])),
        ("graph-unknown-entry", lambda d: d.update(entry="missing")),
        ("schema-unknown-field", lambda d: d["stages"][0].update(colour="red")),
        ("schema-missing-field", lambda d: d["stages"][0].pop("type")),
        ("type-unknown-capability", lambda d: _retarget(_tasks(d)[0], "@9")),
        ("budget-exceeded", lambda d: d.update(deadline_ms=1)),
        (
            "graph-unreachable",
            lambda d: d["stages"].append(
                {
                    "name": "orphan",
                    "type": "action",
                    "action": "act.a@1",
                    "input": {"id": "x"},
                    "on_success": "completed",
                    "on_failure": "failed",
                }
            ),
        ),
    ]
    if _first(doc, "decision"):
        out.append(
            ("graph-decision-fallback-missing", lambda d: _need(d, "decision")["branches"].pop())
        )
    if _first(doc, "join"):
        out.append(("graph-join-required-mismatch", lambda d: _need(d, "join")["required"].pop()))
    if any(s.get("worker") for s in doc["stages"]):
        out.append(
            (
                "type-input-missing-field",
                lambda d: next(s for s in d["stages"] if s.get("worker"))["input"].pop("id"),
            )
        )
    return out


def _retarget(stage: dict[str, Any], version: str) -> None:
    key = stage["type"]
    stage[key] = stage[key].split("@")[0] + version


@SETTINGS
@given(valid_workflows(), st.data())
def test_mutations_that_break_a_rule_are_caught(doc: dict[str, Any], data: st.DataObject) -> None:
    assume(_tasks(doc))
    code, mutate = data.draw(st.sampled_from(_mutations(doc)))
    broken = copy.deepcopy(doc)
    mutate(broken)
    result = compile_definition(broken, CATALOG)
    assert result.plan is None
    assert code in {d.code for d in result.errors}, [str(d) for d in result.errors]


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)


@settings(max_examples=80, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            ["name", "version", "entry", "stages", "terminals", "deadline_ms", "context", "status"]
        ),
        _json,
    )
)
def test_arbitrary_documents_are_refused_not_crashed(doc: dict[str, Any]) -> None:
    result = compile_definition(doc, CATALOG)
    assert result.plan is None or result.plan.stages
    assert all(d.code for d in result.diagnostics)


def test_generated_workflows_reach_forks_decisions_and_retries() -> None:
    seen: set[str] = set()

    @settings(max_examples=80, deadline=None, database=None)
    @given(valid_workflows())
    def collect(doc: dict[str, Any]) -> None:
        for s in doc["stages"]:
            seen.add(s["type"])
            seen.update(k for k in ("retry", "timeouts", "cache", "compensate") if k in s)

    collect()
    assert {"worker", "action", "decision", "fork", "join", "retry", "cache"} <= seen


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


@settings(max_examples=150, deadline=None)
@given(valid_workflows(max_segments=4), st.data())
def test_perturbed_definitions_compile_or_are_refused_never_crash(
    doc: dict[str, Any], data: st.DataObject
) -> None:
    path = data.draw(st.sampled_from(_paths(doc)))
    target: Any = doc
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = data.draw(_json)
    result = compile_definition(doc, CATALOG)
    if result.plan is not None:
        assert Plan.from_json(result.plan.to_json()).digest == result.plan.digest
    else:
        assert result.errors and all(d.code and d.message for d in result.errors)
