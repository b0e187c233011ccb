"""`accord demo --store redis://… --transport bullmq://…|amqp://…`: the same demo over the real
store and brokers. Each model goes through the reference workers by way of BullMQ or RabbitMQ, and
its run and history are in Redis (read back here), not in a SQLite file. Both go on fresh key and
queue prefixes, removed afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest
from tests.e2e.test_demo import scratch  # noqa: F401 - the scratch repository fixture
from tests.services import REDIS_DB, REDIS_PORT, ensure_rabbitmq, ensure_redis, redis_url
from typer.testing import CliRunner

from accord.adapters import open_store
from accord.cli import app
from accord.engine.machine.state import HistoryEntry, RunState
from accord.engine.runtime.intake import OUTCOMES_QUEUE
from accord.engine.runtime.outbox import control_queue

BROKER = "amqp://guest:guest@127.0.0.1:5672/"
QUEUES = ("rendering", "analysis", "metadata")


@contextlib.contextmanager
def urls(broker: str) -> Iterator[tuple[str, str]]:
    ensure_redis()
    tag = uuid.uuid4().hex[:10]
    store = redis_url(f"demo{tag}")
    if broker == "bullmq":
        redis_url(f"demob{tag}")  # registers the prefix for removal at exit
        yield store, f"bullmq://127.0.0.1:{REDIS_PORT}/{REDIS_DB}?prefix=demob{tag}"
        return
    ensure_rabbitmq()
    try:
        yield store, f"{BROKER}?prefix=demo{tag}."
    finally:
        asyncio.run(_delete_queues(f"demo{tag}."))


async def _delete_queues(prefix: str) -> None:
    names = [*QUEUES, OUTCOMES_QUEUE, *(control_queue(q) for q in QUEUES)]
    async with await aio_pika.connect(BROKER) as connection:
        channel = await connection.channel()
        for name in names:
            for suffix in ("", ".dead", ".quarantine"):
                await channel.queue_delete(f"{prefix}{name}{suffix}")


async def recorded(store_url: str, run_id: str) -> tuple[RunState, list[HistoryEntry]]:
    store = open_store(store_url)
    try:
        stored = await store.load(run_id)
        assert stored is not None, f"run {run_id} is not in {store_url}"
        history = [HistoryEntry.from_json(h) for h in await store.history(run_id)]
        return RunState.from_json(stored.state), history
    finally:
        await store.close()


@pytest.mark.node  # the contract phase generates the TypeScript bindings too
@pytest.mark.slow
@pytest.mark.parametrize("broker", ["bullmq", "rabbitmq"])
def test_the_demo_runs_over_redis_and_a_broker(scratch: Path, broker: str) -> None:  # noqa: F811
    with urls(broker) as (store, transport):
        args = ["demo", "--models", str(scratch / "models"), "--state", str(scratch / "state"),
                "--store", store, "--transport", transport, "--json"]  # fmt: skip
        result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        rows = json.loads(result.output[result.output.index("[") :])
        assert sorted(r["modelId"] for r in rows) == ["cube", "plate-with-hole"]
        for row in rows:
            assert row["status"] == "completed" and row["route"] == "workers", row
            run, history = asyncio.run(recorded(store, row["runId"]))
            assert run.status == "completed"
            kinds = {(h.event.get("kind"), h.event.get("stage")) for h in history if h.accepted}
            for stage in ("render-thumbnail", "semantic-analysis", "technical-metadata"):
                assert ("stage-accepted", stage) in kinds, f"{stage} was not served by a worker"
        assert not (scratch / "state" / "accord.db").exists()  # nothing went to the SQLite default


def test_store_and_transport_go_together() -> None:
    result = CliRunner().invoke(app, ["demo", "--store", "redis://127.0.0.1:6379/15"])
    assert result.exit_code == 2
    assert "--store and --transport go together" in result.output
