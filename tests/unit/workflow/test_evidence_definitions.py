"""``evidence:`` on a task stage and on the workflow: result field paths a success must carry."""

from __future__ import annotations

from pathlib import Path

import pytest

from accord.contracts.catalog import Catalog
from accord.workflow.compiler import compile_workflow
from accord.workflow.plan import Plan, TaskStage

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "workflows"
TEXT = (GOLDEN / "model-ingest.yaml").read_text(encoding="utf-8")
PUBLISH = '    action: catalogue.publish@2\n    input: { modelId: "${context.modelId}" }\n'
TOP = 'version: "2.3.0"\n'


def test_stage_and_workflow_evidence_are_planned(catalog: Catalog) -> None:
    text = TEXT.replace(PUBLISH, PUBLISH + "    evidence: [entryId, publishedAt]\n").replace(
        TOP, TOP + "evidence: [entryId]\n"
    )
    plan = compile_workflow(text, "e.yaml", catalog).unwrap()
    publish = plan.stage("publish")
    assert isinstance(publish, TaskStage) and publish.evidence == ("entryId", "publishedAt")
    assert plan.evidence == ("entryId",)
    assert Plan.from_json(plan.to_json()) == plan
    plain = compile_workflow(TEXT, "p.yaml", catalog).unwrap().to_json()
    assert "evidence" not in plain and all("evidence" not in s for s in plain["stages"])


@pytest.mark.parametrize(
    ("line", "code"),
    [
        ("    evidence: [entryId, entryId] #!\n", "schema-evidence-path"),
        ("    evidence: ['entry id'] #!\n", "schema-evidence-path"),
        ("    evidence: [receipt] #!\n", "type-evidence-unknown-field"),
        ("    evidence: [entryId.part] #!\n", "type-evidence-unknown-field"),
    ],
)
def test_bad_stage_evidence_is_refused_at_its_line(line: str, code: str, catalog: Catalog) -> None:
    text = TEXT.replace(PUBLISH, PUBLISH + line)
    number = text.splitlines().index(line.rstrip("\n")) + 1
    errors = compile_workflow(text, "bad.yaml", catalog).errors
    assert {d.code for d in errors} == {code}, [str(d) for d in errors]
    assert all(d.stage == "publish" for d in errors)
    assert all(d.location is not None and d.location.line == number for d in errors)


def test_bad_workflow_evidence_is_refused(catalog: Catalog) -> None:
    text = TEXT.replace(TOP, TOP + "evidence: ['not a path']\n")
    assert {d.code for d in compile_workflow(text, "bad.yaml", catalog).errors} == {
        "schema-evidence-path"
    }
