"""Claim checks for results, end to end: the real worker runtime checks a result above the
threshold in to the object store and answers ``{"payloadRef": …}``; the engine's outcome intake
reads it back, verifies it, and the run records the result itself. A claim whose bytes do not
match its reference is the attempt's terminal ``corrupt-payload``, in the run's history.

Both object stores: a directory and a real SeaweedFS (S3). The store and queue are one SQLite
file (the embedded default), the worker is the real :class:`~accord.worker.Runtime`.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.services import ensure_seaweedfs

from accord.adapters import open_engine
from accord.adapters.objects.s3 import S3ObjectStore
from accord.canonical import canonical_json, sha256_hex
from accord.contracts.sources import load_catalog
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.objects.claims import THRESHOLD_BYTES
from accord.objects.fs import FileObjectStore
from accord.objects.ports import ObjectNotFound, ObjectStore
from accord.testing.plans import pin
from accord.worker import Runtime, Worker
from accord.workflow.plan import Binding, Plan, RetryPolicy, TaskStage, Timeouts

ROOT = Path(__file__).resolve().parents[2]
QUEUE = "claims.results"
CAPABILITY = "claimstest@1"
SIZE = 257 * 1024  # a result of 257 KiB: above the 256 KiB threshold


@pytest.fixture(params=["fs", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "fs":
        yield FileObjectStore(tmp_path / "objects")
        return
    server = ensure_seaweedfs()
    access, secret = server.credentials()
    s3 = S3ObjectStore("accord-claims", endpoint=server.endpoint, access_key=access,
                       secret_key=secret, prefix=f"r-{uuid.uuid4().hex[:10]}")  # fmt: skip
    s3.ensure_bucket()
    yield s3
    s3.close()


def _plan() -> Plan:
    task = TaskStage(
        name="work",
        type="worker",
        capability=pin("claimstest"),
        input={"size": Binding(source="context", path=("size",), raw="${context.size}")},
        on_success="completed",
        on_failure="failed",
        retry=RetryPolicy(max_attempts=3, initial_backoff_ms=20, max_backoff_ms=20),
        timeouts=Timeouts(queue_deadline_ms=60_000, execution_deadline_ms=60_000),
        queue=QUEUE,
    )
    return Plan.create(name="result-claims", version="1.0.0", entry="work", stages=(task,))


def _result(size: int) -> dict[str, Any]:
    return {"blob": "r" * size, "size": size}


def _key(tenant: str, result: dict[str, Any]) -> str:
    hexd = sha256_hex(canonical_json(result))
    return f"claims/{tenant}/sha256/{hexd[:2]}/{hexd}.json"


@contextlib.asynccontextmanager
async def _stack(
    tmp: Path, claims: ObjectStore, *, tamper: bool = False
) -> AsyncIterator[tuple[Engine, list[int]]]:
    url = f"sqlite:///{tmp / 'accord.db'}"
    engine = open_engine(url, url, options=EngineOptions(poll_ms=10, grace_ms=200), claims=claims)
    worker = Worker("result-claims-worker")
    runs: list[int] = []

    @worker.handler(CAPABILITY, queue=QUEUE)
    def work(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
        runs.append(payload["size"])
        result = _result(int(payload["size"]))
        if tamper:  # the claim's key is taken already, by other bytes of the same size
            blob = canonical_json(result)
            claims.put(_key(ctx.tenant, result), blob.replace(b"rrrr", b"rrsr", 1))
        return result

    catalog = load_catalog(ROOT / "schemas" / "contracts")
    runtime = Runtime(worker, engine.transport, catalog=catalog, claims=claims, slots=2)
    stop = asyncio.Event()
    await engine.register_plan(_plan())
    await engine.start()
    task = asyncio.get_running_loop().create_task(runtime.run(stop))
    try:
        yield engine, runs
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        await engine.stop()


async def _ended(engine: Engine, run_id: str, seconds: float = 20) -> Any:
    async with asyncio.timeout(seconds):
        while True:
            run = await engine.load(run_id)
            if run is not None and run.terminal:
                return run
            await asyncio.sleep(0.02)


async def test_a_result_above_the_threshold_round_trips_into_the_run(
    tmp_path: Path, store: ObjectStore
) -> None:
    async with _stack(tmp_path, store) as (engine, _):
        big = await engine.start_run("result-claims", {"size": SIZE}, "acme")
        small = await engine.start_run("result-claims", {"size": 10}, "acme")
        done_big, done_small = await _ended(engine, big), await _ended(engine, small)
        history = await engine.history(big)
    assert len(canonical_json(_result(SIZE))) > THRESHOLD_BYTES
    assert done_big.status == "completed", done_big.stages["work"]
    assert done_big.stages["work"].result == _result(SIZE)  # the result itself, not its ref
    assert done_small.stages["work"].result == _result(10)
    # the large one travelled through the store, the small one did not
    assert store.get(_key("acme", _result(SIZE))).data == canonical_json(_result(SIZE))
    with pytest.raises(ObjectNotFound):
        store.get(_key("acme", _result(10)))
    assert "payloadRef" not in str([h.to_json() for h in history])


async def test_a_tampered_result_claim_is_a_recorded_terminal_corrupt_payload(
    tmp_path: Path, store: ObjectStore
) -> None:
    async with _stack(tmp_path, store, tamper=True) as (engine, runs):
        run_id = await engine.start_run("result-claims", {"size": SIZE}, "acme")
        run = await _ended(engine, run_id)
        history = [h.to_json() for h in await engine.history(run_id)]
    stage = run.stages["work"]
    assert run.status == "failed" and stage.error["code"] == "corrupt-payload", stage
    assert "digest" in stage.error["message"] and stage.result in (None, {})
    assert runs == [SIZE] and stage.attempt == 1  # terminal: never retried
    failed = [h for h in history if "corrupt-payload" in str(h)]
    assert failed, history  # recorded in the run's history, not dropped
