"""`accord runs start`: a run started by a message, over every transport, idempotently.

The real binary publishes a ``run-requested@1`` message on ``accord.runs``; a real `accord engine
run` process takes it and starts the run; a worker in this process serves its one stage. Over
the embedded default (the SQLite file in ``.accord/`` of the working folder), Redis + BullMQ and
Redis + RabbitMQ: the run completes, the same idempotency key twice is one run with one id, a
bad context or an unknown workflow is a one-line refusal (exit 1) that publishes nothing, and a
malformed request published straight to the queue is quarantined with its reason, never dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.services import REDIS_DB, ensure_rabbitmq, ensure_redis, redis_url

from accord.adapters import open_store, open_transport
from accord.adapters.clock import SystemClock
from accord.adapters.stores.memory import MemoryStore
from accord.adapters.transports.memory import MemoryTransport
from accord.contracts.sources import load_catalog
from accord.engine.ports import Transport
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.engine.runtime.requests import RUNS_QUEUE, request_run_id
from accord.engine.runtime.wire import quarantine_queue, read_quarantine
from accord.testing.plans import pin
from accord.testing.workers import run_noop_worker
from accord.workflow.plan import Binding, Plan, RetryPolicy, TaskStage, Timeouts

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = ROOT / "schemas" / "contracts"
ACCORD = Path(sys.executable).parent / "accord"
EMBEDDED = "sqlite:///.accord/accord.db"  # the default of every command, relative to the cwd


def _plan(name: str, queue: str, *, action: bool = False) -> Plan:
    """One task (a worker on ``queue``, or an action), its context checked by a real contract."""
    task = TaskStage(
        name="work",
        type="action" if action else "worker",
        capability=pin("test.work", kind="action" if action else "worker"),
        input={"modelId": Binding(source="context", path=("modelId",), raw="${context.modelId}")},
        on_success="completed",
        on_failure="failed",
        retry=RetryPolicy(max_attempts=2, initial_backoff_ms=100, max_backoff_ms=100),
        timeouts=Timeouts(queue_deadline_ms=60_000, execution_deadline_ms=60_000),
        queue=None if action else queue,
    )
    return Plan.create(
        name=name,
        version="1.0.0",
        entry="work",
        stages=(task,),
        context_contract="model-ingest-context@1",
    )


async def _register(store: str, transport: str, *plans: Plan) -> None:
    clock = SystemClock()
    engine = Engine(
        open_store(store, clock=clock), open_transport(transport, clock=clock), clock,
        options=EngineOptions(dispatch=False), owns_ports=True,
    )  # fmt: skip
    try:
        for plan in plans:
            await engine.register_plan(plan)
        # the worker this process serves the stage with, live as far as admission can tell
        await engine.announce("rs-workers", ["test.work@1"], 86_400_000)
    finally:
        await engine.stop()


async def _accord(cwd: Path, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        str(ACCORD), *args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=os.environ | {"COLUMNS": "200"},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@contextlib.asynccontextmanager
async def _engine(cwd: Path, store: str, transport: str) -> AsyncIterator[None]:
    """`accord engine run` as its own process, stopped with SIGTERM (exit 0)."""
    args = ["engine", "run", "--store", store, "--transport", transport, "--no-platform"]
    args += ["--contracts", str(CONTRACTS), "--poll-ms", "20", "--grace-ms", "200"]
    log = (cwd / "engine.log").open("ab")
    proc = await asyncio.create_subprocess_exec(
        str(ACCORD), *args, cwd=cwd, stdout=log, stderr=log,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        yield
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 30)
        log.close()
        assert code == 0, (cwd / "engine.log").read_text()


@contextlib.asynccontextmanager
async def _worker(transport_url: str, queue: str) -> AsyncIterator[Transport]:
    transport = open_transport(transport_url)
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(run_noop_worker(transport, [queue], stop=stop))
    try:
        yield transport
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await transport.close()


async def _quarantined(transport: Transport, count: int) -> list[dict[str, Any]]:
    """The first ``count`` records on ``accord.runs.quarantine`` (taken and acknowledged)."""
    records: list[dict[str, Any]] = []
    stream = transport.consume(quarantine_queue(RUNS_QUEUE), 8)
    async with asyncio.timeout(20):
        async for delivery in stream:
            records.append(read_quarantine(delivery.body))
            await transport.ack(delivery)
            if len(records) == count:
                break
    return records


def _start_args(workflow: str, store: str | None, transport: str | None, *rest: str) -> list[str]:
    urls = [] if store is None else ["--store", store]
    urls += [] if transport is None else ["--transport", transport]
    return ["runs", "start", workflow, *urls, "--contracts", str(CONTRACTS), *rest]


async def _exercise(cwd: Path, store: str | None, transport: str | None, tag: str) -> None:
    """Everything but the set-up, against an engine and a worker already running."""
    name = f"rs-{tag}"
    good = '{"modelId": "m1"}'
    key = f"order-{tag}"

    code, out, err = await _accord(
        cwd, *_start_args(name, store, transport, "--context", good, "--idempotency-key", key,
                          "--wait", "--timeout", "30", "--json"),
    )  # fmt: skip
    assert code == 0, err
    first = json.loads(out)
    assert first["state"] in ("started", "existing") and first["status"] == "completed", first
    assert first["run_id"] == request_run_id("default", key)

    code, out, err = await _accord(
        cwd, *_start_args(name, store, transport, "--context", good, "--idempotency-key", key,
                          "--json"),
    )  # fmt: skip
    assert code == 0, err
    again = json.loads(out)
    assert (again["state"], again["run_id"], again["status"]) == (
        "existing", first["run_id"], "completed"
    )  # fmt: skip

    code, out, err = await _accord(
        cwd, *_start_args(name, store, transport, "--context", '{"modelId": "no such id!"}'),
    )  # fmt: skip
    assert code == 1 and "Traceback" not in err, err
    # one error line (a store may warn of its own set-up first, as Redis without persistence does)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "modelId" in lines[0], err
    assert err.rstrip().endswith(lines[0].rstrip()), err

    code, out, err = await _accord(
        cwd, *_start_args(f"{name}-missing", store, transport, "--context", good, "--json"),
    )  # fmt: skip
    assert code == 1, err
    refused = json.loads(out)
    assert refused["ok"] is False and "no active plan" in refused["error"], refused


async def _check_store(store: str, tag: str, expected: int = 1) -> None:
    """One run of the workflow in the store per key, whatever was asked twice or refused."""
    opened = open_store(store)
    try:
        runs = await opened.list_runs(100, workflow=f"rs-{tag}")
    finally:
        await opened.close()
    assert len(runs) == expected, [r.state["run_id"] for r in runs]


async def _malformed(transport: Transport) -> None:
    """Requests published straight to the queue that can never start a run are quarantined."""
    bad = {"workflow": "rs-x", "tenant": "default", "requester": "t", "context": {}}
    await transport.publish(RUNS_QUEUE, f"bad-{uuid.uuid4().hex}", json.dumps(bad).encode())
    await transport.publish(RUNS_QUEUE, f"junk-{uuid.uuid4().hex}", b"not json at all")
    records = await _quarantined(transport, 2)
    reasons = sorted(r["reason"] for r in records)
    assert any("idempotencyKey" in r for r in reasons), reasons
    assert any("not JSON" in r for r in reasons), reasons
    assert all(r["queue"] == RUNS_QUEUE for r in records)


async def test_runs_start_on_the_embedded_default(tmp_path: Path) -> None:
    """No URL given: the default SQLite file in the working folder. With no engine running the
    request is queued; the engine started later takes it."""
    tag = uuid.uuid4().hex[:8]
    (tmp_path / ".accord").mkdir()
    store = f"sqlite:///{tmp_path / '.accord' / 'accord.db'}"  # the same file, for this process
    await _register(store, store, _plan(f"rs-{tag}", f"work-{tag}"))

    code, out, err = await _accord(
        tmp_path, *_start_args(f"rs-{tag}", None, None, "--context", '{"modelId": "m1"}',
                               "--idempotency-key", f"order-{tag}", "--wait-start", "0"),
    )  # fmt: skip
    assert code == 0, err
    run_id = request_run_id("default", f"order-{tag}")
    assert out.strip() == f"queued: run {run_id} (an engine will start it)"
    code, out, err = await _accord(
        tmp_path, *_start_args(f"rs-{tag}", None, None, "--context", '{"modelId": "m2"}',
                               "--wait", "--timeout", "0.3", "--json"),
    )  # fmt: skip
    assert code == 1, err
    waited = json.loads(out)  # one document: the refusal
    assert waited["ok"] is False and "never started" in waited["error"], waited

    async with _worker(store, f"work-{tag}") as transport, _engine(tmp_path, EMBEDDED, EMBEDDED):
        await _exercise(tmp_path, None, None, tag)
        await _malformed(transport)
    await _check_store(store, tag, expected=2)  # the key above, and the one --wait gave up on


@pytest.mark.parametrize("broker", ["bullmq", "rabbitmq"])
async def test_runs_start_on_redis(broker: str, tmp_path: Path) -> None:
    ensure_redis()
    tag = uuid.uuid4().hex[:8]
    store = redis_url(f"rs-{tag}")
    if broker == "bullmq":
        transport = f"bullmq://127.0.0.1:6379/{REDIS_DB}?prefix=rs-{tag}"
    else:
        ensure_rabbitmq()
        transport = f"amqp://guest:guest@127.0.0.1:5672/?prefix=rs{tag}."
    await _register(store, transport, _plan(f"rs-{tag}", f"work-{tag}"))
    async with _worker(transport, f"work-{tag}") as worker, _engine(tmp_path, store, transport):
        await _exercise(tmp_path, store, transport, tag)
        await _malformed(worker)
    await _check_store(store, tag)


# -- one process: the engine's side of the queue, over the in-process transport -----------------


def _request(workflow: str, key: str, **extra: Any) -> bytes:
    doc = {"workflow": workflow, "tenant": "acme", "idempotencyKey": key, "requester": "test",
           "context": {"modelId": "m1"}} | extra  # fmt: skip
    return json.dumps(doc).encode()


async def _until(check: Any, seconds: float = 10) -> None:
    async with asyncio.timeout(seconds):
        while not await check():
            await asyncio.sleep(0.02)


async def test_a_repeated_key_starts_one_run_and_a_reused_key_is_refused() -> None:
    """Two copies of one request under different message ids (no broker deduplication) start
    one run, whose history holds one run-started; the key reused for another workflow is
    quarantined, naming the run it already started."""
    clock = SystemClock()
    store, transport = MemoryStore(clock), MemoryTransport(clock)
    catalog = load_catalog(CONTRACTS)  # the plans' context contract is checked
    engine = Engine(store, transport, clock, EngineOptions(poll_ms=10), catalog=catalog)
    await engine.register_plan(_plan("rs-one", "work-one"))
    await engine.register_plan(_plan("rs-other", "work-other"))
    await engine.announce("rs-workers", ["test.work@1"], 86_400_000)
    await engine.start()
    try:
        await transport.publish(RUNS_QUEUE, "copy-1", _request("rs-one", "k"))
        await transport.publish(RUNS_QUEUE, "copy-2", _request("rs-one", "k"))
        await transport.publish(RUNS_QUEUE, "copy-3", _request("rs-other", "k"))
        bad = _request("rs-one", "k2", context={"modelId": "no such id!"})
        await transport.publish(RUNS_QUEUE, "bad-context", bad)

        async def settled() -> bool:
            r = engine.requests
            return r.started + r.answered + len(r.quarantined) == 4

        await _until(settled)
        run_id = request_run_id("acme", "k")
        assert [s.state["run_id"] for s in await store.list_runs(10)] == [run_id]
        history = await engine.history(run_id)
        assert sum(h.event["kind"] == "run-started" for h in history) == 1
        reasons = {r["message_id"]: r["reason"] for r in engine.requests.quarantined}
        assert set(reasons) == {"copy-3", "bad-context"}
        assert run_id in reasons["copy-3"] and "modelId" in reasons["bad-context"]
    finally:
        await engine.stop()


async def test_an_engine_without_the_plans_actions_leaves_the_request_to_one_that_has_them(
) -> None:  # fmt: skip
    """The run would fail at once with capability-not-registered where the action has no
    handler: that engine gives the request back, and the engine that has it starts the run."""
    clock = SystemClock()
    store, transport = MemoryStore(clock), MemoryTransport(clock)
    bare = Engine(store, transport, clock, EngineOptions(poll_ms=10, owner="bare"))
    await bare.register_plan(_plan("rs-action", "unused", action=True))
    await bare.start()
    run_id = request_run_id("acme", "a")
    try:
        await transport.publish(RUNS_QUEUE, "req-a", _request("rs-action", "a"))
        await asyncio.sleep(0.5)
        assert await store.load(run_id) is None  # not started here, and not failed
        assert not bare.requests.quarantined
    finally:
        await bare.stop()

    async def work(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
        return {}

    able = Engine(store, transport, clock, EngineOptions(poll_ms=10, owner="able"),
                  actions={"test.work@1": work})  # fmt: skip
    await able.start()
    try:

        async def completed() -> bool:
            run = await able.load(run_id)
            return run is not None and run.status == "completed"

        await _until(completed)
    finally:
        await able.stop()
