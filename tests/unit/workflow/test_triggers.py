"""Triggers and budgets in the plan: compiled, canonical, digest-pinned, rendered at run time."""

from __future__ import annotations

from pathlib import Path

from accord.contracts.catalog import Catalog
from accord.workflow.compiler import compile_workflow
from accord.workflow.plan import Plan
from accord.workflow.triggers import (
    Budgets,
    EventBinding,
    EventTrigger,
    ScheduleTrigger,
    render_context,
)

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "workflows"
TRIGGERED = (GOLDEN / "model-ingest-triggered.yaml").read_text(encoding="utf-8")
GOVERNED = (GOLDEN / "model-ingest-governed.yaml").read_text(encoding="utf-8")


def _plan(catalog: Catalog, text: str = TRIGGERED) -> Plan:
    return compile_workflow(text, "t.yaml", catalog).unwrap()


def test_all_three_trigger_types_compile_with_their_defaults_explicit(catalog: Catalog) -> None:
    plan = _plan(catalog)
    nightly, hook, queue = plan.triggers
    assert isinstance(nightly, ScheduleTrigger)
    assert (nightly.cron, nightly.timezone, nightly.overlap, nightly.catch_up) == (
        "0 3 * * *", "Europe/Berlin", "skip", "latest",
    )  # fmt: skip
    assert nightly.catch_up_limit == 10
    assert isinstance(hook, EventTrigger) and hook.type == "webhook" and hook.source == "storefront"
    assert hook.context["modelId"] == EventBinding(("modelId",), "string")
    assert hook.dedupe == EventBinding(("modelId",), "string")
    assert isinstance(queue, EventTrigger) and queue.type == "message" and queue.queue == "uploads"
    assert plan.budgets == Budgets(20, 5, 600, 12)
    assert "model-ingest-context@1" in plan.contracts
    assert plan.trigger("from-queue") is queue and plan.trigger("nope") is None


def test_the_plan_round_trips_through_its_canonical_json(catalog: Catalog) -> None:
    plan = _plan(catalog)
    again = Plan.from_json(plan.to_json())
    assert again.digest == plan.digest
    assert again.triggers == plan.triggers and again.budgets == plan.budgets


def test_the_digest_covers_triggers_and_budgets(catalog: Catalog) -> None:
    base = _plan(catalog).digest
    for old, new in (
        ('cron: "0 3 * * *"', 'cron: "0 4 * * *"'),
        ("overlap: skip", "overlap: allow"),
        ("max_runs_per_hour: 600", "max_runs_per_hour: 601"),
        ("queue: uploads", "queue: uploads-2"),
        ('    dedupe: "${event.modelId}"\n  - name: from-queue', "  - name: from-queue"),
    ):
        assert TRIGGERED.count(old) >= 1, old
        assert _plan(catalog, TRIGGERED.replace(old, new, 1)).digest != base, old


def test_cosmetic_edits_of_triggers_keep_the_digest(catalog: Catalog) -> None:
    base = _plan(catalog).digest
    text = TRIGGERED.replace("    overlap: skip\n", "    overlap: skip   # the default\n")
    text = text.replace('cron: "0 3 * * *"', "cron: '0 3 * * *'")
    assert _plan(catalog, text).digest == base


def test_a_definition_without_triggers_keeps_its_plan_form(catalog: Catalog) -> None:
    plan = _plan(catalog, GOVERNED)
    assert plan.triggers == () and plan.budgets is None
    assert "triggers" not in plan.to_json() and "budgets" not in plan.to_json()


def test_render_context_binds_event_values_and_keeps_literals() -> None:
    t = EventTrigger(
        "hook", "webhook", "model-ingest-context@1",
        context={"modelId": EventBinding(("modelId",), "string"),
                 "objectKey": EventBinding(("objectKey",), "string"), "note": "fixed"},
    )  # fmt: skip
    assert render_context(t, {"modelId": "m", "objectKey": "k"}) == {
        "modelId": "m", "objectKey": "k", "note": "fixed",
    }  # fmt: skip
    assert render_context(t, {"modelId": "m"}) == {"modelId": "m", "note": "fixed"}
    s = ScheduleTrigger("nightly", "0 3 * * *", context={"modelId": "x"})
    assert render_context(s) == {"modelId": "x"}
