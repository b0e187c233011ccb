"""One outcome envelope for both sides: what the worker SDK writes is what intake reads, and
both quarantine records are the same record (``accord.engine.runtime.wire``)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from accord.adapters.transports.memory import MemoryTransport
from accord.engine.machine.events import StageAccepted, StageFailed, StageSucceeded
from accord.engine.ports import Delivery
from accord.engine.runtime import wire as outcome_wire
from accord.engine.runtime.intake import Intake, parse_outcome
from accord.testing import workers as testing_workers
from accord.worker import wire
from accord.worker.wire import Job

JOB = Job(
    envelope={"messageId": "run_1:render:1", "tenant": "acme"},
    run_id="run_1",
    stage="render",
    attempt=1,
    fence="f1",
)


def test_what_the_worker_writes_intake_reads() -> None:
    mid, body = wire.outcome(JOB, "accepted", worker_id="w-1")
    event, doc = parse_outcome(body)
    assert isinstance(event, StageAccepted) and event.worker_id == "w-1"
    assert (event.message_id, event.run_id, event.stage, event.attempt, event.fence) == (
        mid, "run_1", "render", 1, "f1",
    )  # fmt: skip
    assert mid == "run_1:render:1:accepted" and doc["tenant"] == "acme"
    _, body = wire.outcome(JOB, *wire.failure("boom", "it broke", retryable=True))
    failed, _ = parse_outcome(body)
    assert isinstance(failed, StageFailed) and failed.retryable and failed.code == "boom"
    mid, body = wire.outcome(JOB, "progress", {"percent": 50, "message": "half"}, seq=3)
    assert mid == "run_1:render:1:progress:3"
    assert outcome_wire.outcome_message_id(body) == mid


def test_the_testing_worker_writes_the_same_envelope() -> None:
    envelope: dict[str, Any] = {
        "messageId": JOB.message_id, "runId": JOB.run_id, "stage": JOB.stage,
        "attempt": JOB.attempt, "fence": JOB.fence, "tenant": "acme",
    }  # fmt: skip

    def untimed(built: tuple[str, bytes]) -> tuple[str, dict[str, Any]]:
        doc = json.loads(built[1])
        del doc["occurredAt"]  # when each was built
        return built[0], doc

    assert untimed(testing_workers.outcome(envelope, "succeeded", {"uri": "s3://x"})) == untimed(
        wire.outcome(JOB, "succeeded", {"uri": "s3://x"})
    )
    event, _ = parse_outcome(testing_workers.outcome(envelope, "succeeded", {"uri": "s3://x"})[1])
    assert isinstance(event, StageSucceeded) and event.result == {"uri": "s3://x"}


async def test_worker_and_intake_quarantine_the_same_record() -> None:
    poison = Delivery("rendering", "job-9", b"{not json", 1, "r1")
    queue, qid, body = wire.quarantine(poison, "not JSON")
    assert (queue, qid) == ("rendering.quarantine", "quarantine:job-9")
    from_worker = json.loads(body)

    async def nobody(*_: Any) -> None:
        return None

    transport = MemoryTransport()
    intake = Intake(transport, nobody, queue="accord.outcomes")
    await transport.publish("accord.outcomes", "out-9", b"{not json")
    async with asyncio.timeout(5):
        delivery = await anext(aiter(transport.consume("accord.outcomes")))
    await intake.process(delivery)
    async with asyncio.timeout(5):
        held = await anext(aiter(transport.consume("accord.outcomes.quarantine")))
    assert held.message_id == "quarantine:out-9"
    from_intake = json.loads(held.body)
    assert set(from_worker) == set(from_intake) == {"queue", "message_id", "reason", "body"}
    assert from_worker["message_id"] == "job-9" and from_intake["message_id"] == "out-9"
    assert intake.quarantined == [from_intake]


def test_a_quarantine_record_of_an_older_worker_still_reads() -> None:
    legacy = b'{"body":"x","messageId":"job-1","queue":"q","reason":"not JSON"}'
    assert outcome_wire.read_quarantine(legacy) == {
        "body": "x", "message_id": "job-1", "queue": "q", "reason": "not JSON",
    }  # fmt: skip
    _, current = outcome_wire.quarantine_message(
        outcome_wire.quarantine_record("q", "job-1", "not JSON", b"x")
    )
    assert outcome_wire.read_quarantine(current) == outcome_wire.read_quarantine(legacy)
