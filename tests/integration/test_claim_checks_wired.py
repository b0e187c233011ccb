"""Claim checks wired end to end on the embedded default: the engine checks a large job payload
in to the object store, the real worker runtime checks it out and verifies it.

One SQLite file is the store and the queue (the joint commit path: the job rides inside the
transition's commit), the claim store is a folder, and the worker is the real
:class:`~accord.worker.Runtime` with the real contracts validating every envelope.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from accord.adapters import open_engine
from accord.adapters.objects import FileObjectStore
from accord.contracts.catalog import Catalog
from accord.contracts.sources import load_catalog
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.objects.claims import THRESHOLD_BYTES
from accord.testing.plans import pin
from accord.worker import Runtime, Worker
from accord.workflow.plan import Binding, Plan, RetryPolicy, TaskStage, Timeouts

ROOT = Path(__file__).resolve().parents[2]
QUEUE = "claims.work"
CAPABILITY = "claimstest@1"  # its request type is a valid envelope messageType


def _catalog() -> Catalog:
    return load_catalog(ROOT / "schemas" / "contracts")


def _plan() -> Plan:
    task = TaskStage(
        name="work",
        type="worker",
        capability=pin("claimstest"),
        input={"blob": Binding(source="context", path=("blob",), raw="${context.blob}")},
        on_success="completed",
        on_failure="failed",
        retry=RetryPolicy(max_attempts=3, initial_backoff_ms=20, max_backoff_ms=20),
        timeouts=Timeouts(queue_deadline_ms=60_000, execution_deadline_ms=60_000),
        queue=QUEUE,
    )
    return Plan.create(name="claims-flow", version="1.0.0", entry="work", stages=(task,))


def _engine(tmp: Path, claims: FileObjectStore) -> Engine:
    url = f"sqlite:///{tmp / 'accord.db'}"
    return open_engine(url, url, options=EngineOptions(poll_ms=10, grace_ms=200), claims=claims)


@contextlib.asynccontextmanager
async def _worker(
    engine: Engine, claims: FileObjectStore, seen: list[dict[str, Any]]
) -> AsyncIterator[Runtime]:
    worker = Worker("claims-worker")

    @worker.handler(CAPABILITY, queue=QUEUE)
    def work(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
        seen.append(payload)
        return {"length": len(payload["blob"])}

    runtime = Runtime(worker, engine.transport, catalog=_catalog(), claims=claims, slots=2)
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(runtime.run(stop))
    try:
        yield runtime
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def _ended(engine: Engine, run_id: str, seconds: float = 20) -> Any:
    async with asyncio.timeout(seconds):
        while True:
            run = await engine.load(run_id)
            if run is not None and run.terminal:
                return run
            await asyncio.sleep(0.02)


def _claim_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "claims").rglob("*.json") if p.is_file())


async def test_a_payload_above_the_threshold_round_trips_through_engine_and_worker(
    tmp_path: Path,
) -> None:
    claims = FileObjectStore(tmp_path / "objects")
    engine = _engine(tmp_path, claims)
    blob = "x" * (THRESHOLD_BYTES + 1000)
    seen: list[dict[str, Any]] = []
    try:
        await engine.register_plan(_plan())
        await engine.start()
        async with _worker(engine, claims, seen):
            big = await engine.start_run("claims-flow", {"blob": blob}, "acme")
            small = await engine.start_run("claims-flow", {"blob": "tiny"}, "acme")
            done_big, done_small = await _ended(engine, big), await _ended(engine, small)
        assert done_big.status == "completed", done_big.stages["work"]
        assert done_small.status == "completed"
        assert done_big.stages["work"].result == {"length": len(blob)}
        assert sorted(len(p["blob"]) for p in seen) == [4, len(blob)]  # the handler saw it whole
        [claim] = _claim_files(tmp_path / "objects")  # only the large payload was checked in
        assert claim.relative_to(tmp_path / "objects").parts[:3] == ("claims", "acme", "sha256")
        assert json.loads(claim.read_bytes()) == {"blob": blob}
    finally:
        await engine.stop()


async def test_a_tampered_claim_is_refused_as_corrupt_payload_and_not_retried(
    tmp_path: Path,
) -> None:
    claims = FileObjectStore(tmp_path / "objects")
    engine = _engine(tmp_path, claims)
    blob = "y" * (THRESHOLD_BYTES * 2)
    seen: list[dict[str, Any]] = []
    try:
        await engine.register_plan(_plan())
        await engine.start()
        run_id = await engine.start_run("claims-flow", {"blob": blob}, "acme")
        async with asyncio.timeout(10):  # the job is in the queue, its payload checked in
            while not _claim_files(tmp_path / "objects"):
                await asyncio.sleep(0.02)
        [claim] = _claim_files(tmp_path / "objects")
        data = bytearray(claim.read_bytes())
        data[20] = ord("z")  # same size, other bytes: only the digest can tell
        claim.chmod(0o644)
        claim.write_bytes(bytes(data))
        async with _worker(engine, claims, seen):
            run = await _ended(engine, run_id)
        assert seen == []  # the handler never ran on the altered bytes
        stage = run.stages["work"]
        assert run.status == "failed" and stage.error["code"] == "corrupt-payload", stage
        assert "digest" in stage.error["message"]
        assert stage.attempt == 1  # terminal: the same bytes would fail again
    finally:
        await engine.stop()
