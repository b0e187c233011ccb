"""Invalid triggers and budgets: each case breaks exactly one rule of ``triggers:``/``budgets:``.

Every case edits the valid definition with all three trigger types
(``tests/golden/workflows/model-ingest-triggered.yaml``); the line the finding must point at
carries a ``#!`` marker. The test asserts the code, that line, the trigger named as the finding's
stage, and that no other error is reported, so each case violates one rule only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from accord.contracts.catalog import Catalog
from accord.workflow.compiler import compile_workflow

BASE = (
    Path(__file__).resolve().parents[2] / "golden" / "workflows" / "model-ingest-triggered.yaml"
).read_text(encoding="utf-8")


@dataclass(frozen=True)
class Case:
    id: str
    old: str
    new: str
    code: str
    stage: str


CASES = [
    Case(
        "unknown-type", "    type: message\n", "    type: email #!\n", "trigger-type", "from-queue"
    ),
    Case(
        "duplicate-name",
        "  - name: from-queue\n",
        "  - name: upload-webhook #!\n",
        "trigger-duplicate-name",
        "upload-webhook",
    ),
    Case("bad-name", "  - name: from-queue\n", "  - name: 9queue #!\n", "schema-name", "9queue"),
    Case(
        "unknown-field",
        "    queue: uploads\n",
        "    queue: uploads\n    retries: 3 #!\n",
        "schema-unknown-field",
        "from-queue",
    ),
    Case(
        "missing-cron",
        '    cron: "0 3 * * *"\n',
        "",
        "schema-missing-field",
        "nightly-reindex",
    ),
    Case(
        "cron-field-count",
        '    cron: "0 3 * * *"\n',
        '    cron: "0 3 * *" #!\n',
        "trigger-cron",
        "nightly-reindex",
    ),
    Case(
        "cron-out-of-range",
        '    cron: "0 3 * * *"\n',
        '    cron: "0 25 * * *" #!\n',
        "trigger-cron",
        "nightly-reindex",
    ),
    Case(
        "unknown-timezone",
        "    timezone: Europe/Berlin\n",
        "    timezone: Europe/Atlantis #!\n",
        "trigger-timezone",
        "nightly-reindex",
    ),
    Case(
        "overlap-enum",
        "    overlap: skip\n",
        "    overlap: queue-all #!\n",
        "schema-enum",
        "nightly-reindex",
    ),
    Case(
        "catch-up-enum",
        "    catch_up: latest\n",
        "    catch_up: some #!\n",
        "schema-enum",
        "nightly-reindex",
    ),
    Case(
        "catch-up-limit-without-all",
        "    catch_up: latest\n",
        "    catch_up: latest\n    catch_up_limit: 3 #!\n",
        "trigger-catch-up-limit",
        "nightly-reindex",
    ),
    Case(
        "catch-up-limit-bound",
        "    catch_up: latest\n",
        "    catch_up: all\n    catch_up_limit: 0 #!\n",
        "schema-bound",
        "nightly-reindex",
    ),
    Case(
        "schedule-context-invalid",
        "    context: { modelId: nightly }\n",
        '    context: { modelId: "not valid!" } #!\n',
        "trigger-context-invalid",
        "nightly-reindex",
    ),
    Case(
        "unknown-event",
        "    source: storefront\n    event: model-ingest-context@1\n",
        "    source: storefront\n    event: model-uploaded@1 #!\n",
        "trigger-unknown-event",
        "upload-webhook",
    ),
    Case(
        "missing-source",
        "    source: storefront\n",
        "",
        "schema-missing-field",
        "upload-webhook",
    ),
    Case(
        "missing-queue",
        "    queue: uploads\n",
        "",
        "schema-missing-field",
        "from-queue",
    ),
    Case(
        "bad-queue-name",
        "    queue: uploads\n",
        '    queue: "up loads" #!\n',
        "schema-name",
        "from-queue",
    ),
    Case(
        "binding-syntax",
        '    queue: uploads\n    context: { modelId: "${event.modelId}" }\n',
        '    queue: uploads\n    context: { modelId: "id-${event.modelId}" } #!\n',
        "trigger-binding-syntax",
        "from-queue",
    ),
    Case(
        "binding-unknown-field",
        '    queue: uploads\n    context: { modelId: "${event.modelId}" }\n',
        '    queue: uploads\n    context: { modelId: "${event.modelID}" } #!\n',
        "trigger-binding-unknown-field",
        "from-queue",
    ),
    Case(
        "binding-type",
        "    event: model-ingest-context@1\n    queue: uploads\n"
        '    context: { modelId: "${event.modelId}" }\n',
        "    event: thumbnail-generated@1\n    queue: uploads\n"
        '    context: { modelId: "${event.previews}" } #!\n',
        "trigger-binding-type",
        "from-queue",
    ),
    Case(
        "binding-optional-to-required",
        '    queue: uploads\n    context: { modelId: "${event.modelId}" }\n',
        '    queue: uploads\n    context: { modelId: "${event.objectKey}" } #!\n',
        "trigger-binding-optional",
        "from-queue",
    ),
    Case(
        "context-unknown-field",
        '    queue: uploads\n    context: { modelId: "${event.modelId}" }\n',
        '    queue: uploads\n    context: { modelId: "${event.modelId}", colour: red } #!\n',
        "trigger-context-unknown-field",
        "from-queue",
    ),
    Case(
        "context-missing",
        '    queue: uploads\n    context: { modelId: "${event.modelId}" }\n',
        '    queue: uploads\n    context: { objectKey: "${event.objectKey}" } #!\n',
        "trigger-context-missing",
        "from-queue",
    ),
    Case(
        "dedupe-not-scalar",
        "    event: model-ingest-context@1\n    queue: uploads\n"
        '    context: { modelId: "${event.modelId}" }\n    dedupe: "${event.modelId}"\n',
        "    event: thumbnail-generated@1\n    queue: uploads\n"
        '    context: { modelId: "${event.modelId}" }\n    dedupe: "${event.previews}" #!\n',
        "trigger-dedupe",
        "from-queue",
    ),
    Case(
        "dedupe-optional",
        '    queue: uploads\n    context: { modelId: "${event.modelId}" }\n'
        '    dedupe: "${event.modelId}"\n',
        '    queue: uploads\n    context: { modelId: "${event.modelId}" }\n'
        '    dedupe: "${event.objectKey}" #!\n',
        "trigger-binding-optional",
        "from-queue",
    ),
    Case(
        "dedupe-syntax",
        '    queue: uploads\n    context: { modelId: "${event.modelId}" }\n'
        '    dedupe: "${event.modelId}"\n',
        '    queue: uploads\n    context: { modelId: "${event.modelId}" }\n'
        '    dedupe: "${context.modelId}" #!\n',
        "trigger-binding-syntax",
        "from-queue",
    ),
    Case(
        "budget-bound",
        "  max_runs_per_hour: 600\n",
        "  max_runs_per_hour: 0 #!\n",
        "schema-bound",
        "",
    ),
    Case(
        "budget-unknown",
        "  max_attempts_total: 12\n",
        "  max_attempts_total: 12\n  max_cost: 3 #!\n",
        "schema-unknown-field",
        "",
    ),
    Case(
        "triggers-not-a-list",
        "triggers:\n",
        "triggers: nightly #!\nold_triggers:\n",
        "schema-type",
        "",
    ),
]


def _line_of_marker(text: str) -> int:
    for number, line in enumerate(text.splitlines(), 1):
        if "#!" in line:
            return number
    return 0


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_invalid_trigger_rule_is_refused_with_its_code(catalog: Catalog, case: Case) -> None:
    assert BASE.count(case.old) >= 1, case.old
    text = BASE.replace(case.old, case.new, 1)
    if case.id == "triggers-not-a-list":  # the list that followed now sits under another key
        text = text.replace("old_triggers:\n", "")
        text = text.split("  - name: nightly-reindex\n")[0] + "budgets:" + text.split("budgets:")[1]
    result = compile_workflow(text, "triggers.yaml", catalog)
    assert not result.ok
    errors = result.errors
    assert {d.code for d in errors} == {case.code}, [str(d) for d in errors]
    found = errors[0]
    marker = _line_of_marker(text)
    if marker:
        assert found.location is not None and found.location.line == marker, str(found)
    else:  # a missing field is reported at its trigger's first line
        assert found.location is not None and found.location.line > 0
    assert found.stage == case.stage, str(found)
    assert found.location.file == "triggers.yaml"


def test_event_trigger_context_needs_a_context_contract(catalog: Catalog) -> None:
    text = BASE.replace("context: model-ingest-context@1\n", "")
    text = text.split("triggers:")[0] + (
        "triggers:\n  - name: hook\n    type: webhook\n    source: storefront\n"
        "    event: model-ingest-context@1\n"
        '    context: { modelId: "${event.modelId}" } #!\n'
    )
    result = compile_workflow(text, "triggers.yaml", catalog)
    codes = {d.code for d in result.errors}
    assert codes == {"trigger-no-context-contract"}, [str(d) for d in result.errors]
    assert result.errors[0].location is not None
    assert result.errors[0].location.line == _line_of_marker(text)
    assert result.errors[0].stage == "hook"
