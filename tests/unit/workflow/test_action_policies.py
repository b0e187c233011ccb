"""``compensate:`` and ``finalisers:`` written as maps give the action its own retry policy and
clocks; written as references they keep the single attempt (and earlier plans their digests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from accord.contracts.catalog import Catalog
from accord.workflow.compiler import compile_workflow
from accord.workflow.plan import ActionPolicy, Plan, RetryPolicy, TaskStage, Timeouts

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "workflows" / "model-ingest.yaml"
TEXT = GOLDEN.read_text(encoding="utf-8")
PUBLISH = '    action: catalogue.publish@2\n    input: { modelId: "${context.modelId}" }\n'
FINALISERS = "finalisers: [audit.run-terminal@1]\n"
POLICY = "{ action: audit.run-terminal@1, retry: { max_attempts: 4 }, execution_deadline_ms: 9000 }"


def test_a_compensation_map_is_planned_with_its_policy(catalog: Catalog) -> None:
    text = TEXT.replace(PUBLISH, PUBLISH + f"    compensate: {POLICY}\n")
    plan = compile_workflow(text, "c.yaml", catalog).unwrap()
    publish = plan.stage("publish")
    assert isinstance(publish, TaskStage) and publish.compensate is not None
    assert publish.compensate.ref == "audit.run-terminal@1"
    assert publish.compensate_policy == ActionPolicy(
        retry=RetryPolicy(max_attempts=4), timeouts=Timeouts(execution_deadline_ms=9000)
    )
    assert Plan.from_json(plan.to_json()) == plan


def test_finalisers_may_mix_references_and_maps(catalog: Catalog) -> None:
    text = TEXT.replace(FINALISERS, f"finalisers: [{POLICY}, cache.lookup@1]\n")
    plan = compile_workflow(text, "f.yaml", catalog).unwrap()
    assert [f.ref for f in plan.finalisers] == ["audit.run-terminal@1", "cache.lookup@1"]
    first, second = plan.finaliser_policy(0), plan.finaliser_policy(1)
    assert first is not None and first.retry.max_attempts == 4 and second is None
    assert Plan.from_json(plan.to_json()) == plan


def test_references_keep_the_plan_as_it_was(catalog: Catalog) -> None:
    plain = compile_workflow(TEXT, "p.yaml", catalog).unwrap()
    assert plain.finaliser_policies == () and "finaliser_policies" not in plain.to_json()


@pytest.mark.parametrize(
    ("edit", "code"),
    [
        ("{ action: audit.run-terminal@1, tries: 3 }", "schema-unknown-field"),
        ("{ action: Audit, retry: { max_attempts: 2 } }", "schema-capability-ref"),
        ("{ action: audit.run-terminal@1, retry: { max_attempts: 0 } }", "schema-bound"),
        ("{ action: thumbnail.render@3 }", "type-capability-kind"),
    ],
)
def test_a_bad_compensation_map_is_refused_at_its_line(
    edit: str, code: str, catalog: Catalog
) -> None:
    text = TEXT.replace(PUBLISH, PUBLISH + f"    compensate: {edit}\n")
    line = text.splitlines().index(f"    compensate: {edit}") + 1
    errors = compile_workflow(text, "bad.yaml", catalog).errors
    assert {d.code for d in errors} == {code}, [str(d) for d in errors]
    assert all(d.location is not None and d.location.line == line for d in errors)
    assert all(d.stage == "publish" for d in errors)


def test_a_bad_finaliser_map_is_refused(catalog: Catalog) -> None:
    text = TEXT.replace(FINALISERS, "finalisers: [{ action: audit.run-terminal@1, when: x }]\n")
    errors = compile_workflow(text, "bad.yaml", catalog).errors
    assert {d.code for d in errors} == {"schema-unknown-field"}
