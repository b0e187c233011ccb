"""Nothing poisons a commit: an outcome that cannot be stored (a lone surrogate in an id, NaN or an
infinity in a figure), or that names another tenant than its run, is quarantined alone, and the
legitimate outcomes that came with it (the worker's own ``accepted`` and ``succeeded`` of the same
run, alone or in the same batch) are committed; nothing is dead-lettered.

Through a real transport: the embedded SQLite queue (engine and worker on one database file),
BullMQ on Redis and RabbitMQ.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from engine_shell_support import assert_drained, wait_terminal

from accord.adapters import open_engine, open_transport
from accord.adapters.clock import SystemClock
from accord.engine.machine.state import HistoryEntry, RunState
from accord.engine.ports import Transport
from accord.engine.runtime.intake import OUTCOMES_QUEUE, encode_batch
from accord.engine.runtime.orchestrator import REFUSALS_RECORDED, Engine, EngineOptions
from accord.testing.plans import model_ingest_shape
from accord.testing.workers import outcome

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # tests/integration is no package: reach tests.* from the root
    sys.path.insert(0, ROOT)
from tests.services import REDIS_DB, ensure_rabbitmq, ensure_redis  # noqa: E402

BROKER = "amqp://guest:guest@127.0.0.1:5672/"

STAGES = ("render", "analyse", "metadata", "publish")
QUARANTINE = OUTCOMES_QUEUE + ".quarantine"


def _forged(job: dict[str, Any], kind: str, message_id: str, **payload: Any) -> tuple[str, bytes]:
    """An outcome for ``job``'s attempt (its fence and all) that canonical JSON cannot store;
    ``json.dumps`` writes NaN/Infinity as such and escapes a lone surrogate, as a forger would."""
    doc = {
        "messageId": message_id, "messageType": kind, "runId": job["runId"],
        "stage": job["stage"], "attempt": job["attempt"], "fence": job["fence"],
        "tenant": job.get("tenant", ""), "payload": payload,
    }  # fmt: skip
    return message_id.encode("ascii", "backslashreplace").decode(), json.dumps(doc).encode()


@asynccontextmanager
async def _stack(tmp_path: Path, name: str, url: str) -> AsyncIterator[tuple[Engine, Transport]]:
    """An engine on its own SQLite store over ``url``, and a worker's view of ``url``."""
    db = f"sqlite:///{tmp_path / f'{name}.db'}"
    engine = open_engine(db, url or db, SystemClock(), options=EngineOptions(poll_ms=10))
    worker = open_transport(url or db)
    try:
        yield engine, worker
    finally:
        await worker.close()
        await engine.stop()


@asynccontextmanager
async def _embedded(tmp_path: Path, name: str) -> AsyncIterator[tuple[Engine, Transport]]:
    async with _stack(tmp_path, name, "") as pair:  # the queue in the store's own file
        yield pair


@asynccontextmanager
async def _bullmq(tmp_path: Path, name: str) -> AsyncIterator[tuple[Engine, Transport]]:
    ensure_redis()
    prefix = f"poison-{name}-{time.monotonic_ns()}"
    url = f"bullmq://127.0.0.1:6379/{REDIS_DB}?prefix={prefix}&stalled_ms=300"
    async with _stack(tmp_path, name, url) as pair:
        yield pair


@asynccontextmanager
async def _rabbitmq(tmp_path: Path, name: str) -> AsyncIterator[tuple[Engine, Transport]]:
    import aio_pika

    ensure_rabbitmq()
    url = f"{BROKER}?prefix=poison{time.monotonic_ns()}."
    declared: set[str] = set()
    try:
        async with _stack(tmp_path, name, url) as (engine, worker):
            try:
                yield engine, worker
            finally:  # what both declared, read before they close
                declared = {
                    n for t in (engine.transport, worker) for n in getattr(t, "declared", ())
                }
    finally:
        connection = await aio_pika.connect(BROKER)
        async with connection:
            channel = await connection.channel()
            for queue in sorted(declared):
                await channel.queue_delete(queue)


TRANSPORTS = {"embedded": _embedded, "bullmq": _bullmq, "rabbitmq": _rabbitmq}


async def _jobs(worker: Transport, stage: str, n: int) -> list[tuple[Any, dict[str, Any]]]:
    got = []
    async with asyncio.timeout(10):
        async for delivery in worker.consume(stage, 10):
            got.append((delivery, json.loads(delivery.body)))
            if len(got) == n:
                break
    return got


async def _quarantined(worker: Transport, n: int, timeout_s: float = 10) -> list[dict[str, Any]]:
    """``n`` records from the quarantine queue (fails when fewer arrive in ``timeout_s``)."""
    records: list[dict[str, Any]] = []
    try:
        async with asyncio.timeout(timeout_s):
            async for delivery in worker.consume(QUARANTINE, 10):
                records.append(json.loads(delivery.body))
                await worker.ack(delivery)
                if len(records) == n:
                    break
    except TimeoutError:
        pass
    assert len(records) == n, f"{len(records)} quarantine record(s), wanted {n}: {records}"
    return records


async def _state(engine: Engine, run: str) -> RunState:
    state = await engine.load(run)
    assert state is not None, f"run {run} lost"
    return state


async def _drive(engine: Engine, worker: Transport, run: str, forge: Any) -> None:
    """Answer each stage's job with ``accepted`` then ``succeeded``; ``forge(job)`` adds what is
    published with the render stage's answers (a list of ``(message id, body)``)."""
    for stage in STAGES:
        ((delivery, job),) = await _jobs(worker, stage, 1)
        answers = [outcome(job, "accepted"), outcome(job, "succeeded", {"ok": True})]
        sent = forge(job, answers) if stage == "render" else answers
        for mid, body in sent:
            await worker.publish(OUTCOMES_QUEUE, mid, body)
        await worker.ack(delivery)


@pytest.mark.parametrize("kind", sorted(TRANSPORTS))
async def test_forged_unstorable_outcomes_are_quarantined_and_the_run_completes(
    tmp_path: Path, kind: str
) -> None:
    plan = model_ingest_shape(name=f"poison-lone-{kind}")
    async with TRANSPORTS[kind](tmp_path, "lone") as (engine, worker):
        await engine.register_plan(plan)
        await engine.start()
        run = await engine.start_run(plan.name, {"modelId": "m1"})

        def forge(job: dict[str, Any], answers: list[tuple[str, bytes]]) -> list[Any]:
            # the forgeries go first, so they share a commit with the worker's own answers
            return [
                _forged(job, "progress", "forged-nan", percent=float("nan")),
                _forged(job, "progress", "forged-inf", percent=float("inf")),
                _forged(job, "heartbeat", "forged-\ud800"),
                _forged(job, "succeeded", "forged-result", figure=float("-inf")),
                *answers,
            ]

        await _drive(engine, worker, run, forge)
        await wait_terminal(engine.store, [run])
        state = await _state(engine, run)
        assert state.status == "completed"
        assert state.stages["render"].result == {"ok": True}
        records = await _quarantined(worker, 4)
        reasons = {r["message_id"]: r["reason"] for r in records}
        assert reasons == {
            "forged-nan": "field 'payload.percent' is nan: numbers must be finite",
            "forged-inf": "field 'payload.percent' is inf: numbers must be finite",
            "forged-\\ud800": "field 'messageId' is not valid UTF-8 (a lone surrogate)",
            "forged-result": "field 'payload.figure' is -inf: numbers must be finite",
        }
        assert await worker.dead_letters(OUTCOMES_QUEUE) == []
        await assert_drained(engine, plan, [run])


@pytest.mark.parametrize("kind", sorted(TRANSPORTS))
async def test_a_batch_with_a_bad_member_commits_the_good_ones_and_quarantines_it(
    tmp_path: Path, kind: str
) -> None:
    plan = model_ingest_shape(name=f"poison-batch-{kind}")
    async with TRANSPORTS[kind](tmp_path, "batch") as (engine, worker):
        await engine.register_plan(plan)
        await engine.start()
        run = await engine.start_run(plan.name, {"modelId": "m1"})

        def forge(job: dict[str, Any], answers: list[tuple[str, bytes]]) -> list[Any]:
            accepted, succeeded = answers
            bad = _forged(job, "progress", "forged-nan", percent=float("nan"))
            return [encode_batch([accepted, bad, succeeded])]

        await _drive(engine, worker, run, forge)
        await wait_terminal(engine.store, [run])
        (record,) = await _quarantined(worker, 1)
        assert record["message_id"] == "forged-nan"
        assert record["member"] == 1
        assert record["reason"] == (
            "batch member 1: field 'payload.percent' is nan: numbers must be finite"
        )
        assert await worker.dead_letters(OUTCOMES_QUEUE) == []
        await assert_drained(engine, plan, [run])


async def test_bad_members_sharing_a_message_id_in_two_deliveries_are_two_records(
    tmp_path: Path,
) -> None:
    plan = model_ingest_shape(name="poison-dedup")
    async with _embedded(tmp_path, "dedup") as (engine, worker):
        await engine.register_plan(plan)
        await engine.start()
        run = await engine.start_run(plan.name, {"modelId": "m1"})
        ((delivery, job),) = await _jobs(worker, "render", 1)
        bad = _forged(job, "heartbeat", "same-id")
        bad = (bad[0], bad[1].replace(b'"attempt": 1', b'"attempt": "one"'))
        # two different batches, each with the same malformed member
        for good in (outcome(job, "heartbeat"), outcome(job, "progress", {"percent": 10})):
            await worker.publish(OUTCOMES_QUEUE, *encode_batch([good, bad]))
        records = await _quarantined(worker, 2)
        assert [r["message_id"] for r in records] == ["same-id", "same-id"]
        assert len({r["delivery"] for r in records}) == 2
        assert await worker.dead_letters(OUTCOMES_QUEUE) == []
        await worker.ack(delivery)
        assert (await engine.load(run)) is not None


async def test_an_outcome_naming_another_tenant_is_refused_whatever_its_fence(
    tmp_path: Path,
) -> None:
    plan = model_ingest_shape(name="poison-tenant")
    async with _embedded(tmp_path, "tenant") as (engine, worker):
        await engine.register_plan(plan)
        await engine.start()
        run = await engine.start_run(plan.name, {"modelId": "m1"}, tenant="acme")
        ((delivery, job),) = await _jobs(worker, "render", 1)
        assert job["tenant"] == "acme"
        before = await _state(engine, run)
        foreign = job | {"tenant": "other", "messageId": job["messageId"] + "-forged"}
        await worker.publish(OUTCOMES_QUEUE, *outcome(foreign, "succeeded", {"stolen": True}))
        (record,) = await _quarantined(worker, 1)
        assert record["reason"] == (
            f"outcome names tenant 'other' but run {run!r} belongs to tenant 'acme'"
        )
        after = await _state(engine, run)
        assert after == before  # a refused outcome never changes the run
        assert after.stages["render"].status == "queued"
        history = [HistoryEntry.from_json(h) for h in await engine.store.history(run)]
        assert all(h.event["kind"] != "stage-succeeded" for h in history)
        # the worker's own answer, with the run's tenant, is taken
        await worker.publish(OUTCOMES_QUEUE, *outcome(job, "succeeded", {"ok": True}))
        await worker.ack(delivery)
        async with asyncio.timeout(10):
            while (await _state(engine, run)).stages["render"].status != "completed":
                await asyncio.sleep(0.02)
        assert await worker.dead_letters(OUTCOMES_QUEUE) == []


@pytest.mark.parametrize("kind", sorted(TRANSPORTS))
async def test_a_flood_of_forged_stale_outcomes_is_recorded_bounded(
    tmp_path: Path, kind: str
) -> None:
    plan = model_ingest_shape(name=f"poison-flood-{kind}")
    flood = REFUSALS_RECORDED + 25
    async with TRANSPORTS[kind](tmp_path, "flood") as (engine, worker):
        await engine.register_plan(plan)
        await engine.start()
        run = await engine.start_run(plan.name, {"modelId": "m1"})

        def forge(job: dict[str, Any], answers: list[tuple[str, bytes]]) -> list[Any]:
            forged = job | {"fence": "forged"}
            stale = [outcome(forged | {"messageId": f"f{n}"}, "heartbeat") for n in range(flood)]
            return [answers[0], *stale, answers[1]]

        await _drive(engine, worker, run, forge)
        await wait_terminal(engine.store, [run])
        records = await _quarantined(worker, flood - REFUSALS_RECORDED)
        assert all("refusals recorded for this attempt" in r["reason"] for r in records)
        history = [HistoryEntry.from_json(h) for h in await engine.store.history(run)]
        stale = [h for h in history if h.reason == "stale"]
        assert len(stale) == REFUSALS_RECORDED
        assert await worker.dead_letters(OUTCOMES_QUEUE) == []
        await assert_drained(engine, plan, [run])
