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
    MalformedOutcome,
    encode_batch,
    encode_outcome,
    job_id_of,
    outcome_id,
    parse_delivery,
    parse_outcome,
    payload_violations,
)
from accord.testing.harness import EngineHarness
from accord.testing.plans import model_ingest_shape
from accord.worker.wire import Job, outcome

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


def test_a_payload_off_its_contract_is_counted_not_refused() -> None:
    before = payload_violations["stage-heartbeat@1"]
    _, body = outcome(JOB, "heartbeat", {"at": 1.0, "extra": True}, seq=1)
    event, _ = parse_outcome(body)
    assert isinstance(event, HeartbeatReceived)
    assert payload_violations["stage-heartbeat@1"] == before + 1
