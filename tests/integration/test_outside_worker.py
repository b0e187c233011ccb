"""A worker written from ``docs/protocol.md`` and the published artefacts alone
(``tests/outside_worker/worker.py``: no Accord import) serving ``metadata.extract@2`` for the
Python engine on a Redis store, over BullMQ and over RabbitMQ.

Each test starts an engine and the worker as a separate process on its own key prefix / queue
prefix. A cube STL must come back as the stage result (the engine's contract hook checks it as
well); a malformed model and a request that breaks its contract must end as terminal failures
recorded in the run's history; a worker that dies after recording its final outcome but before
publishing it must, once the job is delivered again, answer from its acceptance record without
measuring a second time, and the run must still complete.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aio_pika
import pytest
import redis

from accord.adapters import open_engine, open_transport
from accord.contracts.sources import load_catalog
from accord.engine.machine.state import HistoryEntry, RunState
from accord.engine.runtime.checks import contract_result_check
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.workflow.compiler import compile_workflow

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tests/integration is no package: reach tests.* from the root
    sys.path.insert(0, str(ROOT))
from tests.integration.ts_worker_support import cube_stl  # noqa: E402
from tests.services import REDIS_DB, ensure_rabbitmq, ensure_redis, redis_url  # noqa: E402

WORKER = ROOT / "tests" / "outside_worker" / "worker.py"
BROKER = "amqp://guest:guest@127.0.0.1:5672/"
TENANT, EDGE, OFFSET = "acme", 2.0, (1.0, 2.0, 3.0)
WORKFLOW = """\
name: outside-metadata
version: "1.0.0"
entry: technical-metadata
stages:
  - name: technical-metadata
    type: worker
    queue: metadata
    worker: metadata.extract@2
    input:
      modelId: "${context.modelId}"
      objectKey: "${context.objectKey}"
    retry: { max_attempts: 2 }
    timeouts: { heartbeat_timeout_ms: 10000 }
    on_success: completed
    on_failure: failed
terminals: [completed, failed]
"""
CUBE = {"modelId": "cube", "objectKey": "models/cube.stl"}


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("outside-objects")
    models = root / TENANT / "models"
    models.mkdir(parents=True)
    (models / "cube.stl").write_bytes(cube_stl(EDGE, OFFSET))
    # a binary STL header announcing 1,000 triangles, followed by 7 bytes: no parser can read it
    (models / "broken.stl").write_bytes(
        b"broken".ljust(80, b" ") + (1000).to_bytes(4, "little") + b"garbage"
    )
    return root


class OutsideWorker:
    """The worker program as a process; its stdout is one JSON object per line."""

    def __init__(
        self, url: str, storage: Path, state: Path, log: Path, env: dict[str, str]
    ) -> None:
        self.worker_id = f"outside-{uuid.uuid4().hex[:8]}"
        cmd = [
            sys.executable, str(WORKER), "--transport", url, "--storage", f"local={storage}",
            "--state", str(state), "--heartbeat-ms", "200", "--worker-id", self.worker_id,
        ]  # fmt: skip
        self.log = log  # a file, not a pipe: a full pipe would stall the worker
        with log.open("ab") as err:
            self.proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=err,
                env={**os.environ, **env},
                cwd=WORKER.parent,
                bufsize=0,
            )
        self.events: list[dict[str, Any]] = []
        self.wait_for("ready", 30)

    def read(self, timeout: float) -> None:
        """Read the lines available within ``timeout`` seconds."""
        assert self.proc.stdout is not None
        end = time.monotonic() + timeout
        while True:
            ready, _, _ = select.select(
                [self.proc.stdout], [], [], max(0.0, end - time.monotonic())
            )
            if not ready:
                return
            line = self.proc.stdout.readline()
            if not line:
                return
            self.events.append(json.loads(line))

    def wait_for(self, event: str, timeout: float) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for seen in self.events:
                if seen["event"] == event:
                    return seen
            if self.proc.poll() is not None:
                self.read(0)
                if not any(seen["event"] == event for seen in self.events):
                    break
            self.read(0.1)
        pytest.fail(f"the outside worker did not report {event!r}: {self.events}\n{self.stderr()}")

    def named(self, event: str) -> list[dict[str, Any]]:
        self.read(0)
        return [e for e in self.events if e["event"] == event]

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.read(0)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode


class Stack:
    """An engine and the outside workers sharing one transport URL and one acceptance file."""

    def __init__(self, broker: str, tmp: Path, storage: Path) -> None:
        self.broker, self.tmp, self.storage = broker, tmp, storage
        self.tag = uuid.uuid4().hex[:10]
        if broker == "bullmq":
            ensure_redis()
            self.prefix = f"ow-{self.tag}"
            # a short lock, so a job held by a dead process is delivered again within seconds
            self.url = f"bullmq://127.0.0.1:6379/{REDIS_DB}?prefix={self.prefix}&visibility_ms=2000&stalled_ms=500"
        else:
            ensure_rabbitmq()
            self.prefix = f"ow{self.tag}."
            self.url = f"{BROKER}?prefix={self.prefix}"
        self.state = tmp / "acceptance.sqlite"
        self.workers: list[OutsideWorker] = []
        self.engine: Engine | None = None

    def worker(self, **env: str) -> OutsideWorker:
        worker = OutsideWorker(self.url, self.storage, self.state, self.tmp / "worker.log", env)
        self.workers.append(worker)
        return worker

    async def start_engine(self, workflow: str = WORKFLOW) -> Engine:
        catalog = load_catalog(ROOT / "schemas" / "contracts")
        plan = compile_workflow(workflow, "outside-metadata.yaml", catalog).unwrap()
        self.engine = open_engine(
            redis_url(f"ows-{self.tag}"),
            self.url,
            options=EngineOptions(poll_ms=10),
            result_checks=[contract_result_check(catalog)],
        )
        await self.engine.register_plan(plan)
        await self.engine.start()
        return self.engine

    async def finished(
        self, context: dict[str, Any], timeout: float = 45
    ) -> tuple[RunState, list[HistoryEntry]]:
        assert self.engine is not None
        run_id = await self.engine.start_run("outside-metadata", context, tenant=TENANT)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            run = await self.engine.load(run_id)
            if run is not None and run.terminal:
                return run, await self.engine.history(run_id)
            await asyncio.sleep(0.05)
        pytest.fail(f"run {run_id} not terminal within {timeout} s; worker: {self.workers_log()}")

    def workers_log(self) -> str:
        for worker in self.workers:
            worker.read(0)
        events = [e for w in self.workers for e in w.events]
        return json.dumps(events) + "\n" + (self.workers[0].stderr() if self.workers else "")

    async def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        if self.engine is not None:
            await self.engine.stop()
        if self.broker == "bullmq":
            client = redis.Redis(port=6379, db=REDIS_DB)
            keys = list(client.scan_iter(match=f"{self.prefix}:*", count=1000))
            if keys:
                client.delete(*keys)
            client.close()
        else:
            await _delete_queues(self.prefix)


async def _delete_queues(prefix: str) -> None:
    """Every broker queue under ``prefix`` (listed by ``rabbitmqctl``)."""
    if shutil.which("rabbitmqctl") is None:
        return
    listed = subprocess.run(
        ["rabbitmqctl", "list_queues", "-q", "--no-table-headers", "name"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    names = [n.strip() for n in listed.stdout.splitlines() if n.strip().startswith(prefix)]
    connection = await aio_pika.connect(BROKER)
    async with connection:
        channel = await connection.channel()
        for name in names:
            await channel.queue_delete(name)


@asynccontextmanager
async def _stack(broker: str, tmp_path: Path, storage: Path) -> AsyncIterator[Stack]:
    stack = Stack(broker, tmp_path, storage)
    try:
        yield stack
    finally:
        await stack.close()


def _events(history: list[HistoryEntry], kind: str) -> list[dict[str, Any]]:
    return [h.event for h in history if h.accepted and h.event.get("kind") == kind]


def _cube() -> dict[str, Any]:
    low = dict(zip("xyz", OFFSET, strict=True))
    return {
        "modelId": "cube", "format": "stl", "units": "unknown", "vertexCount": 8, "faceCount": 12,
        "components": 1, "bounds": {"min": low, "max": {k: v + EDGE for k, v in low.items()}},
        "extents": {"x": EDGE, "y": EDGE, "z": EDGE}, "surfaceArea": 6 * EDGE**2,
        "volume": EDGE**3, "volumeUnavailableReason": None, "watertight": True,
        "windingConsistent": True,
    }  # fmt: skip


BROKERS = pytest.mark.parametrize("broker", ["bullmq", "rabbitmq"])


@BROKERS
async def test_the_outside_worker_serves_a_run(broker: str, tmp_path: Path, storage: Path) -> None:
    async with _stack(broker, tmp_path, storage) as stack:
        worker = stack.worker()
        await stack.start_engine()
        run, history = await stack.finished(CUBE)
        assert run.status == "completed", (run.error, stack.workers_log())
        assert run.stages["technical-metadata"].result == _cube()
        assert [e["worker_id"] for e in _events(history, "stage-accepted")] == [worker.worker_id]
        assert [e["result"] for e in _events(history, "stage-succeeded")] == [_cube()]
        assert len(worker.named("measured")) == 1
        assert not [h.event for h in history if not h.accepted], "an outcome was refused"
    assert worker.proc.returncode == 0, worker.stderr()


@BROKERS
@pytest.mark.parametrize(
    ("context", "code"),
    [
        ({"modelId": "broken", "objectKey": "models/broken.stl"}, "malformed-model"),
        ({"modelId": "not a valid id!", "objectKey": "models/cube.stl"}, "invalid-request"),
        ({"modelId": "cube", "objectKey": "models/absent.stl"}, "object-not-found"),
    ],
)
async def test_bad_input_is_a_terminal_failure_in_history(
    broker: str, context: dict[str, Any], code: str, tmp_path: Path, storage: Path
) -> None:
    async with _stack(broker, tmp_path, storage) as stack:
        worker = stack.worker()
        await stack.start_engine()
        run, history = await stack.finished(context)
        assert run.status == "failed", stack.workers_log()
        failed = _events(history, "stage-failed")
        assert [(f["code"], f["retryable"]) for f in failed] == [(code, False)], failed
        assert len(_events(history, "stage-accepted")) == 1  # terminal: no second attempt
        assert worker.named("measured") == []
        # refused, not crashed: the same worker serves the next run
        again, _ = await stack.finished(CUBE)
        assert again.status == "completed", again.error
    assert worker.proc.returncode == 0, worker.stderr()


@BROKERS
async def test_a_redelivered_job_is_answered_from_the_acceptance_record(
    broker: str, tmp_path: Path, storage: Path
) -> None:
    """The first process measures, records the outcome and dies before publishing it; the job is
    delivered again to a second process, which re-sends the recorded outcome without measuring."""
    async with _stack(broker, tmp_path, storage) as stack:
        first = stack.worker(OUTSIDE_WORKER_EXIT_AFTER_RECORD="1")
        engine = await stack.start_engine()
        run_id = await engine.start_run("outside-metadata", CUBE, tenant=TENANT)
        first.wait_for("exiting-after-record", 30)
        assert first.proc.wait(timeout=10) == 17
        assert len(first.named("measured")) == 1
        second = stack.worker()
        redelivery = second.wait_for("redelivery", 30)
        assert redelivery["resent"] is True and redelivery["runId"] == run_id
        end = time.monotonic() + 30
        while (run := await engine.load(run_id)) is None or not run.terminal:
            assert time.monotonic() < end, stack.workers_log()
            await asyncio.sleep(0.05)
        assert run.status == "completed", run.error
        assert run.stages["technical-metadata"].result == _cube()
        assert run.stages["technical-metadata"].attempt == 1  # the engine did not need a retry
        assert second.named("measured") == [] and second.named("accepted") == []
        history = await engine.history(run_id)
        assert [e["result"] for e in _events(history, "stage-succeeded")] == [_cube()]


@BROKERS
async def test_a_superseded_attempt_is_cancelled_and_its_retry_completes(
    broker: str, tmp_path: Path, storage: Path
) -> None:
    """The first attempt runs past its execution deadline, heartbeating; the engine fences it and
    asks for its cancellation on ``accord.control.metadata``; the worker stops it without an
    outcome, and the engine's second attempt completes the run."""
    workflow = WORKFLOW.replace(
        "timeouts: { heartbeat_timeout_ms: 10000 }",
        "timeouts: { heartbeat_timeout_ms: 1000, execution_deadline_ms: 4000 }",
    ).replace("retry: { max_attempts: 2 }", "retry: { max_attempts: 2, initial_backoff_ms: 100 }")
    assert workflow != WORKFLOW
    async with _stack(broker, tmp_path, storage) as stack:
        worker = stack.worker(OUTSIDE_WORKER_STALL_FIRST_ATTEMPT_S="60")
        await stack.start_engine(workflow)
        run, history = await stack.finished(CUBE)
        assert run.status == "completed", (run.error, stack.workers_log())
        assert run.stages["technical-metadata"].attempt == 2
        assert run.stages["technical-metadata"].result == _cube()
        [request] = worker.named("cancel-request")
        assert request["running"] is True and request["stage"] == "technical-metadata"
        assert [e["attempt"] for e in worker.named("cancelled")] == [1]
        assert [e["attempt"] for e in worker.named("measured")] == [2]
        beats = [h.event for h in history if h.event.get("kind") == "heartbeat"]
        assert beats, "the slow first attempt sent no heartbeat"
        assert {e["attempt"] for e in _events(history, "stage-accepted")} == {1, 2}


def _job(model: str) -> dict[str, Any]:
    """A job envelope (``envelope@2``, no ``replyTo``) as the engine writes one, for
    ``models/<model>.stl``."""
    return {
        "messageId": f"msg_{uuid.uuid4().hex}", "messageType": "metadata-extraction-request",
        "contractVersion": 1, "correlationId": "run_wire", "producer": "accord-engine",
        "occurredAt": "2026-01-01T00:00:00.000Z", "runId": "run_wire",
        "stage": "technical-metadata", "attempt": 1, "fence": uuid.uuid4().hex, "tenant": TENANT,
        "resultSchemaVersion": 1, "payload": {"modelId": model, "objectKey": f"models/{model}.stl"},
    }  # fmt: skip


@BROKERS
async def test_a_job_named_by_a_cancellation_is_dropped_unanswered(
    broker: str, tmp_path: Path, storage: Path
) -> None:
    """A cancellation that arrives before its job (RabbitMQ cannot take the job back): the job is
    acknowledged and nothing is published for it; the next job is answered as usual."""
    async with _stack(broker, tmp_path, storage) as stack:
        worker = stack.worker()
        transport = open_transport(stack.url)
        try:
            dropped, served = _job("cube"), _job("cube")
            cancel = {
                "attempt": 1, "fence": dropped["fence"], "job_id": f"job_{uuid.uuid4().hex}",
                "kind": "request-cancellation", "queue": "metadata", "reason": "run cancelled",
                "stage": "technical-metadata",
            }  # fmt: skip
            await transport.publish(
                "accord.control.metadata", f"{cancel['job_id']}:cancel", json.dumps(cancel).encode()
            )
            assert worker.wait_for("cancel-request", 20)["running"] is False
            await transport.publish("metadata", dropped["messageId"], json.dumps(dropped).encode())
            worker.wait_for("dropped", 20)
            await transport.publish("metadata", served["messageId"], json.dumps(served).encode())
            outcomes = transport.consume("accord.outcomes", 8)
            got: list[dict[str, Any]] = []
            while not got or got[-1]["messageType"] != "succeeded":
                delivery = await asyncio.wait_for(anext(outcomes), 20)
                outcome = json.loads(delivery.body)
                await transport.ack(delivery)
                if outcome["messageType"] != "heartbeat":  # the first model read may be slow
                    got.append(outcome)
            assert [(o["causationId"], o["messageType"]) for o in got] == [
                (served["messageId"], "accepted"), (served["messageId"], "succeeded"),
            ]  # fmt: skip
            assert got[1]["payload"] == _cube()
            assert [e["attempt"] for e in worker.named("dropped")] == [1]
        finally:
            await transport.close()


@BROKERS
async def test_a_job_naming_a_reply_queue_is_answered_there(
    broker: str, tmp_path: Path, storage: Path
) -> None:
    """envelope@2's ``replyTo``: a job naming one is answered on that queue only, a job naming
    none on ``accord.outcomes``, as protocol §3 tells a worker written from it."""
    async with _stack(broker, tmp_path, storage) as stack:
        stack.worker()
        transport = open_transport(stack.url)
        reply = "accord.outcomes.s2"
        routed, shared = _job("cube") | {"replyTo": reply}, _job("cube")
        try:
            streams = {q: transport.consume(q, 8) for q in (reply, "accord.outcomes")}
            for job in (routed, shared):
                await transport.publish("metadata", job["messageId"], json.dumps(job).encode())
            for queue, job in ((reply, routed), ("accord.outcomes", shared)):
                got: list[dict[str, Any]] = []
                while not got or got[-1]["messageType"] != "succeeded":
                    delivery = await asyncio.wait_for(anext(streams[queue]), 20)
                    outcome = json.loads(delivery.body)
                    await transport.ack(delivery)
                    got.append(outcome)
                assert {o["causationId"] for o in got} == {job["messageId"]}, queue
                kinds = [o["messageType"] for o in got if o["messageType"] != "heartbeat"]
                assert kinds == ["accepted", "succeeded"], queue
                assert got[-1]["payload"] == _cube()
        finally:
            await transport.close()
