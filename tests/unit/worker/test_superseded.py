"""A superseded attempt's job is acknowledged unanswered and never run, over a real in-memory
queue, a real memory store and the real contract catalog; and what counts as superseded."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from accord.adapters import open_store
from accord.canonical import canonical_json
from accord.contracts.catalog import Catalog
from accord.engine.ports import Commit
from accord.engine.runtime.outbox import control_queue
from accord.worker import Context, Runtime, Worker
from accord.worker.superseded import CancelledFences, attempt_is_current, store_current
from tests.unit.worker.conftest import JobMaker, Recorder

CAP = "thumbnail.render@3"
STAGE = "render-thumbnail"
DIGEST = "sha256:" + "ab" * 32


def thumbnail() -> dict[str, Any]:
    preview = {"previewType": "gallery", "objectKey": "thumbs/m1.png", "width": 64, "height": 64,
               "contentType": "image/png", "sizeBytes": 10, "digest": DIGEST}  # fmt: skip
    return {"modelId": "m1", "previews": [preview]}


@asynccontextmanager
async def serving(runtime: Runtime) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(runtime.run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def counting(runs: list[tuple[str, int]]) -> Worker:
    def handler(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        runs.append((ctx.run_id, ctx.attempt))
        return thumbnail()

    worker = Worker("thumbnailer")
    worker.bind(CAP, handler)
    return worker


async def send(transport: Recorder, envelope: dict[str, Any]) -> None:
    await transport.publish("rendering", envelope["messageId"], canonical_json(envelope))


def record(attempt: int, fence: str, status: str, run: str = "running") -> dict[str, Any]:
    """A run record as the store keeps it, reduced to what the check reads."""
    current = {"attempt": attempt, "fence": fence, "status": status}
    stage = {"attempt": attempt, "fence": fence, "attempts": [current]}
    return {"status": run, "stages": {STAGE: stage}}


def test_only_what_the_record_shows_counts_as_superseded() -> None:
    fence = "f1" * 16
    assert attempt_is_current(record(1, fence, "queued"), STAGE, 1, fence)
    assert attempt_is_current(record(1, fence, "running"), STAGE, 1, fence)
    for gone in ("timed-out", "cancelled", "quarantined", "succeeded", "failed"):
        assert not attempt_is_current(record(1, fence, gone), STAGE, 1, fence), gone
    assert not attempt_is_current(record(2, "f2" * 16, "queued"), STAGE, 1, fence)  # retried
    assert not attempt_is_current(record(1, "ff" * 16, "queued"), STAGE, 1, fence)  # re-issued
    assert not attempt_is_current(record(1, fence, "queued", run="cancelled"), STAGE, 1, fence)
    # a record that does not know the attempt yet (a lagging replica), or no record: run it
    assert attempt_is_current(record(1, "f0" * 16, "running"), STAGE, 2, fence)
    assert attempt_is_current(None, STAGE, 1, fence)
    assert attempt_is_current({"status": "running", "stages": {}}, STAGE, 1, fence)


def test_cancelled_fences_keep_the_latest_only() -> None:
    fences = CancelledFences(limit=3)
    for n in range(5):
        fences.add("s", f"f{n}")
    assert len(fences) == 3
    assert ("s", "f0") not in fences and ("s", "f4") in fences and ("t", "f4") not in fences
    with pytest.raises(ValueError, match="limit"):
        CancelledFences(limit=0)


async def test_a_job_whose_cancellation_came_first_is_never_run(
    transport: Recorder, catalog: Catalog, job: JobMaker
) -> None:
    runs: list[tuple[str, int]] = []
    runtime = Runtime(counting(runs), transport, catalog=catalog)
    async with serving(runtime):
        request = {"kind": "request-cancellation", "job_id": "j", "queue": "rendering",
                   "stage": STAGE, "attempt": 1, "fence": "fe" * 16}  # fmt: skip
        await transport.publish(control_queue("rendering"), "c1", json.dumps(request).encode())
        async with asyncio.timeout(5):
            while (STAGE, "fe" * 16) not in runtime.cancelled:
                await asyncio.sleep(0.005)
        await send(transport, job(run_id="run_old", fence="fe" * 16))
        await send(transport, job(run_id="run_new", fence="f2" * 16))
        await transport.wait_for("succeeded")
        async with asyncio.timeout(5):
            while runtime.stats["superseded"] < 1:
                await asyncio.sleep(0.005)
    assert runs == [("run_new", 1)]
    assert {d["runId"] for d in transport.of("accepted")} == {"run_new"}  # no answer at all
    assert await transport.waiting("rendering") == []  # acknowledged, not left or returned


async def test_the_run_record_in_the_store_decides(
    transport: Recorder, catalog: Catalog, job: JobMaker
) -> None:
    store = open_store("memory://")
    await store.commit(Commit("run_1", 0, record(2, "f2" * 16, "queued")))
    runs: list[tuple[str, int]] = []
    runtime = Runtime(counting(runs), transport, catalog=catalog, current=store_current(store))
    async with serving(runtime):
        await send(transport, job(attempt=1, fence="f1" * 16))  # superseded by attempt 2
        await send(transport, job(attempt=2, fence="f2" * 16))
        await transport.wait_for("succeeded")
    assert runs == [("run_1", 2)]
    assert runtime.stats["superseded"] == 1
    assert {d["attempt"] for d in transport.of("accepted")} == {2}
    await store.close()


async def test_a_check_that_fails_lets_the_job_run(
    transport: Recorder, catalog: Catalog, job: JobMaker
) -> None:
    async def away(run_id: str, stage: str, attempt: int, fence: str) -> bool:
        raise ConnectionError("store away")

    runs: list[tuple[str, int]] = []
    runtime = Runtime(counting(runs), transport, catalog=catalog, current=away)
    async with serving(runtime):
        await send(transport, job())
        await transport.wait_for("succeeded")
    assert runs == [("run_1", 1)] and runtime.stats["superseded"] == 0
