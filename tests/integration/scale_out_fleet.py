"""The parent side of the scale-out soak: the child processes, their keyspace and the drain checks.

:class:`Fleet` starts the engine and worker processes (``scale_out_proc.py``), restarts workers
that were killed (:meth:`Fleet.supervise`, called from every wait loop) and stops them all
gracefully, workers first. :func:`keyspace` hands out store, transport and fault-mark URLs on
fresh prefixes and removes every key and queue afterwards. :func:`pending_messages` counts what a
queue still holds on either broker; :func:`wait_terminal` and :func:`wait_settled` are the two
waits of the soak.
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
import redis
from scale_out_support import QUEUES

from accord.adapters.transports.bullmq import BullmqTransport
from accord.adapters.transports.rabbitmq import RabbitmqTransport
from accord.engine.machine.state import RunState
from accord.engine.ports import Store, Transport
from accord.engine.runtime.intake import OUTCOMES_QUEUE
from accord.engine.runtime.outbox import control_queue
from accord.engine.runtime.shards import shard_queue

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tests/integration is no package: reach tests.* from the root
    sys.path.insert(0, str(ROOT))
from tests.services import (  # noqa: E402
    REDIS_DB,
    REDIS_PORT,
    ensure_rabbitmq,
    ensure_redis,
    ensure_redis_cluster,
)

WORKERS, SLOTS = 4, 16
PROC = Path(__file__).with_name("scale_out_proc.py")
SHARDS = 4  # the store's shard count (keyspace): each shard has an outcome queue of its own
ALL_QUEUES = (
    *QUEUES,
    OUTCOMES_QUEUE,
    *(shard_queue(OUTCOMES_QUEUE, s, SHARDS) for s in range(SHARDS)),
    *(control_queue(q) for q in QUEUES),
)
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
    down: set[int] = field(default_factory=set)  # engines killed on purpose, not yet restarted
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
            self._ready(proc)

    def _ready(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line == "ready", f"child did not start: {line!r}; see {self.tmp}/*.stderr"

    def kill_engine(self, n: int) -> None:
        """``kill -9`` engine ``n`` and reap it: :meth:`supervise` expects it gone from now on,
        until :meth:`restart_engine`."""
        proc = self.engines[n]
        proc.kill()
        proc.communicate(timeout=10)
        self.down.add(n)

    def restart_engine(self, n: int, args: list[str]) -> None:
        """Start engine ``n`` again (its log goes on in the same file); returns once it is ready:
        beating, and taking its share of the shards as the others hand them over."""
        proc = self._spawn(f"engine{n}", args)
        self._ready(proc)
        self.engines[n] = proc
        self.down.discard(n)

    def supervise(self) -> None:
        for n, proc in enumerate(self.engines):
            if n in self.down:
                continue
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
        engines = [p for n, p in enumerate(self.engines) if n not in self.down]
        for group in (self.workers, engines):
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
        """Kill what is still running and close every pipe and log: after a failed test, the
        next one must not meet this one's unclosed files as ResourceWarnings."""
        for proc in (*self.engines, *self.workers):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()
        for log in self._logs:
            log.close()

    def _tail(self) -> str:
        return "".join(p.read_text()[-1500:] for p in sorted(self.tmp.glob("*.stderr")))


@contextlib.asynccontextmanager
async def keyspace(broker: str, store: str = "redis") -> AsyncIterator[tuple[str, str, str]]:
    """``(store URL, transport URL, marks prefix)`` on fresh prefixes, all removed afterwards.
    ``store="redis-cluster"`` puts the store on the test process's shared Redis Cluster (three
    masters with a replica each; thrown away, keys and all, at exit); the queues and the fault
    marks stay on the standalone Redis."""
    ensure_redis()
    tag = uuid.uuid4().hex[:10]
    store_url = f"{REDIS}?prefix=so{tag}&shards={SHARDS}"
    if store == "redis-cluster":
        store_url = ensure_redis_cluster().url(prefix=f"so{tag}", shards=SHARDS)
    if broker == "bullmq":
        transport_url = f"bullmq://127.0.0.1:{REDIS_PORT}/{REDIS_DB}?prefix=sob{tag}&stalled_ms=1000&{QUEUE_OPTS}"
    else:
        ensure_rabbitmq()
        transport_url = f"{BROKER}?prefix=so{tag}.&{QUEUE_OPTS}"
    try:
        yield store_url, transport_url, f"som{tag}"
    finally:
        client = redis.Redis(port=REDIS_PORT, db=REDIS_DB)
        for prefix in (
            () if os.environ.get("ACCORD_SOAK_KEEP") else (f"so{tag}", f"sob{tag}", f"som{tag}")
        ):
            keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
            for n in range(0, len(keys), 500):
                client.delete(*keys[n : n + 500])
        client.close()
        if broker == "rabbitmq" and not os.environ.get("ACCORD_SOAK_KEEP"):
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
        batch = sorted(pending)[:32]  # runs in start order: the later ones finish later
        for rid, stored in zip(batch, await asyncio.gather(*map(store.load, batch)), strict=True):
            if stored is not None and RunState.from_json(stored.state).terminal:
                pending.discard(rid)
        if pending.intersection(batch):
            await asyncio.sleep(0.1)
    if pending:
        stuck = min(pending)
        stored = await store.load(stuck)
        history = await store.history(stuck)
        detail = json.dumps({"state": stored.state if stored else None, "history": history[-6:]})
        raise AssertionError(
            f"I1: {len(pending)} of {len(run_ids)} runs not terminal; {stuck}: {detail[:6000]}"
        )


async def wait_settled(transport: Transport, fleet: Fleet, quiet_s: float = 6.0) -> None:
    """Every queue stays empty for ``quiet_s``, longer than the engines' sweep grace: late copies
    (duplicates, republished entries, killed workers' jobs) have all been answered, and no outbox
    entry is left for a sweep to publish again once the workers are gone."""
    deadline, quiet_since = time.monotonic() + 90, None
    while True:
        fleet.supervise()
        busy = [q for q in ALL_QUEUES if await pending_messages(transport, q)]
        now = time.monotonic()
        quiet_since = None if busy else quiet_since or now
        if quiet_since is not None and now - quiet_since >= quiet_s:
            return
        assert now < deadline, f"queues {busy} never settled"
        await asyncio.sleep(0.2)


def fault_marks(marks: str) -> Counter[str]:
    """Which faults the workers carried out (each marks its job once, before acting)."""
    with redis.Redis(port=REDIS_PORT, db=REDIS_DB) as client:
        keys = list(client.scan_iter(match=f"{marks}:*", count=1000))
        return Counter(v.decode() for v in (client.mget(keys) if keys else []) if v is not None)
