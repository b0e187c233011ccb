"""The TypeScript ``metadata.extract@2`` worker (workers/metadata-extract-ts) against the Python
engine on the real Redis: Redis store, BullMQ transport, Node BullMQ on the worker side.

A cube STL is written to the worker's storage root, a one-stage workflow compiled against the
real contracts sends it to the ``metadata`` queue, and the run must complete with the cube's
measures as the stage result (checked by the engine's contract hook as well). A request that
breaks ``metadata-extraction-request@1`` must end as a terminal failure in the run's history,
with the worker still serving afterwards. The acceptance record is checked on the wire: a job
delivered again for an attempt already finished gets its stored outcome back, and one still in
progress elsewhere is only re-announced — neither is measured a second time. Jobs naming a
``replyTo`` queue (envelope@2) are answered there, each on its own, and a job without one on
``accord.outcomes``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from accord.adapters import open_transport
from accord.adapters.transports.bullmq import BullmqTransport, job_id_for
from accord.contracts.sources import load_catalog
from accord.engine.machine.state import RunState
from accord.engine.runtime.checks import contract_result_check
from accord.engine.runtime.orchestrator import Engine
from accord.workflow.compiler import compile_workflow

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tests/integration is no package: reach tests.* from the root
    sys.path.insert(0, str(ROOT))
from tests.integration.ts_worker_support import NodeWorker, built_worker, cube_stl  # noqa: E402
from tests.services import REDIS_DB, ensure_redis, held_open, redis_url  # noqa: E402

from accord.adapters import open_engine  # noqa: E402
from accord.engine.runtime.orchestrator import EngineOptions  # noqa: E402

TENANT, EDGE, OFFSET = "acme", 2.0, (1.0, 2.0, 3.0)
WORKFLOW = """\
name: ts-metadata
version: "1.0.0"
entry: technical-metadata
stages:
  - name: technical-metadata
    type: worker
    queue: metadata
    worker: metadata.extract@2
    input:
      modelId: "${context.modelId}"
      storageConnectionRef: local
      objectKey: "${context.objectKey}"
    retry: { max_attempts: 1 }
    on_success: completed
    on_failure: failed
terminals: [completed, failed]
"""

pytestmark = pytest.mark.node


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("objects")
    (root / TENANT / "models").mkdir(parents=True)
    (root / TENANT / "models" / "cube.stl").write_bytes(cube_stl(EDGE, OFFSET))
    return root


@pytest.fixture(scope="module")
def node_worker(storage: Path) -> Iterator[NodeWorker]:
    ensure_redis()
    prefix = f"tts-{uuid.uuid4().hex[:10]}"
    log = storage.parent / f"{prefix}.log"
    worker = NodeWorker(built_worker(), prefix, storage, log)
    yield worker
    worker.stop()
    assert worker.proc.returncode == 0, worker.stderr()
    client = held_open(redis.Redis(port=6379, db=REDIS_DB))
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture
async def engine(node_worker: NodeWorker) -> AsyncIterator[Engine]:
    catalog = load_catalog(ROOT / "schemas" / "contracts")
    plan = compile_workflow(WORKFLOW, "ts-metadata.yaml", catalog).unwrap()
    eng = open_engine(
        redis_url(),
        node_worker.url,
        options=EngineOptions(poll_ms=10),
        result_checks=[contract_result_check(catalog)],
    )
    await eng.register_plan(plan)
    await eng.start()
    try:
        yield eng
    finally:
        await eng.stop()


async def _finished(engine: Engine, context: dict[str, Any]) -> tuple[RunState, list[Any]]:
    run_id = await engine.start_run("ts-metadata", context, tenant=TENANT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        run = await engine.load(run_id)
        if run is not None and run.terminal:
            return run, await engine.history(run_id)
        await asyncio.sleep(0.02)
    pytest.fail(f"run {run_id} not terminal within 30 s")


def _events(history: list[Any], kind: str) -> list[dict[str, Any]]:
    return [h.event for h in history if h.accepted and h.event.get("kind") == kind]


async def test_cube_is_measured_by_the_typescript_worker(
    engine: Engine, node_worker: NodeWorker
) -> None:
    run, history = await _finished(engine, {"modelId": "cube", "objectKey": "models/cube.stl"})
    assert run.status == "completed", run.error
    low = dict(zip("xyz", OFFSET, strict=True))
    assert run.stages["technical-metadata"].result == {
        "modelId": "cube",
        "format": "stl",
        "units": "unknown",
        "vertexCount": 8,
        "faceCount": 12,
        "components": 1,
        "bounds": {"min": low, "max": {k: v + EDGE for k, v in low.items()}},
        "extents": {"x": EDGE, "y": EDGE, "z": EDGE},
        "surfaceArea": 6 * EDGE**2,
        "volume": EDGE**3,
        "volumeUnavailableReason": None,
        "watertight": True,
        "windingConsistent": True,
    }
    accepted = _events(history, "stage-accepted")
    assert [e["worker_id"] for e in accepted] == [node_worker.worker_id]
    assert [e["result"] for e in _events(history, "stage-succeeded")] == [
        run.stages["technical-metadata"].result
    ]


@pytest.mark.parametrize(
    "context",
    [
        {"modelId": "not a valid id!", "objectKey": "models/cube.stl"},
        {"modelId": "cube", "objectKey": "../other/models/cube.stl"},
    ],
)
async def test_invalid_request_is_a_terminal_failure_in_history(
    engine: Engine, node_worker: NodeWorker, context: dict[str, Any]
) -> None:
    run, history = await _finished(engine, context)
    assert run.status == "failed"
    failed = _events(history, "stage-failed")
    assert len(failed) == 1, failed
    assert (failed[0]["code"], failed[0]["retryable"]) == ("invalid-request", False)
    assert "metadata-extraction-request@1" in failed[0]["message"]
    assert node_worker.proc.poll() is None  # refused, not crashed: it serves the next run
    again, _ = await _finished(engine, {"modelId": "cube", "objectKey": "models/cube.stl"})
    assert again.status == "completed"


async def _take(
    transport: BullmqTransport, stream: AsyncIterator[Any], count: int
) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    while len(got) < count:
        delivery = await asyncio.wait_for(anext(stream), 20)
        got.append(json.loads(delivery.body))
        await transport.ack(delivery)
    return got


async def _remove_settled(transport: BullmqTransport, queue: str, job_id: str) -> None:
    """Remove a settled job so that its id can be published again. The worker acknowledges a
    job only once the broker has confirmed its outcome, so the job may still be locked for a
    moment after the outcome is read, and BullMQ's ``removeJob`` leaves a locked job alone
    (answering 0): try again until it is removed (1)."""
    deadline = time.monotonic() + 10
    while await transport.queue(queue).remove(job_id) != 1:
        assert time.monotonic() < deadline, f"{queue} job {job_id} is still locked"
        await asyncio.sleep(0.02)


def _envelope(model: str) -> dict[str, Any]:
    """A job envelope as the engine writes one (``envelope@2``, without ``replyTo``: a store of
    one shard) for ``models/<model>.stl``."""
    message_id = f"msg_{uuid.uuid4().hex}"
    return {
        "messageId": message_id, "messageType": "metadata-extraction-request",
        "contractVersion": 1, "correlationId": "run_wire", "producer": "accord-engine",
        "occurredAt": "2026-01-01T00:00:00.000Z", "runId": "run_wire",
        "stage": "technical-metadata", "attempt": 1, "fence": uuid.uuid4().hex, "tenant": TENANT,
        "payload": {"modelId": model, "objectKey": f"models/{model}.stl"},
    }  # fmt: skip


async def test_redelivered_finished_job_resends_its_outcome(
    node_worker: NodeWorker, storage: Path
) -> None:
    transport = open_transport(node_worker.url)
    assert isinstance(transport, BullmqTransport)
    (storage / TENANT / "models" / "again.stl").write_bytes(cube_stl(1.0, (0.0, 0.0, 0.0)))
    envelope = _envelope("again")
    message_id, body = envelope["messageId"], json.dumps(envelope).encode()
    try:
        outcomes = transport.consume("accord.outcomes", 8)
        await transport.publish("metadata", message_id, body)
        first = await _take(transport, outcomes, 2)
        assert [o["messageType"] for o in first] == ["accepted", "succeeded"]
        assert first[1]["payload"]["volume"] == 1.0
        # the same attempt delivered again, after the model is gone: measuring again would fail
        os.remove(storage / TENANT / "models" / "again.stl")
        await _remove_settled(transport, "metadata", job_id_for(message_id))
        await _remove_settled(transport, "accord.outcomes", job_id_for(f"{message_id}:succeeded"))
        await transport.publish("metadata", message_id, body)
        second = await _take(transport, outcomes, 1)
        assert second == [first[1]]
        # an envelope that breaks envelope@2 is answered, terminally, not dropped or crashed on
        broken = {k: v for k, v in _envelope("cube").items() if k != "producer"}
        await transport.publish("metadata", broken["messageId"], json.dumps(broken).encode())
        refused = await _take(transport, outcomes, 2)
        assert [o["messageType"] for o in refused] == ["accepted", "failed"]
        assert refused[1]["payload"]["code"] == "invalid-envelope"
        assert refused[1]["payload"]["retryable"] is False
        assert "producer" in refused[1]["payload"]["message"]
    finally:
        await transport.close()


async def test_redelivered_job_still_in_progress_is_only_reannounced(
    node_worker: NodeWorker,
) -> None:
    """The process that accepted the attempt died mid-job: the redelivery must not measure."""
    transport = open_transport(node_worker.url)
    assert isinstance(transport, BullmqTransport)
    envelope = _envelope("cube")
    message_id = envelope["messageId"]
    key = f"{node_worker.prefix}:accord-acceptance:{job_id_for(message_id)}:{envelope['fence']}"
    held_open(redis.Redis(port=6379, db=REDIS_DB)).set(key, "accepted", px=60_000)
    try:
        outcomes = transport.consume("accord.outcomes", 8)
        await transport.publish("metadata", message_id, json.dumps(envelope).encode())
        [announced] = await _take(transport, outcomes, 1)
        assert announced["messageType"] == "accepted"
        assert announced["workerId"] == node_worker.worker_id
        job = await transport.queue("metadata").getJob(job_id_for(message_id))
        deadline = time.monotonic() + 10
        while await job.isCompleted() is False and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert await job.isCompleted()
        for kind in ("succeeded", "failed"):
            answer = job_id_for(f"{message_id}:{kind}")
            assert await transport.queue("accord.outcomes").getJob(answer) is None
    finally:
        await transport.close()


async def test_each_job_is_answered_on_its_reply_to_queue(
    node_worker: NodeWorker, storage: Path
) -> None:
    """Two jobs naming different replyTo queues and one naming none, all at once: every outcome
    of each lands on its own queue only; a finished one delivered again is re-sent there too. A
    replyTo with ':' (envelope@2 admits it, Node BullMQ cannot name such a queue) is answered on
    the shared queue, which the engines forward from."""
    transport = open_transport(node_worker.url)
    assert isinstance(transport, BullmqTransport)
    s1, s2, shared = "accord.outcomes.s1", "accord.outcomes.s3", "accord.outcomes"
    jobs = {run: _envelope("cube") | {"runId": run} for run in ("s1", "s2", "none", "colon")}
    jobs["s1"]["replyTo"], jobs["s2"]["replyTo"] = s1, s2
    jobs["colon"]["replyTo"] = "accord.outcomes.s4:owner-b"
    expected = {s1: {"s1"}, s2: {"s2"}, shared: {"none", "colon"}}
    streams = {q: transport.consume(q, 8) for q in expected}
    try:
        for envelope in jobs.values():
            await transport.publish(
                "metadata", envelope["messageId"], json.dumps(envelope).encode()
            )
        got = {q: await _take(transport, streams[q], 2 * len(runs)) for q, runs in expected.items()}
        for queue, runs in expected.items():
            assert {o["runId"] for o in got[queue]} == runs, queue
            for run in runs:
                answers = [o for o in got[queue] if o["runId"] == run]
                assert [o["messageType"] for o in answers] == ["accepted", "succeeded"], run
                assert {o["causationId"] for o in answers} == {jobs[run]["messageId"]}, run
        # the s1 job delivered again: its recorded outcome is re-sent on s1, nowhere else
        message_id = jobs["s1"]["messageId"]
        await _remove_settled(transport, "metadata", job_id_for(message_id))
        await _remove_settled(transport, s1, job_id_for(f"{message_id}:succeeded"))
        await transport.publish("metadata", message_id, json.dumps(jobs["s1"]).encode())
        assert await _take(transport, streams[s1], 1) == [got[s1][1]]
        await asyncio.sleep(0.3)  # anything sent astray would have arrived by now
        for queue in (s2, shared):
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(anext(streams[queue]), 0.2)
    finally:
        await transport.close()
