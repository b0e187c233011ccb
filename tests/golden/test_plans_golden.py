"""Golden plans: each definition under ``workflows/`` compiles to the committed plan, byte for byte.

``plans/<name>.json`` holds the canonical plan JSON and ``plans/<name>.digest`` its digest. A
difference means the compiler, the plan format or a pinned contract changed: review it, then
regenerate with ``ACCORD_REGENERATE_GOLDEN=1 pytest tests/golden/test_plans_golden.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from accord.contracts.sources import load_catalog
from accord.workflow.compiler import compile_workflow
from accord.workflow.plan import Plan

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEFINITIONS = sorted((HERE / "workflows").glob("*.yaml"))


def _compile(path: Path) -> Plan:
    catalog = load_catalog(ROOT / "schemas" / "contracts")
    text = path.read_text(encoding="utf-8")
    return compile_workflow(text, f"tests/golden/workflows/{path.name}", catalog).unwrap()


def test_the_example_is_a_golden_definition_and_unchanged() -> None:
    golden = HERE / "workflows" / "model-ingest.yaml"
    assert (ROOT / "workflows" / "model-ingest.yaml").read_bytes() == golden.read_bytes()


@pytest.mark.parametrize("path", DEFINITIONS, ids=[p.stem for p in DEFINITIONS])
def test_plan_matches_golden(path: Path) -> None:
    plan = _compile(path)
    expected_json = HERE / "plans" / f"{path.stem}.json"
    expected_digest = HERE / "plans" / f"{path.stem}.digest"
    actual = plan.canonical_bytes() + b"\n"
    if os.environ.get("ACCORD_REGENERATE_GOLDEN") == "1":
        expected_json.parent.mkdir(exist_ok=True)
        expected_json.write_bytes(actual)
        expected_digest.write_text(plan.digest + "\n", encoding="utf-8")
    assert actual == expected_json.read_bytes()
    assert plan.digest + "\n" == expected_digest.read_text(encoding="utf-8")
    assert Plan.from_json(plan.to_json()).canonical_bytes() == plan.canonical_bytes()
