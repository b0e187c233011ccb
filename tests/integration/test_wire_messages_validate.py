"""Every message a real run puts on the wire validates against a published contract, on every
transport: the embedded SQLite queue, BullMQ on Redis and RabbitMQ.

A one-stage workflow (``metadata.extract@2``) runs on a real engine; a real worker
:class:`~accord.worker.runtime.Runtime` serves it through a spying transport that records every
job it receives and every outcome it publishes, unchanged. One run succeeds after reporting
progress and beating (the heartbeat period is shorter than the handler), one fails terminally;
on the brokers the first outcome's publish is slowed so the outcomes behind it leave as one
batch; a fourth run is cancelled while its handler runs, so the engine asks the worker to stop
on the control queue. Each job must be an ``envelope@2`` message whose payload is its ``messageType@
contractVersion``; each outcome an ``outcome@1`` message whose payload is the contract its kind
selects (``stage-accepted``, ``stage-heartbeat``, ``progress``, ``stage-failed``, or the
capability's result at ``contractVersion``); each batch an ``outcome-batch@1`` message of such
outcomes; each control message a ``cancellation-requested@1`` message. Checked with the
validator ``accord contracts validate`` uses, against the published catalogue, and for one
message of each kind through the ``accord`` command itself.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest
import redis

from accord.adapters import open_engine, open_transport
from accord.adapters.artefacts import ArtefactStore
from accord.adapters.transports.rabbitmq import RabbitmqTransport
from accord.contracts.catalog import Catalog
from accord.contracts.fixture_values import message_of
from accord.contracts.sources import load_catalog
from accord.contracts.validate import Validator
from accord.engine.ports import Delivery, Transport
from accord.engine.runtime.checks import contract_result_check
from accord.engine.runtime.intake import OUTCOMES_QUEUE
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.errors import StageFailed
from accord.worker import Context, Worker
from accord.worker.runtime import Runtime
from accord.workflow.compiler import compile_workflow

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tests/integration is no package: reach tests.* from the root
    sys.path.insert(0, str(ROOT))
from tests.services import REDIS_DB, ensure_rabbitmq, ensure_redis, held_open  # noqa: E402

AMQP = "amqp://guest:guest@127.0.0.1:5672/"
TENANT = "acme"
CAPABILITY = "metadata.extract@2"
WORKFLOW = """\
name: wire-check
version: "1.0.0"
entry: extract
stages:
  - name: extract
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
# the payload contract each outcome kind selects (succeeded: the capability's result)
PAYLOADS = {
    "accepted": "stage-accepted",
    "heartbeat": "stage-heartbeat",
    "progress": "progress",
    "failed": "stage-failed",
}


class Spy:
    """A transport that records what passes through it and otherwise is the transport it wraps
    (attribute look-ups fall through, so the worker sees the same capabilities). ``slow_first``
    holds the first outcome publish back, so outcomes ready meanwhile leave as one batch."""

    def __init__(self, inner: Transport, *, slow_first: float = 0.0) -> None:
        self.inner = inner
        self.jobs: list[bytes] = []
        self.outcomes: list[bytes] = []
        self.control: list[bytes] = []
        self._slow = slow_first

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def publish(self, queue: str, message_id: str, body: bytes, delay_ms: int = 0) -> None:
        if queue == OUTCOMES_QUEUE:
            self.outcomes.append(bytes(body))
            if self._slow:
                slow, self._slow = self._slow, 0.0
                await asyncio.sleep(slow)
        await self.inner.publish(queue, message_id, body, delay_ms)

    async def consume(self, queue: str, prefetch: int = 1) -> AsyncIterator[Delivery]:
        async for delivery in self.inner.consume(queue, prefetch):
            if queue == "metadata":
                self.jobs.append(bytes(delivery.body))
            elif queue.startswith("accord.control"):
                self.control.append(bytes(delivery.body))
            yield delivery


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    """The published catalogue: what an outside reader validates against."""
    return Catalog(ArtefactStore(ROOT / "schemas" / "published").published())


def _worker(catalog: Catalog) -> Worker:
    contract = catalog.message("technical-metadata@1")
    assert contract is not None
    result = dict(message_of(contract.payload, full=False))  # a valid result, by construction
    worker = Worker("wire-check")

    async def extract(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        ctx.progress(40, "parsing")
        await asyncio.sleep(0.3)  # several heartbeat periods
        if "slow" in payload["objectKey"]:
            async with asyncio.timeout(20):
                while not ctx.cancelled:  # until the engine asks it to stop
                    await asyncio.sleep(0.02)
            ctx.raise_if_cancelled()
        if "bad" in payload["objectKey"]:
            raise StageFailed("not a model", failure_code="malformed-model", retryable=False)
        return result | {"modelId": payload["modelId"]}

    worker.bind(CAPABILITY, extract, queue="metadata")
    return worker


async def _serve(tmp_path: Path, transport_url: str, worker_url: str, *, slow: float) -> Spy:
    """One good and two bad runs to their end; the worker's spy."""
    sources = load_catalog(ROOT / "schemas" / "contracts")
    plan = compile_workflow(WORKFLOW, "wire-check.yaml", sources).unwrap()
    engine: Engine = open_engine(
        f"sqlite:///{tmp_path / 'accord.db'}",
        transport_url,
        options=EngineOptions(poll_ms=10),
        result_checks=[contract_result_check(sources)],
    )
    spy = Spy(open_transport(worker_url), slow_first=slow)
    runtime = Runtime(_worker(sources), spy, catalog=sources, heartbeat_ms=60, drain_s=2)
    stop = asyncio.Event()
    await engine.register_plan(plan)
    await engine.start()
    task = asyncio.get_running_loop().create_task(runtime.run(stop))
    try:
        contexts = [
            {"modelId": "good", "objectKey": "models/good.stl"},
            {"modelId": "bad1", "objectKey": "models/bad1.stl"},
            {"modelId": "bad2", "objectKey": "models/bad2.stl"},
        ]
        runs = [await engine.start_run(plan.name, c, tenant=TENANT) for c in contexts]
        slow = await engine.start_run(
            plan.name, {"modelId": "slow", "objectKey": "models/slow.stl"}, tenant=TENANT
        )
        async with asyncio.timeout(30):
            while (run := await engine.load(slow)) is None or run.stages[
                "extract"
            ].status != "running":
                await asyncio.sleep(0.02)
        await engine.cancel(slow, reason="no longer wanted", by="test")
        runs.append(slow)
        deadline = time.monotonic() + 30
        pending = set(runs)
        while pending and time.monotonic() < deadline:
            for run_id in list(pending):
                run = await engine.load(run_id)
                if run is not None and run.terminal:
                    pending.discard(run_id)
            await asyncio.sleep(0.02)
        assert not pending, f"runs not finished: {pending}"
        finished = [await engine.load(r) for r in runs]
        assert [(r.status, r.error) for r in finished if r is not None] == [
            ("completed", None),
            *[("failed", finished[2].error if finished[2] else None)] * 2,
            ("cancelled", finished[3].error if finished[3] else None),
        ]
        async with asyncio.timeout(10):  # the request reaches the worker
            while not spy.control:
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        await task
        await engine.stop()
        if isinstance(engine.transport, RabbitmqTransport):
            declared = sorted(engine.transport.declared | spy.inner.declared)  # type: ignore[attr-defined]
            await spy.inner.close()
            connection = await aio_pika.connect(AMQP)
            async with connection:
                channel = await connection.channel()
                for name in declared:
                    await channel.queue_delete(name)
        else:
            await spy.inner.close()
    return spy


def _check(validator: Validator, doc: Any, what: str) -> None:
    result = validator.validate(doc)
    assert result.ok, f"{what} refused: {[(v.path, v.code) for v in result.violations]}: {doc}"


def _validate_all(spy: Spy, catalog: Catalog) -> dict[str, dict[str, Any]]:
    """Validate every captured message; one decoded example of each kind, by kind."""

    def contract(ref: str) -> Validator:
        found = catalog.message(ref)
        assert found is not None, f"{ref} is not published"
        return Validator.for_contract(found)

    envelope, outcome, batch, control = (
        contract("envelope@2"),
        contract("outcome@1"),
        contract("outcome-batch@1"),
        contract("cancellation-requested@1"),
    )
    result_name = "technical-metadata"
    examples: dict[str, dict[str, Any]] = {}
    assert len(spy.jobs) == 4
    assert spy.control
    for body in spy.control:
        _check(control, body, "control message")
        examples.setdefault("control", json.loads(body))
    for body in spy.jobs:
        _check(envelope, body, "job")
        doc = json.loads(body)
        _check(contract(f"{doc['messageType']}@{doc['contractVersion']}"), doc["payload"], "job")
        examples.setdefault("job", doc)

    def one(doc: dict[str, Any]) -> None:
        _check(outcome, doc, "outcome")
        kind = doc["messageType"]
        name = PAYLOADS.get(kind, result_name)
        _check(contract(f"{name}@{doc['contractVersion']}"), doc["payload"], f"{kind} payload")
        assert doc["correlationId"] == doc["runId"]
        assert doc["messageId"].startswith(doc["causationId"] + ":" + kind)
        examples.setdefault(kind, doc)

    for body in spy.outcomes:
        doc = json.loads(body)
        if doc.get("messageType") == "batch":
            _check(batch, body, "batch")
            for member in doc["outcomes"]:
                one(member)
            examples.setdefault("batch", doc)
        else:
            _check(outcome, body, "outcome")
            one(doc)
    return examples


TRANSPORTS = ["embedded", "bullmq", "rabbitmq"]


@pytest.fixture
def prefix() -> Any:
    name = f"twv-{uuid.uuid4().hex[:10]}"
    yield name
    client = held_open(redis.Redis(port=6379, db=REDIS_DB))
    keys = list(client.scan_iter(match=f"{name}:*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_every_message_of_a_run_validates(
    kind: str, tmp_path: Path, prefix: str, catalog: Catalog
) -> None:
    if kind == "embedded":
        url = f"sqlite:///{tmp_path / 'accord.db'}"
        spy = await _serve(tmp_path, url, url, slow=0.0)
    elif kind == "bullmq":
        ensure_redis()
        url = f"bullmq://127.0.0.1:6379/{REDIS_DB}?prefix={prefix}&stalled_ms=300"
        spy = await _serve(tmp_path, url, url, slow=0.2)
    else:
        ensure_rabbitmq()
        url = f"{AMQP}?prefix={prefix}.&max_deliveries=3"
        spy = await _serve(tmp_path, url, url, slow=0.2)
    examples = _validate_all(spy, catalog)
    wanted = {"job", "accepted", "heartbeat", "progress", "succeeded", "failed", "control"}
    if kind != "embedded":  # the embedded queue does not batch: a row is no broker round trip
        wanted.add("batch")
    assert wanted <= set(examples), sorted(examples)
    failed = examples["failed"]["payload"]
    assert (failed["code"], failed["retryable"]) == ("malformed-model", False)
    if kind == "bullmq":
        _through_the_command(examples, tmp_path)


def _through_the_command(examples: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    """One message of each kind through ``accord contracts validate --json``, in parallel."""
    cases = {"job": "envelope@2", "batch": "outcome-batch@1", "control": "cancellation-requested@1"}
    cases |= {k: "outcome@1" for k in ("accepted", "heartbeat", "progress", "succeeded", "failed")}
    command = str(Path(sys.executable).parent / "accord")
    procs = {}
    for kind, ref in cases.items():
        path = tmp_path / f"{kind}.json"
        path.write_text(json.dumps(examples[kind]), "utf-8")
        procs[kind] = subprocess.Popen(
            [command, "contracts", "validate", ref, str(path), "--json"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    for kind, proc in procs.items():
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, f"{kind}: {out} {err}"
        assert json.loads(out)["ok"] is True, out


def test_an_outcome_without_its_contract_fields_is_refused(catalog: Catalog) -> None:
    """The check above can fail: an outcome as workers wrote it before the contract is refused,
    naming each missing field."""
    legacy = {
        "messageId": "r:s:1:accepted",
        "messageType": "accepted",
        "runId": "r",
        "stage": "s",
        "attempt": 1,
        "fence": "0123456789abcdef",
        "tenant": TENANT,
        "workerId": "w-1",
        "payload": {},
    }
    contract = catalog.message("outcome@1")
    assert contract is not None
    result = Validator.for_contract(contract).validate(legacy)
    assert not result.ok
    assert result.paths == [
        "causationId",
        "contractVersion",
        "correlationId",
        "occurredAt",
        "producer",
    ]
