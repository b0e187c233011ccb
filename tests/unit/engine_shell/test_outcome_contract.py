"""Outcomes as ``outcome@1`` builds them, and as workers wrote them before the contract: the
builders' output validates against the published contracts, and intake reads both formats to
the same events (the retention window for outcomes already queued when the contract came)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from accord.adapters.artefacts import ArtefactStore
from accord.canonical import canonical_json
from accord.contracts.catalog import Catalog
from accord.contracts.validate import Validator
from accord.engine.machine.events import (
    HeartbeatReceived,
    StageAccepted,
    StageFailed,
    StageSucceeded,
)
from accord.engine.runtime.wire import (
    InvalidOutcome,
    MalformedOutcome,
    encode_batch,
    encode_outcome,
    job_id_of,
    outcome_id,
    parse_delivery,
    parse_outcome,
)
from accord.testing.harness import EngineHarness
from accord.testing.plans import model_ingest_shape
from accord.worker.wire import Job, failure, outcome

ROOT = Path(__file__).resolve().parents[3]
PLAN = model_ingest_shape(name="outcome-contract")
CATALOG = Catalog(ArtefactStore(ROOT / "schemas" / "published").published())
NEW_FIELDS = ("contractVersion", "correlationId", "causationId", "producer", "occurredAt")


def _valid(ref: str, doc: Any) -> None:
    contract = CATALOG.message(ref)
    assert contract is not None, ref
    result = Validator.for_contract(contract).validate(doc)
    assert result.ok, (ref, [(v.path, v.code) for v in result.violations], doc)


def _legacy(body: bytes) -> bytes:
    """The same outcome as workers wrote it before outcome@1."""
    doc = json.loads(body)
    for name in NEW_FIELDS:
        del doc[name]
    return canonical_json(doc)


JOB = Job(
    envelope={
        "messageId": "run_1:extract:2",
        "tenant": "acme",
        "resultSchemaVersion": 3,
        "runId": "run_1",
    },
    run_id="run_1",
    stage="extract",
    attempt=2,
    fence="0123456789abcdef",
)


def test_the_worker_sdk_builds_outcomes_the_contracts_accept() -> None:
    built = {
        "accepted": outcome(JOB, "accepted", worker_id="w-1"),
        "heartbeat": outcome(JOB, "heartbeat", {"at": 1.5}, seq=3),
        "progress": outcome(JOB, "progress", {"percent": 140, "message": "x" * 900}, seq=1),
        "failed": outcome(JOB, "failed", {"code": "c", "message": "m", "retryable": True}),
        "succeeded": outcome(JOB, "succeeded", {"any": 1}),
    }
    payloads = {
        "accepted": "stage-accepted@1",
        "heartbeat": "stage-heartbeat@1",
        "progress": "progress@1",
        "failed": "stage-failed@1",
    }
    for kind, (message_id, body) in built.items():
        _valid("outcome@1", body)
        doc = json.loads(body)
        assert doc["causationId"] == "run_1:extract:2"
        assert doc["correlationId"] == "run_1"
        assert job_id_of(message_id, kind) == "run_1:extract:2"
        if kind in payloads:
            _valid(payloads[kind], doc["payload"])
            assert doc["contractVersion"] == 1
    assert json.loads(built["succeeded"][1])["contractVersion"] == 3  # the job's result version
    assert json.loads(built["accepted"][1])["producer"] == "w-1"
    assert json.loads(built["failed"][1])["producer"] == "accord-worker"
    _valid("outcome-batch@1", encode_batch(list(built.values()))[1])


def test_encode_outcome_fills_the_contract_fields() -> None:
    mid = outcome_id("job-7", "heartbeat", 2)
    body = encode_outcome(
        mid, "heartbeat", run_id="r", stage="s", attempt=1, fence="f" * 16, tenant="t",
        occurred_at_ms=1_767_225_600_123,
    )  # fmt: skip
    doc = json.loads(body)
    assert {k: doc[k] for k in NEW_FIELDS} == {
        "contractVersion": 1,
        "correlationId": "r",
        "causationId": "job-7",
        "producer": "accord-worker",
        "occurredAt": "2026-01-01T00:00:00.123Z",
    }
    _valid("outcome@1", body)


def test_intake_reads_an_old_format_outcome_as_the_new_one() -> None:
    for kind, payload in (
        ("accepted", {}),
        ("succeeded", {"uri": "s3://x"}),
        ("failed", {"code": "boom", "message": "m", "retryable": True}),
        ("progress", {"percent": 50, "message": "half"}),
    ):
        _, body = outcome(JOB, kind, payload, worker_id="w-1" if kind == "accepted" else None)
        old = _legacy(body)
        assert "contractVersion" not in json.loads(old)
        assert parse_outcome(old)[0] == parse_outcome(body)[0]
        batch = encode_batch([("a", old), ("b", body)])[1]
        _, members = parse_delivery(batch)
        assert [event for _, event in members] == [parse_outcome(body)[0]] * 2


async def test_a_run_advances_on_old_format_outcomes() -> None:
    async with EngineHarness() as h:
        run = await h.start_run(PLAN, {"modelId": "m1"})
        env = h.job(run, "render")
        job = Job(env, env["runId"], env["stage"], env["attempt"], env["fence"])
        accepted = outcome(job, "accepted", worker_id="w-1")
        done = outcome(job, "succeeded", {"uri": "s3://one"})
        events = await h.send_outcome(accepted[0], _legacy(accepted[1]))
        assert [type(e) for e in events] == [StageAccepted]
        assert isinstance(events[0], StageAccepted) and events[0].worker_id == "w-1"
        events = await h.send_outcome(done[0], _legacy(done[1]))
        assert [type(e) for e in events] == [StageSucceeded]
        state = await h.run(run)
        assert state.stages["render"].status == "completed"
        assert state.stages["render"].result == {"uri": "s3://one"}


async def test_an_old_format_failure_keeps_its_retryable_flag() -> None:
    async with EngineHarness() as h:
        run = await h.start_run(PLAN, {"modelId": "m1"})
        env = h.job(run, "render")
        job = Job(env, env["runId"], env["stage"], env["attempt"], env["fence"])
        await h.send_outcome(*outcome(job, "accepted", worker_id="w-1"))
        mid, body = outcome(job, "failed", {"code": "flaky", "message": "m", "retryable": True})
        events = await h.send_outcome(mid, _legacy(body))
        assert len(events) == 1 and isinstance(events[0], StageFailed)
        assert events[0].retryable is True
        assert (await h.run(run)).stages["render"].status != "failed"  # a retry is due


def test_intake_refuses_an_outcome_that_breaks_its_declared_contract() -> None:
    _, body = outcome(JOB, "heartbeat", {"at": 1.0}, seq=1)
    doc = json.loads(body)
    del doc["correlationId"]
    with pytest.raises(MalformedOutcome, match=r"outcome@1 message: field 'correlationId'"):
        parse_outcome(canonical_json(doc))
    doc = json.loads(body) | {"contractVersion": 7}
    with pytest.raises(MalformedOutcome, match="'heartbeat' outcome at version 7"):
        parse_outcome(canonical_json(doc))
    # a fence intake would read, but the contract says string
    with pytest.raises(MalformedOutcome, match="field 'fence'"):
        parse_outcome(canonical_json(json.loads(body) | {"fence": 12345}))
    assert isinstance(parse_outcome(_legacy(body))[0], HeartbeatReceived)  # old format: read


def test_intake_refuses_a_payload_that_breaks_the_contract_its_kind_selects() -> None:
    _, body = outcome(JOB, "heartbeat", {"at": 1.0}, seq=1)
    doc = json.loads(body)
    for payload, field in (
        ({"at": 1.0, "extra": True}, "payload.extra"),
        ({"at": -1.0}, "payload.at"),
        ({"at": "soon"}, "payload.at"),
    ):
        with pytest.raises(MalformedOutcome, match=rf"stage-heartbeat@1 message: field '{field}'"):
            parse_outcome(canonical_json(doc | {"payload": payload}))
    _, failed = outcome(JOB, "failed", {"code": "c", "message": "m", "retryable": True})
    doc = json.loads(failed)
    with pytest.raises(
        MalformedOutcome, match=r"stage-failed@1 message: field 'payload.retryable'"
    ):
        parse_outcome(canonical_json(doc | {"payload": {"code": "c", "message": "m"}}))
    with pytest.raises(MalformedOutcome, match=r"field 'payload.code'"):
        parse_outcome(
            canonical_json(doc | {"payload": {"code": "", "message": "m", "retryable": 1}})
        )


def test_the_builder_refuses_an_outcome_off_its_contract() -> None:
    with pytest.raises(InvalidOutcome, match=r"stage-failed@1 message: field 'retryable'"):
        encode_outcome(
            "j:failed", "failed", run_id="r", stage="s", attempt=1, fence="f",
            payload={"code": "c", "message": "m"},
        )  # fmt: skip
    with pytest.raises(InvalidOutcome, match=r"outcome@1 message: field 'attempt'"):
        encode_outcome("j:heartbeat", "heartbeat", run_id="r", stage="s", attempt=-1, fence="f")
    with pytest.raises(InvalidOutcome, match="no payload contract for a 'progress' outcome"):
        encode_outcome(
            "j:progress", "progress", run_id="r", stage="s", attempt=1, fence="f",
            payload={"percent": 5}, contract_version=2,
        )  # fmt: skip


def test_the_worker_holds_a_failure_to_its_contract() -> None:
    _, body = outcome(JOB, *failure("", "m" * 5000, retryable=False))
    payload = json.loads(body)["payload"]
    assert payload["code"] == "failed" and len(payload["message"]) == 2000
    _, body = outcome(JOB, *failure("c" * 600, "m", retryable=True))
    assert len(json.loads(body)["payload"]["code"]) == 512
    assert isinstance(parse_outcome(body)[0], StageFailed)


def test_an_old_format_payload_is_read_as_its_reader_read_it() -> None:
    _, body = outcome(JOB, "failed", {"code": "c", "message": "m", "retryable": False})
    doc = json.loads(_legacy(body))
    old = canonical_json(doc | {"payload": {"message": "x" * 3000}, "fence": 1234})
    event = parse_outcome(old)[0]
    assert isinstance(event, StageFailed)
    assert (event.code, event.retryable, len(event.message), event.fence) == (
        "failed",
        False,
        2000,
        "1234",
    )
    with pytest.raises(MalformedOutcome, match=r"field 'payload.retryable'"):
        parse_outcome(canonical_json(doc | {"payload": {"retryable": "yes"}}))
