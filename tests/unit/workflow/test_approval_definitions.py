"""Approval gates in the compiler: a gated definition compiles to a pinned plan, and each broken
rule of the kind is refused with its code, line and stage (the line carries a ``#!`` marker)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from accord.contracts.catalog import Catalog
from accord.errors import Diagnostic
from accord.workflow.compiler import compile_workflow
from accord.workflow.plan import ApprovalStage, Approvers, Plan
from accord.workflow.render import to_mermaid

GATED = Path(__file__).resolve().parents[2] / "golden" / "workflows" / "model-ingest-gated.yaml"
TEXT = GATED.read_text(encoding="utf-8")
APPROVERS = (
    "    approvers: { role: operator, tenant_scoped: true, min: 1, exclude_requester: true }\n"
)
OPTIONS = "    options: [approve, reject]\n"
TIMEOUT = "    timeout_ms: 86400000\n"
ON_REJECT = "    on_reject: failed\n"
ON_APPROVE = "    on_approve: publish\n"


@dataclass(frozen=True)
class Case:
    id: str
    edits: list[tuple[str, str]]
    code: str
    stage: str = "review-listing"


CASES = [
    Case("role-unknown", [(APPROVERS, APPROVERS.replace("operator", "boss")[:-1] + " #!\n")],
         "schema-enum"),
    Case("min-zero", [(APPROVERS, APPROVERS.replace("min: 1", "min: 0")[:-1] + " #!\n")],
         "schema-bound"),
    Case("approvers-unknown-field",
         [(APPROVERS, "    approvers: { role: operator, quorum: 2 } #!\n")],
         "schema-unknown-field"),
    Case("option-unknown", [(OPTIONS, "    options: [approve, reject, defer] #!\n")],
         "schema-enum"),
    Case("option-no-approve", [(OPTIONS, "    options: [reject] #!\n")],
         "schema-approval-options"),
    Case("reject-route-without-option", [(OPTIONS, "    options: [approve]\n"),
                                         (ON_REJECT, "    on_reject: failed #!\n")],
         "schema-approval-options"),
    Case("timeout-missing", [(TIMEOUT, ""), ("  - name: review-listing\n",
                                              "  - name: review-listing #!\n")],
         "schema-missing-field"),
    Case("timeout-too-long", [(TIMEOUT, "    timeout_ms: 9999999999999 #!\n")], "schema-bound"),
    Case("on-approve-unknown", [(ON_APPROVE, "    on_approve: publsh #!\n")],
         "graph-unknown-target"),
    Case("on-reject-unknown", [(ON_REJECT, "    on_reject: revise #!\n")],
         "graph-unknown-target"),
    Case("form-bad-ref", [(ON_APPROVE, ON_APPROVE + "    form: Listing Review #!\n")],
         "schema-capability-ref"),
    Case("form-unknown", [(ON_APPROVE, ON_APPROVE + "    form: listing-review@1 #!\n")],
         "type-unknown-contract"),
    Case("unknown-field", [(ON_APPROVE, ON_APPROVE + "    escalate_to: admin #!\n")],
         "schema-unknown-field"),
]  # fmt: skip


def _apply(case: Case) -> str:
    text = TEXT
    for old, new in case.edits:
        assert old in text, (case.id, old)
        text = text.replace(old, new, 1)
    return text


def _marker_line(text: str) -> int:
    for number, line in enumerate(text.splitlines(), start=1):
        if line.rstrip().endswith("#!"):
            return number
    raise AssertionError("the case has no #! marker")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_gate_refused_with_code_line_and_stage(case: Case, catalog: Catalog) -> None:
    text = _apply(case)
    result = compile_workflow(text, f"{case.id}.yaml", catalog)
    assert result.plan is None, f"{case.id} compiled"
    errors: list[Diagnostic] = list(result.errors)
    assert {d.code for d in errors} == {case.code}, [str(d) for d in errors]
    line = _marker_line(text)
    hits = [d for d in errors if d.location is not None and d.location.line == line]
    assert hits, f"no {case.code} at line {line}: {[str(d) for d in errors]}"
    assert any(d.stage == case.stage for d in hits), [str(d) for d in hits]
    assert f"{case.id}.yaml:{line}" in str(hits[0]) and repr(case.stage) in str(hits[0])


def test_a_gated_definition_compiles_to_an_explicit_gate(catalog: Catalog) -> None:
    plan = compile_workflow(TEXT, "gated.yaml", catalog).unwrap()
    gate = plan.stage("review-listing")
    assert gate == ApprovalStage(
        name="review-listing",
        approvers=Approvers(role="operator", tenant_scoped=True, min=1, exclude_requester=True),
        options=("approve", "reject"),
        on_approve="publish",
        on_reject="failed",
        timeout_ms=86_400_000,
        on_timeout="failed",
    )
    assert Plan.from_json(plan.to_json()) == plan
    assert "review-listing<br/>approval 1 x operator" in to_mermaid(plan)


def test_defaults_are_explicit_and_options_may_omit_reject(catalog: Catalog) -> None:
    text = TEXT.replace(APPROVERS, "    approvers: { role: author }\n").replace(
        OPTIONS, "    options: [approve]\n").replace(ON_REJECT, "")  # fmt: skip
    gate = compile_workflow(text, "g.yaml", catalog).unwrap().stage("review-listing")
    assert isinstance(gate, ApprovalStage)
    assert gate.approvers == Approvers(role="author")
    assert (gate.options, gate.on_reject) == (("approve",), "")


def test_a_form_contract_is_pinned_in_the_plan(catalog: Catalog) -> None:
    text = TEXT.replace(ON_APPROVE, ON_APPROVE + "    form: model-ingest-context@1\n")
    plan = compile_workflow(text, "g.yaml", catalog).unwrap()
    gate = plan.stage("review-listing")
    assert isinstance(gate, ApprovalStage) and gate.form == "model-ingest-context@1"
    assert plan.contracts["model-ingest-context@1"].startswith("sha256:")


def test_a_gates_timeout_counts_in_the_deadline_budget(catalog: Catalog) -> None:
    text = TEXT.replace('version: "2.3.0"\n', 'version: "2.3.0"\ndeadline_ms: 7200000\n')
    codes = {d.code for d in compile_workflow(text, "g.yaml", catalog).errors}
    assert codes == {"budget-exceeded"}, codes
    shorter = text.replace(TIMEOUT, "    timeout_ms: 600000\n")
    assert compile_workflow(shorter, "g.yaml", catalog).plan is not None
