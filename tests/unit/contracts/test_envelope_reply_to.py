"""envelope@2 is envelope@1 plus ``replyTo``: every valid v1 envelope is a valid v2 one, v2 takes
a queue name in ``replyTo`` and refuses a bad one naming the field, and the worker's job reader
(which validates against v2) refuses it the same way while keeping the job answerable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from accord.canonical import canonical_json
from accord.contracts.catalog import Catalog
from accord.contracts.sources import load_catalog
from accord.contracts.validate import Validator
from accord.generated import EnvelopeV2
from accord.worker.wire import Refused, read_job

ROOT = Path(__file__).resolve().parents[3]
BASE: dict[str, Any] = {
    "messageId": "msg_1", "messageType": "thumbnail-generation-request", "contractVersion": 2,
    "correlationId": "run_1", "producer": "accord-engine", "tenant": "acme",
    "occurredAt": "2026-01-01T00:00:00.000Z", "runId": "run_1", "stage": "render",
    "attempt": 1, "fence": "f1" * 16, "payload": {"modelId": "m1"},
}  # fmt: skip


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(ROOT / "schemas" / "contracts")


def _validator(catalog: Catalog, ref: str) -> Validator:
    contract = catalog.message(ref)
    assert contract is not None, ref
    return Validator.for_contract(contract)


def test_every_valid_v1_envelope_is_a_valid_v2_envelope(catalog: Catalog) -> None:
    v2 = _validator(catalog, "envelope@2")
    fixtures = sorted((ROOT / "schemas/fixtures/envelope/1/valid").glob("*.json"))
    assert len(fixtures) >= 3
    for path in fixtures:
        message = json.loads(path.read_text("utf-8"))["message"]
        assert v2.validate(message).ok, path.name


@pytest.mark.parametrize(
    "queue", ["accord.outcomes", "accord.outcomes.s3", "a", "q:owner-7_x", "A" + "b" * 199]
)
def test_v2_takes_a_queue_name_in_reply_to_and_v1_refuses_it(catalog: Catalog, queue: str) -> None:
    checked = _validator(catalog, "envelope@2").validate({**BASE, "replyTo": queue})
    assert checked.ok, checked.violations
    assert checked.value["replyTo"] == queue
    assert EnvelopeV2.model_validate({**BASE, "replyTo": queue}).replyTo == queue
    old = _validator(catalog, "envelope@1").validate({**BASE, "replyTo": queue})
    assert not old.ok  # closed: a v1 reader refuses the new field
    assert [v.path for v in old.violations] == ["replyTo"]


@pytest.mark.parametrize(
    "bad",
    ["", "has space", ".starts-with-dot", "-dash", "slash/queue", "é", "a" * 201, 7, None, True],
)
def test_v2_refuses_a_bad_reply_to_naming_the_field(catalog: Catalog, bad: Any) -> None:
    checked = _validator(catalog, "envelope@2").validate({**BASE, "replyTo": bad})
    assert not checked.ok
    assert [v.path for v in checked.violations] == ["replyTo"], checked.violations


def test_the_job_reader_refuses_a_bad_reply_to_and_answers_on_the_shared_queue(
    catalog: Catalog,
) -> None:
    body = canonical_json({**BASE, "replyTo": "no such queue"})
    with pytest.raises(Refused) as caught:
        read_job(body, catalog, "thumbnail-generation-request@2")
    assert caught.value.code == "invalid-envelope"
    assert caught.value.message.startswith("replyTo: ")
    assert caught.value.job.reply_to is None  # a name the contract refuses is never used
    job, _ = read_job(
        canonical_json({**BASE, "replyTo": "accord.outcomes.s3"}),
        catalog,
        "thumbnail-generation-request@2",
    )
    assert job.reply_to == "accord.outcomes.s3"
    job, _ = read_job(canonical_json(BASE), catalog, "thumbnail-generation-request@2")
    assert job.reply_to is None
