"""The compiler end to end: the example's plan, warnings, bounds, planned work and admission."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from accord.contracts.catalog import Catalog
from accord.errors import PlanError
from accord.workflow.admission import admit
from accord.workflow.check_budget import stage_cost_ms
from accord.workflow.compiler import compile_definition, compile_workflow
from accord.workflow.dsl import TaskDef, parse_data
from accord.workflow.plan import Binding, ForkStage, JoinStage, Plan, RetryPolicy, TaskStage


def _example(catalog: Catalog, text: str) -> Plan:
    return compile_workflow(text, "workflows/model-ingest.yaml", catalog).unwrap()


def test_example_compiles_with_pins_branches_and_typed_bindings(
    catalog: Catalog, example_text: str
) -> None:
    plan = _example(catalog, example_text)
    render = plan.stage("render-thumbnail")
    assert isinstance(render, TaskStage)
    assert render.capability.ref == "thumbnail.render@3"
    assert render.capability.request == "thumbnail-generation-request@2"
    assert render.capability.request_digest == catalog.digest("thumbnail-generation-request@2")
    assert render.timeouts.execution_deadline_ms == 300_000
    assert render.queue == "rendering"
    binding = render.input["modelId"]
    assert isinstance(binding, Binding) and binding.expected_type == "string"
    fork = plan.stage("derive-fork")
    join = plan.stage("derive-join")
    assert isinstance(fork, ForkStage) and fork.join == "derive-join"
    assert isinstance(join, JoinStage) and join.fork == "derive-fork"
    branch = plan.stage("technical-metadata")
    assert (branch.fork, branch.branch) == ("derive-fork", "technical-metadata")
    assert [f.ref for f in plan.finalisers] == ["audit.run-terminal@1"]
    assert set(plan.contracts) >= {"cache.lookup@1", "cache-lookup-result@1"}
    assert plan.stage("cache-route").line == 12


def test_digest_is_stable_and_independent_of_file_name(catalog: Catalog, example_text: str) -> None:
    a = _example(catalog, example_text)
    b = compile_workflow("# moved\n" + example_text, "elsewhere.yaml", catalog).unwrap()
    assert a.digest == b.digest
    assert a.stage("publish").line + 1 == b.stage("publish").line


def test_warnings_do_not_refuse(catalog: Catalog, example_text: str) -> None:
    text = example_text.replace("    queue: rendering\n", "    queue: gpu-rendering\n")
    text = text.replace('version: "2.3.0"\n', 'version: "2.3.0"\ncontext: model-ingest-context@1\n')
    text = text.replace(
        '    worker: semantic.analyse@4\n    input: { modelId: "${context.modelId}" }',
        '    worker: semantic.analyse@4\n    input: { modelId: "${context.modelId}",'
        ' storageConnectionRef: "${context.storageConnectionRef}" }',
    )
    result = compile_workflow(text, "w.yaml", catalog)
    assert result.plan is not None
    assert {d.code for d in result.warnings} == {"type-queue-mismatch", "type-binding-optional"}
    assert result.plan.stage("render-thumbnail").queue == "gpu-rendering"  # type: ignore[union-attr]


def test_refusal_raises_plan_error_with_every_diagnostic(
    catalog: Catalog, example_text: str
) -> None:
    text = example_text.replace("cache.lookup@1", "cache.lookup@4").replace(
        "catalogue.publish@2", "catalogue.publish@5"
    )
    with pytest.raises(PlanError) as err:
        compile_workflow(text, "w.yaml", catalog).unwrap()
    assert [d.code for d in err.value.diagnostics] == ["type-unknown-capability"] * 2


def _chain(n: int) -> dict[str, Any]:
    stages = [
        {
            "name": f"s{i}",
            "type": "action",
            "action": "act.a@1",
            "input": {"id": "x"},
            "on_success": f"s{i + 1}" if i + 1 < n else "completed",
            "on_failure": "failed",
        }
        for i in range(n)
    ]
    return {
        "name": "chain",
        "version": "1",
        "entry": "s0",
        "stages": stages,
        "terminals": ["completed", "failed"],
    }


def test_stage_count_and_fan_out_are_bounded(synthetic: Catalog) -> None:
    assert compile_definition(_chain(2_000), synthetic).ok
    assert {d.code for d in compile_definition(_chain(2_001), synthetic).errors} == {
        "schema-too-many-stages"
    }
    doc = _chain(40)
    doc["stages"].insert(0, {"name": "f", "type": "fork", "branches": [f"s{i}" for i in range(33)]})
    assert "schema-fan-out" in {d.code for d in compile_definition(doc, synthetic).errors}


def test_budget_is_the_longest_path_with_retries() -> None:
    node = parse_data({})
    task = TaskDef(
        "t",
        node,
        retry=RetryPolicy(max_attempts=3, initial_backoff_ms=1000, max_backoff_ms=1500, jitter=0.0),
    )
    # 3 attempts × (60 s queue + 300 s execution) + backoffs of 1 s and min(2 s, 1.5 s)
    assert stage_cost_ms(task) == 3 * 360_000 + 1_000 + 1_500


def test_budget_counts_the_slowest_fork_branch(synthetic: Catalog) -> None:
    slow = {"queue_deadline_ms": 1, "execution_deadline_ms": 500_000}
    doc = {
        "name": "fan",
        "version": "1",
        "entry": "f",
        "deadline_ms": 1_000_000,
        "terminals": ["completed", "failed"],
        "stages": [
            {"name": "f", "type": "fork", "branches": ["a", "b"]},
            *(
                {
                    "name": n,
                    "type": "action",
                    "action": "act.a@1",
                    "input": {"id": "x"},
                    "retry": {"max_attempts": 1},
                    "timeouts": t,
                    "on_success": "j",
                    "on_failure": "failed",
                }
                for n, t in (("a", slow), ("b", {"execution_deadline_ms": 10}))
            ),
            {
                "name": "j",
                "type": "join",
                "required": ["a", "b"],
                "on_success": "completed",
                "on_failure": "failed",
            },
        ],
    }
    assert compile_definition(doc, synthetic).ok  # branches run in parallel: 500,001 ms fits
    doc["deadline_ms"] = 500_000
    errors = compile_definition(doc, synthetic).errors
    assert [(d.code, d.stage) for d in errors] == [("budget-exceeded", "a")]
    assert "f → a → j" in errors[0].message


def _planned(doc: dict[str, Any], **extra: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["stages"][0] = {**out["stages"][0], "action": None}
    out["stages"][0] = {k: v for k, v in out["stages"][0].items() if k != "action"}
    out["stages"][0] |= {"type": "worker", "worker": "work.planned@1", "queue": "q-a"}
    return out | extra


def test_planned_capabilities_fail_closed(synthetic: Catalog) -> None:
    active = compile_definition(_planned(_chain(1)), synthetic)
    assert [d.code for d in active.errors] == ["type-capability-planned"]
    bare = compile_definition(_planned(_chain(1), status="planned"), synthetic)
    assert [d.code for d in bare.errors] == ["admission-planned-incomplete"]
    governed = _planned(
        _chain(1),
        status="planned",
        owner="me",
        review_date="2027-01-01",
        promotion_criteria="a week without incidents",
    )
    plan = compile_definition(governed, synthetic).unwrap()
    assert (plan.status, plan.review_date) == ("planned", "2027-01-01")
    assert [d.code for d in admit(plan, {"work.planned@1": ["w1"]})] == ["admission-plan-planned"]


def test_planned_capability_without_governance_is_refused_even_in_planned_workflow() -> None:
    from accord.contracts.model import CapabilityContract
    from accord.testing.strategies import synthetic_catalog

    base = synthetic_catalog()
    bare = CapabilityContract(
        kind="worker",
        name="work.bare",
        version=1,
        owner="x",
        request=base.capability("work.a@1").request,  # type: ignore[union-attr]
        result=base.capability("work.a@1").result,  # type: ignore[union-attr]
        queue="q-a",
        status="planned",
    )
    catalog = Catalog([*base, bare])
    doc = _planned(
        _chain(1),
        status="planned",
        owner="me",
        review_date="2027-01-01",
        promotion_criteria="criteria",
    )
    doc["stages"][0]["worker"] = "work.bare@1"
    assert [d.code for d in compile_definition(doc, catalog).errors] == [
        "admission-planned-capability"
    ]


def test_admission_needs_a_live_registration_for_every_capability(
    catalog: Catalog, example_text: str
) -> None:
    plan = _example(catalog, example_text)
    needed = {
        "cache.lookup@1",
        "thumbnail.render@3",
        "semantic.analyse@4",
        "metadata.extract@2",
        "catalogue.publish@2",
        "audit.run-terminal@1",
    }
    assert admit(plan, {ref: ["w1"] for ref in needed}) == []
    live = {ref: ["w1"] for ref in needed - {"semantic.analyse@4", "cache.lookup@1"}}
    refused = admit(plan, live | {"semantic.analyse@4": []})
    assert sorted((d.code, d.stage) for d in refused) == [
        ("admission-no-action", "cache-lookup"),
        ("admission-no-live-worker", "semantic-analysis"),
    ]
    assert all(d.location is not None and d.location.line for d in refused)
