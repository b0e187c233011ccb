"""Scale-out soak: model-ingest runs over two engine and four worker processes, with faults.

``workflows/model-ingest.yaml`` is compiled against ``schemas/contracts``; two engine processes
(no-op platform actions in-process) and four worker processes (the Worker SDK runtime, no-op
handlers) share a Redis store and either BullMQ or RabbitMQ. A seeded 10% of the jobs are hit by a
worker ``kill -9`` (before or after acceptance) or a duplicate delivery (a republished job, a
redelivered outcome); a supervisor here restarts killed workers. Both engines start half of the
runs, so outcomes for a run are taken by either engine and their commits race on the store.

At the end, with every process stopped: each run is completed (I1, none lost), its history
replays to its record (I12) and passes the per-run checks I2–I6 (no completion accepted twice, no
edge released twice, fences unique, nothing after the intent, live attempts have deadlines); the
outbox is empty (I7); no job, outcome or control message is left on any queue, and no dead letter.

``ACCORD_SOAK_RUNS`` (default 1000) sets the run count; the measured runs/s is printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aio_pika
import pytest
import redis
from scale_out_support import FAULTS, QUEUES

from accord.adapters import open_store, open_transport
from accord.adapters.transports.bullmq import BullmqTransport
from accord.adapters.transports.rabbitmq import RabbitmqTransport
from accord.cli.workflow import compile_file
from accord.contracts.sources import load_catalog
from accord.engine.intake import OUTCOMES_QUEUE
from accord.engine.outbox import control_queue
from accord.engine.ports import Store, Transport
from accord.engine.state import HistoryEntry, RunState
from accord.testing.invariants import assert_i1_terminal, assert_run_invariants
from accord.workflow.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tests/integration is no package: reach tests.* from the root
    sys.path.insert(0, str(ROOT))
from tests.services import REDIS_DB, REDIS_PORT, ensure_rabbitmq, ensure_redis  # noqa: E402

RUNS = int(os.environ.get("ACCORD_SOAK_RUNS", "1000"))
SEED = 6_2026
ENGINES, WORKERS, SLOTS = 2, 4, 16
PROC = Path(__file__).with_name("scale_out_proc.py")
ALL_QUEUES = (*QUEUES, OUTCOMES_QUEUE, *(control_queue(q) for q in QUEUES))
QUEUE_OPTS = "visibility_ms=2000&max_deliveries=20"
REDIS = f"redis://127.0.0.1:{REDIS_PORT}/{REDIS_DB}"
BROKER = "amqp://guest:guest@127.0.0.1:5672/"


@dataclass
class Fleet:
    """The child processes; :meth:`supervise` restarts workers that were killed."""

    tmp: Path
    engine_args: list[list[str]]
    worker_args: list[str]
    engines: list[subprocess.Popen[str]] = field(default_factory=list)
    workers: list[subprocess.Popen[str]] = field(default_factory=list)
    restarts: int = 0
    _logs: list[IO[str]] = field(default_factory=list)

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[str]:
        log = (self.tmp / f"{name}.stderr").open("a")
        self._logs.append(log)
        return subprocess.Popen(
            [sys.executable, str(PROC), *args], stdout=subprocess.PIPE, stderr=log, text=True,
            cwd=PROC.parent,
        )  # fmt: skip

    def start(self) -> None:
        self.engines = [self._spawn(f"engine{n}", a) for n, a in enumerate(self.engine_args)]
        self.workers = [self._spawn(f"worker{n}", self.worker_args) for n in range(WORKERS)]
        for proc in (*self.engines, *self.workers):
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            assert line == "ready", f"child did not start: {line!r}; see {self.tmp}/*.stderr"

    def supervise(self) -> None:
        for proc in self.engines:
            assert proc.poll() is None, f"an engine exited ({proc.returncode}): {self._tail()}"
        for n, proc in enumerate(self.workers):
            code = proc.poll()
            if code is None:
                continue
            assert code == -signal.SIGKILL, f"worker {n} exited with {code}: {self._tail()}"
            self.restarts += 1
            proc.communicate()  # reap it and close its pipe
            self.workers[n] = self._spawn(f"worker{n}", self.worker_args)

    def stop(self) -> list[dict[str, Any]]:
        """SIGTERM workers, then engines; each stops gracefully and reports its counters."""
        reports = []
        for group in (self.workers, self.engines):
            for proc in group:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in group:
                out, _ = proc.communicate(timeout=60)
                assert proc.returncode in (0, -signal.SIGKILL), f"{proc.returncode}: {self._tail()}"
                lines = out.strip().splitlines()
                if proc.returncode == 0 and lines:
                    reports.append(json.loads(lines[-1]))
        for log in self._logs:
            log.close()
        return reports

    def kill(self) -> None:
        for proc in (*self.engines, *self.workers):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)

    def _tail(self) -> str:
        return "".join(p.read_text()[-1500:] for p in sorted(self.tmp.glob("*.stderr")))


@pytest.fixture(scope="module")
def plan_json(tmp_path_factory: pytest.TempPathFactory) -> tuple[Plan, Path]:
    catalog = load_catalog(ROOT / "schemas" / "contracts")
    plan = compile_file(ROOT / "workflows" / "model-ingest.yaml", catalog).unwrap()
    path = tmp_path_factory.mktemp("plan") / "model-ingest.plan.json"
    path.write_text(json.dumps(plan.to_json()))
    return plan, path


@contextlib.asynccontextmanager
async def keyspace(broker: str) -> AsyncIterator[tuple[str, str, str]]:
    """``(store URL, transport URL, marks prefix)`` on fresh prefixes, all removed afterwards."""
    ensure_redis()
    tag = uuid.uuid4().hex[:10]
    store_url = f"{REDIS}?prefix=so{tag}&shards=4"
    if broker == "bullmq":
        transport_url = f"bullmq://127.0.0.1:{REDIS_PORT}/{REDIS_DB}?prefix=sob{tag}&stalled_ms=1000&{QUEUE_OPTS}"
    else:
        ensure_rabbitmq()
        transport_url = f"{BROKER}?prefix=so{tag}.&{QUEUE_OPTS}"
    try:
        yield store_url, transport_url, f"som{tag}"
    finally:
        if os.environ.get("ACCORD_SOAK_KEEP"):
            return
        client = redis.Redis(port=REDIS_PORT, db=REDIS_DB)
        for prefix in (f"so{tag}", f"sob{tag}", f"som{tag}"):
            keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
            for n in range(0, len(keys), 500):
                client.delete(*keys[n : n + 500])
        client.close()
        if broker == "rabbitmq":
            await _delete_queues(f"so{tag}.")


async def _delete_queues(prefix: str) -> None:
    connection = await aio_pika.connect(BROKER)
    async with connection:
        channel = await connection.channel()
        for queue in ALL_QUEUES:
            for name in (f"{prefix}{queue}", f"{prefix}{queue}.dead"):
                await channel.queue_delete(name)


async def pending_messages(transport: Transport, queue: str) -> int:
    """Messages waiting, delayed or held by a consumer on ``queue`` (0 when drained)."""
    if isinstance(transport, BullmqTransport):
        counts = await transport.queue(queue).getJobCounts(
            "wait", "active", "delayed", "paused", "prioritized"
        )
        return sum(int(n) for n in counts.values())
    assert isinstance(transport, RabbitmqTransport)
    name = await transport.declare(queue)
    assert transport.connection is not None
    channel = await transport.connection.channel()
    try:
        declared = await channel.declare_queue(name, passive=True)
        return int(declared.declaration_result.message_count or 0)
    finally:
        await channel.close()


async def wait_terminal(store: Store, run_ids: list[str], fleet: Fleet, timeout_s: float) -> None:
    pending = set(run_ids)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        fleet.supervise()
        batch = sorted(pending)[:400]
        for rid, stored in zip(batch, await asyncio.gather(*map(store.load, batch)), strict=True):
            if stored is not None and RunState.from_json(stored.state).terminal:
                pending.discard(rid)
        await asyncio.sleep(0.2)
    if pending:
        stuck = min(pending)
        stored = await store.load(stuck)
        history = await store.history(stuck)
        detail = json.dumps({"state": stored.state if stored else None, "history": history[-6:]})
        raise AssertionError(
            f"I1: {len(pending)} of {len(run_ids)} runs not terminal; {stuck}: {detail[:6000]}"
        )


async def wait_queues_drained(transport: Transport, fleet: Fleet, timeout_s: float = 30) -> None:
    """Late copies (duplicates, redeliveries of killed workers' jobs) are still being answered."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        fleet.supervise()
        counts = [await pending_messages(transport, q) for q in ALL_QUEUES]
        if not any(counts):
            return
        await asyncio.sleep(0.2)


def fault_marks(marks: str) -> Counter[str]:
    """Which faults the workers carried out (each marks its job once, before acting)."""
    with redis.Redis(port=REDIS_PORT, db=REDIS_DB) as client:
        keys = list(client.scan_iter(match=f"{marks}:*", count=1000))
        return Counter(v.decode() for v in (client.mget(keys) if keys else []) if v is not None)


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
        tag = uuid.uuid4().hex[:6]
        counts = [RUNS // ENGINES + (n < RUNS % ENGINES) for n in range(ENGINES)]
        fleet = Fleet(
            tmp_path,
            engine_args=[
                ["engine", store_url, transport_url, str(plan_path), f"e{n}", str(c), f"{tag}{n}x", str(go)]
                for n, c in enumerate(counts)
            ],
            worker_args=["worker", transport_url, REDIS, marks, str(SEED), str(tmp_path), str(SLOTS)],
        )  # fmt: skip
        run_ids = [f"run_{tag}{n}x{i:05d}" for n, c in enumerate(counts) for i in range(c)]
        store = open_store(store_url)
        transport = open_transport(transport_url)
        try:
            fleet.start()
            began = time.perf_counter()
            go.touch()
            await wait_terminal(store, run_ids, fleet, timeout_s=float(os.environ.get("ACCORD_SOAK_WAIT_S", "240")))
            elapsed = time.perf_counter() - began
            await wait_queues_drained(transport, fleet)
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
    jobs = 3 * RUNS
    assert set(fired) == set(FAULTS), f"every kind of fault fired: {fired}"
    assert 0.05 * jobs <= sum(fired.values()) <= 0.15 * jobs, f"about 10% of jobs hit: {fired}"
    kills = fired["kill-before-accept"] + fired["kill-after-accept"]
    assert 1 <= fleet.restarts <= kills
    assert refused, "duplicates reached the engine and were refused (recorded, not applied)"
    engines = [r for r in reports if "transitions" in r]
    assert len(engines) == ENGINES and all(r["transitions"] > 0 for r in engines)
    print(
        f"\nscale-out {broker}: {RUNS} runs in {elapsed:.1f} s = {RUNS / elapsed:.0f} runs/s; "
        f"faults {dict(fired)}; worker restarts {fleet.restarts}; refused {dict(refused)}; "
        f"engines {engines}"
    )
