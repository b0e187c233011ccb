"""How `accord dead-letters show` prints a dead letter's body: the original job or outcome, each
payload masked by its own contract (or whole when its contract is unknown), names that look
sensitive masked anywhere, and every masked value scrubbed from the rest and from the reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from accord.cli._queue_admin import result_stages, shown_message
from accord.contracts.catalog import Catalog
from accord.contracts.redact import Redaction
from accord.contracts.sources import load_catalog

CONTRACTS = Path(__file__).resolve().parents[2] / "schemas" / "contracts"
CANARY = "CANARY-0b5e-ref"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(CONTRACTS)


def job(payload: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {
        "messageId": "j1",
        "messageType": "thumbnail-generation-request",
        "contractVersion": 2,
        "runId": "r1",
        "stage": "thumbnail",
        **more,
        "payload": payload,
    }


def shown(doc: Any, catalog: Catalog | None, reason: str = "", **kw: Any) -> tuple[Any, str]:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    text, why = shown_message(body, reason, catalog, **kw)
    assert CANARY not in text + why
    try:
        return json.loads(text), why
    except ValueError:
        return text, why


def test_a_job_payload_is_masked_by_its_own_contract(catalog: Catalog) -> None:
    payload = {"modelId": "m-1", "storageConnectionRef": CANARY, "renamed": "x"}
    doc, why = shown(job(payload, odd="y"), catalog, reason=f"nacked; ref was {CANARY}")
    assert doc["payload"] == {"modelId": "m-1", "storageConnectionRef": "***", "renamed": "***"}
    assert doc["odd"] == "***"  # not an envelope member: it may be a renamed secret
    assert (doc["runId"], doc["stage"], doc["contractVersion"]) == ("r1", "thumbnail", 2)
    assert why == "nacked; ref was ***"


def test_a_result_is_masked_whole_unless_its_run_names_its_contract(catalog: Catalog) -> None:
    outcome = {"messageId": "o1", "messageType": "succeeded", "runId": "r1", "stage": "s",
               "payload": {"uri": "kept?", "token": CANARY}}  # fmt: skip
    doc, _ = shown(outcome, catalog)
    assert doc["payload"] == {"uri": "***", "token": "***"}
    assert result_stages(json.dumps(outcome).encode()) == {("r1", "s")}
    known = {("r1", "s"): Redaction([("token",)])}
    doc, _ = shown(outcome, catalog, results=known)
    assert doc["payload"] == {"uri": "kept?", "token": "***"}
    doc, _ = shown(outcome, catalog, results={("r1", "s"): None})  # the run's plan is unknown
    assert doc["payload"] == {"uri": "***", "token": "***"}


def test_a_batch_is_masked_member_by_member(catalog: Catalog) -> None:
    members = [
        {"messageType": "succeeded", "runId": "r1", "stage": "s", "payload": {"t": CANARY}},
        {"messageType": "failed", "runId": "r1", "stage": "s",
         "payload": {"code": "boom", "message": f"storageConnectionRef={CANARY}"}},
    ]  # fmt: skip
    doc, _ = shown({"messageType": "batch", "outcomes": members}, catalog)
    assert doc["outcomes"][0]["payload"] == {"t": "***"}
    assert doc["outcomes"][1]["payload"]["code"] == "boom"
    assert doc["outcomes"][1]["payload"]["message"] == "storageConnectionRef=***"


def test_a_body_that_is_not_json_is_scrubbed_by_name(catalog: Catalog) -> None:
    text, _ = shown(b'{"storageConnectionRef": "' + CANARY.encode() + b'", cut', catalog)
    assert '"storageConnectionRef": "***"' in text


def test_without_a_catalog_every_payload_is_masked_whole() -> None:
    doc, _ = shown(job({"modelId": "m-1", "storageConnectionRef": CANARY}), None)
    assert doc["payload"] == {"modelId": "***", "storageConnectionRef": "***"}
