"""Message triggers on the embedded queue and on BullMQ: validated, deduplicated, quarantined."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.integration._triggers_kit import MESSAGE, OPENERS, engines, plan

from accord.adapters.clock import SystemClock
from accord.adapters.ingress.triggers import MessageTriggers, TriggerIntake, TriggerSources
from accord.engine.runtime.wire import quarantine_queue, read_quarantine

BACKENDS = sorted(OPENERS)


async def _until(check: object, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_good_events_start_runs_bad_ones_are_quarantined_nothing_dropped(
    tmp_path: Path, backend: str
) -> None:
    queue = f"uploads-{uuid.uuid4().hex[:8]}"
    p = plan(MESSAGE.replace("{queue}", queue), name="queued")
    async with engines(OPENERS[backend](tmp_path), SystemClock(), p, count=1) as (engine,):
        intake = TriggerIntake(engine, TriggerSources())
        consumer = MessageTriggers(intake, engine.transport, p.name, "from-queue", queue)
        consumer.start()
        try:
            sent = {
                "good-1": json.dumps({"modelId": "q-1"}).encode(),
                "good-1-again": json.dumps({"modelId": "q-1"}).encode(),  # same dedupe key
                "good-2": json.dumps({"modelId": "q-2", "objectKey": "k/2.glb"}).encode(),
                "not-json": b"\xff{",
                "breaks-contract": json.dumps({"modelId": 42}).encode(),
                "unknown-field": json.dumps({"modelId": "q-3", "colour": "red"}).encode(),
            }
            for mid, body in sent.items():
                await engine.transport.publish(queue, mid, body)

            async def settled() -> bool:
                return len(consumer.started) + len(consumer.quarantined) == len(sent)

            await _until(settled)
        finally:
            await consumer.stop()
        assert len(consumer.started) == 3
        assert len(set(consumer.started)) == 2  # the repeated key named the first run
        quarantined = {q["message_id"]: q["reason"] for q in consumer.quarantined}
        assert set(quarantined) == {"not-json", "breaks-contract", "unknown-field"}
        assert "not JSON" in quarantined["not-json"]
        assert "modelId" in quarantined["breaks-contract"]
        assert "colour" in quarantined["unknown-field"]
        # the quarantine queue holds every refused message with its reason and body
        kept: dict[str, str] = {}
        async for delivery in engine.transport.consume(quarantine_queue(queue), 16):
            record = read_quarantine(delivery.body)
            kept[record["message_id"]] = record["reason"]
            await engine.transport.ack(delivery)
            if len(kept) == 3:
                break
        assert kept == quarantined
        runs = await engine.store.list_runs(10, workflow="queued")
        contexts: list[Any] = [r.state["context"] for r in runs]
        assert sorted(c["modelId"] for c in contexts) == ["q-1", "q-2"]


async def test_a_refused_start_is_quarantined_with_the_admission_reason(tmp_path: Path) -> None:
    queue = f"uploads-{uuid.uuid4().hex[:8]}"
    p = plan(MESSAGE.replace("{queue}", queue), "budgets:\n  max_concurrent_runs: 1", name="queued")
    async with engines(OPENERS["embedded"](tmp_path), SystemClock(), p, count=1) as (engine,):
        intake = TriggerIntake(engine, TriggerSources())
        consumer = MessageTriggers(intake, engine.transport, p.name, "from-queue", queue)
        consumer.prefetch = 1
        consumer.start()
        try:
            for i in range(2):
                await engine.transport.publish(
                    queue, f"m{i}", json.dumps({"modelId": f"c{i}"}).encode()
                )

            async def settled() -> bool:
                return len(consumer.started) + len(consumer.quarantined) == 2

            await _until(settled)
        finally:
            await consumer.stop()
        assert len(consumer.started) == 1
        [refused] = consumer.quarantined
        assert "admission-concurrency-workflow" in refused["reason"]
