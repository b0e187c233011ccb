"""Scale-out soak: model-ingest runs over two engine and four worker processes, with faults.

``workflows/model-ingest.yaml`` is compiled against ``schemas/contracts``; two engine processes
(no-op platform actions in-process) and four worker processes (the Worker SDK runtime, no-op
handlers) share a Redis store and either BullMQ or RabbitMQ. A seeded 10% of the jobs are hit by a
worker ``kill -9`` (before or after acceptance) or a duplicate delivery (a republished job, a
redelivered outcome); a supervisor here restarts killed workers. Both engines start half of the
runs, so outcomes for a run are taken by either engine and their commits race on the store.

Each worker incarnation keeps its acceptance records in a file of its own, as on a replaced
machine, so a job accepted by a killed worker runs again wherever it is redelivered and the engine
accepts one completion of the attempt. Once every run is terminal the queues must stay empty for
longer than the engines' sweep grace before the workers stop: late copies are all answered.

At the end, with every process stopped: each run is completed (I1, none lost), its history
replays to its record (I12) and passes the per-run checks I2–I6 (no completion accepted twice, no
edge released twice, fences unique, nothing after the intent, live attempts have deadlines); the
outbox is empty (I7); no job, outcome or control message is left on any queue, and no dead letter.

``ACCORD_SOAK_RUNS`` sets the run count (500 in ``make test``, 1000 in ``make soak``); the measured
runs/s is printed.
``ACCORD_SOAK_KEEP=1`` leaves the keys and queues in place for inspection after a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from pathlib import Path

import pytest
from scale_out_fleet import (
    ALL_QUEUES,
    REDIS,
    SLOTS,
    Fleet,
    fault_marks,
    keyspace,
    pending_messages,
    wait_settled,
    wait_terminal,
)
from scale_out_support import FAULTS

from accord.adapters import open_store, open_transport
from accord.adapters.transports.bullmq import BullmqTransport
from accord.cli.workflow import compile_file
from accord.contracts.sources import load_catalog
from accord.engine.machine.state import HistoryEntry, RunState
from accord.engine.ports import Store
from accord.testing.invariants import assert_i1_terminal, assert_run_invariants
from accord.workflow.plan import Plan

ROOT = Path(__file__).resolve().parents[2]

RUNS = int(os.environ.get("ACCORD_SOAK_RUNS", "500"))
SEED = 6_2026
ENGINES = 2


@pytest.fixture(scope="module")
def plan_json(tmp_path_factory: pytest.TempPathFactory) -> tuple[Plan, Path]:
    catalog = load_catalog(ROOT / "schemas" / "contracts")
    plan = compile_file(ROOT / "workflows" / "model-ingest.yaml", catalog).unwrap()
    path = tmp_path_factory.mktemp("plan") / "model-ingest.plan.json"
    path.write_text(json.dumps(plan.to_json()))
    return plan, path


async def check_runs(store: Store, plan: Plan, run_ids: list[str]) -> Counter[str]:
    """I1 and I12, I2–I6 per run; returns why refused history entries were refused."""
    refused: Counter[str] = Counter()
    for rid in run_ids:
        stored = await store.load(rid)
        assert stored is not None, f"I1: run {rid} lost"
        run = RunState.from_json(stored.state)
        history = [HistoryEntry.from_json(h) for h in await store.history(rid)]
        assert_i1_terminal(run)
        assert run.status == "completed", f"run {rid} ended {run.status}: {history[-3:]}"
        assert_run_invariants(plan, run, history)
        refused.update(str(h.reason) for h in history if not h.accepted)
    return refused


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("broker", ["bullmq", "rabbitmq"])
async def test_two_engines_four_workers_with_kills_and_duplicates(
    broker: str, tmp_path: Path, plan_json: tuple[Plan, Path]
) -> None:
    plan, plan_path = plan_json
    async with keyspace(broker) as (store_url, transport_url, marks):
        go = tmp_path / "go"
        tag = "soak"  # fixed run ids, so the seeded draw hits the same jobs every time
        counts = [RUNS // ENGINES + (n < RUNS % ENGINES) for n in range(ENGINES)]
        fleet = Fleet(
            tmp_path,
            engine_args=[
                ["engine", store_url, transport_url, str(plan_path), f"e{n}", str(c),
                 f"{tag}{n}x", str(go)]
                for n, c in enumerate(counts)
            ],
            worker_args=["worker", transport_url, REDIS, marks, str(SEED), str(tmp_path),
                         str(SLOTS)],
        )  # fmt: skip
        run_ids = [f"run_{tag}{n}x{i:05d}" for n, c in enumerate(counts) for i in range(c)]
        store = open_store(store_url)
        transport = open_transport(transport_url)
        try:
            fleet.start()
            began = time.perf_counter()
            go.touch()
            await wait_terminal(
                store, run_ids, fleet, timeout_s=float(os.environ.get("ACCORD_SOAK_WAIT_S", "240"))
            )
            elapsed = time.perf_counter() - began
            await wait_settled(transport, fleet)
            reports = fleet.stop()
        finally:
            fleet.kill()
        refused = await check_runs(store, plan, run_ids)
        assert await store.claim_outbox(1000, "drain-check", 0) == [], "I7: outbox not drained"
        for queue in ALL_QUEUES:
            assert await pending_messages(transport, queue) == 0, f"I1: {queue} not drained"
            assert await transport.dead_letters(queue) == [], f"dead letters on {queue}"
        fired = fault_marks(marks)
        await transport.close()
        await store.close()
    kills = fired["kill-before-accept"] + fired["kill-after-accept"]
    assert fleet.restarts <= kills, "a worker died of something else than its fault"
    jobs = 3 * RUNS
    if jobs >= 600:  # the seeded draw is a sample: with few jobs, a kind may not come up
        assert set(fired) == set(FAULTS), f"every kind of fault fired: {fired}"
        assert 0.05 * jobs <= sum(fired.values()) <= 0.15 * jobs, f"about 10% hit: {fired}"
        assert fleet.restarts >= 1, "killed workers were restarted"
        assert refused, "duplicates reached the engine and were refused (recorded, not applied)"
    engines = [r for r in reports if "transitions" in r]
    assert len(engines) == ENGINES and all(r["transitions"] > 0 for r in engines)
    print(
        f"\nscale-out {broker}: {RUNS} runs in {elapsed:.1f} s = {RUNS / elapsed:.0f} runs/s; "
        f"faults {dict(fired)}; worker restarts {fleet.restarts}; refused {dict(refused)}; "
        f"engines {engines}"
    )


async def test_a_bullmq_ack_settles_the_job_it_names_among_jobs_fetched_together() -> None:
    """bullmq-py locks jobs fetched in one go with one token; the soak's lost attempts came from
    acks settling a sibling job instead of their own."""
    async with keyspace("bullmq") as (_, transport_url, _):
        transport = open_transport(transport_url)
        assert isinstance(transport, BullmqTransport)
        try:
            for n in range(8):
                await transport.publish("siblings", f"m{n}", b"{}")
            stream = transport.consume("siblings", prefetch=8)
            held = [await asyncio.wait_for(anext(stream), 10) for _ in range(8)]
            acked = sorted(d.message_id for d in held[:3])
            for delivery in held[:3]:
                await transport.ack(delivery)
            done = await transport.queue("siblings").getJobs(["completed"])
            assert sorted(j.data["message_id"] for j in done) == acked
            for delivery in held[3:]:
                await transport.ack(delivery)
            assert await pending_messages(transport, "siblings") == 0
        finally:
            await transport.close()
