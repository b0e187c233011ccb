"""Admission on every entry point: ``POST /v1/runs``, the ``run-requested`` consumer and
``accord runs start`` all refuse what admission refuses, with its reasons, and record it; the
owner and review-date rule holds only where the definition declares an owner. And
``max_attempts_total`` holds during a run, not only before its start.

The API is a real uvicorn on a loopback port over a SQLite engine; the CLI is the real binary
against a SQLite file an engine in this process serves.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from tests.integration.test_api_support import IDLE, QUEUE, Api, serving

from accord.adapters import open_engine
from accord.adapters.clock import SystemClock
from accord.adapters.stores.memory import MemoryStore
from accord.adapters.transports.memory import MemoryTransport
from accord.contracts.sources import load_catalog
from accord.engine.machine.outcomes import ATTEMPTS_BUDGET
from accord.engine.runtime.admission import REFUSED_STATUS
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.engine.runtime.requests import RUNS_QUEUE, request_run_id
from accord.errors import StageFailed
from accord.testing.plans import pin
from accord.testing.workers import run_noop_worker
from accord.workflow.plan import Binding, Plan, RetryPolicy, TaskStage, Timeouts
from accord.workflow.triggers import Budgets

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = ROOT / "schemas" / "contracts"
ACCORD = Path(sys.executable).parent / "accord"
PROBLEM = "application/problem+json"
CTX = {"modelId": "m1"}


def _plan(
    name: str,
    queue: str = IDLE,
    *,
    capability: str = "test.work",
    budgets: Budgets | None = None,
    max_attempts: int = 1,
    **more: Any,
) -> Plan:
    task = TaskStage(
        name="work",
        type="worker",
        capability=pin(capability),
        input={"modelId": Binding(source="context", path=("modelId",), raw="${context.modelId}")},
        on_success="completed",
        on_failure="failed",
        retry=RetryPolicy(max_attempts=max_attempts, initial_backoff_ms=10, max_backoff_ms=10),
        timeouts=Timeouts(queue_deadline_ms=600_000, execution_deadline_ms=600_000),
        queue=queue,
    )
    return Plan.create(
        name=name, version="1.0.0", entry="work", stages=(task,),
        context_contract="model-ingest-context@1", budgets=budgets, **more,
    )  # fmt: skip


async def _post(api: Api, workflow: str, key: str) -> httpx.Response:
    async with api.as_("operator", "acme") as client:
        return await client.post(
            "/v1/runs", json={"workflow": workflow, "context": CTX},
            headers={"Idempotency-Key": key},
        )  # fmt: skip


def _refused(response: httpx.Response, *codes: str) -> dict[str, Any]:
    assert response.status_code == 429, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    doc: dict[str, Any] = response.json()
    assert doc["code"] == "admission-refused" and doc["status"] == 429, doc
    assert doc["type"].endswith("admission-refused") and doc["detail"], doc
    assert [r["code"] for r in doc["reasons"]] == list(codes), doc
    assert all(r["message"] for r in doc["reasons"])
    return doc


# -- POST /v1/runs ------------------------------------------------------------------------------


async def test_the_api_answers_a_refused_start_with_429_and_its_reasons(tmp_path: Path) -> None:
    async with serving(tmp_path) as api:
        await api.engine.register_plan(_plan("adm-budget", budgets=Budgets(max_concurrent_runs=1)))
        await api.engine.register_plan(_plan("adm-unserved", capability="test.unserved"))
        await api.engine.register_plan(
            _plan("adm-expired", QUEUE, owner="asset-team", review_date="2020-01-31")
        )
        await api.engine.register_plan(
            _plan("adm-owned", QUEUE, owner="asset-team", review_date="2999-12-31")
        )
        first = await _post(api, "adm-budget", "b-1")
        assert first.status_code == 201, first.text  # no owner declared: no owner rule
        doc = _refused(await _post(api, "adm-budget", "b-2"), "admission-concurrency-workflow")
        assert doc["run_id"] == request_run_id("acme", "b-2")
        assert await api.engine.load(doc["run_id"]) is None
        _refused(await _post(api, "adm-unserved", "u-1"), "admission-no-live-worker")
        _refused(await _post(api, "adm-expired", "e-1"), "admission-review-expired")
        owned = await _post(api, "adm-owned", "o-1")
        assert owned.status_code == 201, owned.text
        # the refusals are recorded, with the run id the key names
        records = await api.engine.store.list_runs(50, status=REFUSED_STATUS)
        docs: list[Any] = [r.state for r in records]
        got = {d["runId"]: [x["code"] for x in d["reasons"]] for d in docs}
        assert got.get(request_run_id("acme", "e-1")) == ["admission-review-expired"], got
        assert set(got) == {request_run_id("acme", k) for k in ("b-2", "u-1", "e-1")}
        # a refused key is released: once the budget allows, the same key starts the run
        await api.engine.cancel(first.json()["run_id"], "make room", by="test")
        async with asyncio.timeout(10):
            while True:
                again = await _post(api, "adm-budget", "b-2")
                if again.status_code != 429:
                    break
                await asyncio.sleep(0.05)
        assert again.status_code == 201, again.text


async def test_the_api_refuses_before_queueing_a_start_admission_refuses(tmp_path: Path) -> None:
    async with serving(tmp_path, starts="queue", worker=False) as api:
        await api.engine.register_plan(_plan("adm-unserved", capability="test.unserved"))
        _refused(await _post(api, "adm-unserved", "q-1"), "admission-no-live-worker")
        queued = await _post(api, "api-flow", "q-2")
        assert queued.status_code == 202 and queued.json()["state"] == "queued", queued.text


# -- the run-requested consumer -----------------------------------------------------------------


def _request(workflow: str, key: str) -> bytes:
    doc = {"workflow": workflow, "tenant": "acme", "idempotencyKey": key, "requester": "test",
           "context": CTX}  # fmt: skip
    return json.dumps(doc).encode()


async def test_the_run_request_consumer_records_a_refusal_and_settles_the_request() -> None:
    clock = SystemClock()
    store, transport = MemoryStore(clock), MemoryTransport(clock)
    engine = Engine(store, transport, clock, EngineOptions(poll_ms=10),
                    catalog=load_catalog(CONTRACTS))  # fmt: skip
    await engine.register_plan(_plan("adm-req", budgets=Budgets(max_concurrent_runs=1)))
    await engine.announce("w", ["test.work@1"], 86_400_000)
    await engine.start()
    try:
        await transport.publish(RUNS_QUEUE, "m-1", _request("adm-req", "k1"))
        async with asyncio.timeout(10):
            while engine.requests.started < 1:
                await asyncio.sleep(0.02)
        await transport.publish(RUNS_QUEUE, "m-2", _request("adm-req", "k2"))
        async with asyncio.timeout(10):
            while engine.requests.refused < 1:
                await asyncio.sleep(0.02)
        assert engine.requests.quarantined == []  # a refusal is an answer, not a bad message
        refused_id = request_run_id("acme", "k2")
        assert await engine.load(refused_id) is None
        [record] = await store.list_runs(10, status=REFUSED_STATUS, workflow="adm-req")
        state: Any = record.state
        assert state["runId"] == refused_id and state["requester"] == "test"
        assert [r["code"] for r in state["reasons"]] == ["admission-concurrency-workflow"]
        assert state["request"]["idempotencyKey"] == "k2"
    finally:
        await engine.stop()


# -- accord runs start --------------------------------------------------------------------------


async def _accord(cwd: Path, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        str(ACCORD), *args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=os.environ | {"COLUMNS": "200"},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _start(url: str, workflow: str, key: str, *rest: str) -> list[str]:
    return ["runs", "start", workflow, "--store", url, "--transport", url, "--contracts",
            str(CONTRACTS), "--context", json.dumps(CTX), "--idempotency-key", key,
            "--tenant", "acme", *rest]  # fmt: skip


async def test_runs_start_exits_1_with_the_reasons_admission_gives(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'accord.db'}"
    engine = open_engine(
        url, url, options=EngineOptions(poll_ms=10), catalog=load_catalog(CONTRACTS)
    )
    await engine.register_plan(_plan("adm-hourly", budgets=Budgets(max_runs_per_hour=1)))
    await engine.register_plan(_plan("adm-expired", owner="asset-team", review_date="2020-01-31"))
    await engine.announce("w", ["test.work@1"], 86_400_000)
    await engine.start()
    try:
        # refused before anything is published: the CLI checks what admission would refuse
        code, out, err = await _accord(tmp_path, *_start(url, "adm-expired", "e-1", "--json"))
        assert code == 1, err
        doc = json.loads(out)
        assert doc["ok"] is False and "admission-review-expired" in doc["error"], doc
        assert "Traceback" not in err
        code, out, err = await _accord(tmp_path, *_start(url, "adm-expired", "e-2"))
        assert code == 1 and "Traceback" not in err, err
        assert "admission-review-expired" in err and "2020-01-31" in err, err
        # the hourly budget is reserved by the engine that starts the run: the second start in
        # the hour passes the CLI's check, the engine refuses it, and the CLI reads the refusal
        if 3_600 - time.time() % 3_600 < 15:  # both starts must fall in one clock hour
            await asyncio.sleep(3_600 - time.time() % 3_600 + 0.5)
        code, out, err = await _accord(tmp_path, *_start(url, "adm-hourly", "h-1", "--json"))
        assert code == 0, err
        assert json.loads(out)["state"] == "started", out
        code, out, err = await _accord(tmp_path, *_start(url, "adm-hourly", "h-2", "--json"))
        assert code == 1, (out, err)
        doc = json.loads(out)
        assert doc["ok"] is False and "admission-rate-hour" in doc["error"], doc
        assert await engine.load(request_run_id("acme", "h-2")) is None
    finally:
        await engine.stop()


# -- max_attempts_total during the run ----------------------------------------------------------


async def test_a_retry_that_would_exceed_max_attempts_total_fails_the_stage() -> None:
    """The plan allows 3 attempts of its stage but 2 in all: the low-level ``start_run`` (no
    admission) starts it, and the machine stops at the budget with ``attempts-budget-exhausted``
    instead of scheduling a third attempt."""
    clock = SystemClock()
    store, transport = MemoryStore(clock), MemoryTransport(clock)
    engine = Engine(store, transport, clock, EngineOptions(poll_ms=10))
    plan = _plan("adm-attempts", "adm.flaky", max_attempts=3,
                 budgets=Budgets(max_attempts_total=2))  # fmt: skip
    await engine.register_plan(plan)
    await engine.start()
    stop = asyncio.Event()

    async def always_fails(envelope: Any) -> dict[str, Any]:
        raise StageFailed("busy", "busy", retryable=True)

    task = asyncio.get_running_loop().create_task(
        run_noop_worker(transport, ["adm.flaky"], stop=stop, handler=always_fails)
    )
    try:
        run_id = await engine.start_run("adm-attempts", CTX, "acme")
        async with asyncio.timeout(20):
            while not (run := await engine.load(run_id)) or not run.terminal:
                await asyncio.sleep(0.02)
        stage = run.stages["work"]
        error: Any = stage.error
        assert run.status == "failed", stage
        assert stage.attempt == 2 and error["code"] == ATTEMPTS_BUDGET, error
        assert "max_attempts_total 2" in error["message"] and "busy" in error["message"]
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await engine.stop()
