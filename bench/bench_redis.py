"""Commits per second through the Redis store, next to a raw redis-py Lua compare-and-set loop.

One commit has the shape of one engine transition: the run record's compare-and-set + 1 history
entry + 1 outbox entry + 1 timer upsert + the run-index update. The raw loop runs a bare Lua
script doing the same compare-and-set, history push, stream add and timer add on pre-serialised
JSON, with the same client, server and key layout, so the difference is what the store adds
(serialisation, argument building, validation, the index, reply decoding). Figures (per second):

- ``raw.one_task`` / ``store.one_task``: one run, commits awaited one after another.
- ``raw.many_tasks`` / ``store.many_tasks``: ``RUNS`` runs committing at once from one process.
- ``raw.pipelined``: ``RUNS`` runs' commits sent as one pipeline per round: the ceiling of one
  connection. The store's port awaits each commit, so it has no pipelined mode of its own, but
  its call group sends the commits of concurrent tasks as one pipeline (``many_tasks``).
- ``ratio.*``: store rate / raw rate for the same mode.
- ``cpu_us.*``: process CPU per commit (µs) of each mode; unlike the rates, it barely moves when
  other work shares the machine.
- ``replicated.*``: the store's ``one_task`` and ``many_tasks`` on a private primary with one
  replica (both started here, no persistence, like the shared server), opened with
  ``replicas=0`` and with ``replicas=1`` (every round of writes then waits for the replica:
  ``WAIT 1``), so the pair shows what waiting for a replica costs.

Needs Redis on 127.0.0.1:6379 (database 15, a throwaway key prefix, deleted afterwards) and the
``redis-server`` binary for the private pair.
Run: ``python -m bench.bench_redis`` (or ``--smoke``); ``python -m bench`` runs it with the rest.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
import redis.asyncio as aioredis

from accord.adapters.stores.redis import RedisStore
from accord.engine.ports import Commit, OutboxEntry, Timer
from accord.loop import run as run_loop

URL = "redis://127.0.0.1:6379/15"
RUNS = 32
STATE = {"stages": {f"s{n}": {"status": "running", "attempt": 1} for n in range(8)}}

RAW_CAS = """
if redis.call('HGET', KEYS[1], 'v') ~= ARGV[1] then return -2 end
redis.call('HSET', KEYS[1], 'v', ARGV[1] + 1, 'state', ARGV[2])
redis.call('RPUSH', KEYS[2], ARGV[3])
redis.call('XADD', KEYS[3], '*', 'e', ARGV[4], 'p', ARGV[3])
redis.call('ZADD', KEYS[4], ARGV[5], 'deadline')
return ARGV[1] + 1
"""


def _commit(run_id: str, version: int, n: int) -> Commit:
    return Commit(
        run_id,
        version,
        STATE | {"n": n},
        history=[{"event": "stage-succeeded", "n": n}],
        outbox=[OutboxEntry(f"{run_id}.{n}", run_id, "job:q", {"n": n})],
        timers_set=[Timer(f"{run_id}.deadline", run_id, 10**13 + n, {"kind": "execution"})],
        index={"status": "running", "workflow": "bench"},
    )


class Raw:
    def __init__(self, client: Any, prefix: str) -> None:
        self.client, self.prefix = client, prefix
        self.script = client.register_script(RAW_CAS)
        self.state = json.dumps(STATE)

    def args(self, run: str, version: int, n: int) -> tuple[list[str], list[Any]]:
        tag = f"{self.prefix}:{{{run}}}"
        keys = [f"{tag}:run", f"{tag}:hist", f"{tag}:obx", f"{tag}:tmr"]
        return keys, [version, self.state, f'{{"n":{n}}}', f"{run}.{n}", 10**13 + n]

    async def create(self, run: str) -> None:
        await self.client.hset(f"{self.prefix}:{{{run}}}:run", "v", 0)

    async def loop(self, run: str, n: int) -> None:
        for i in range(n):
            keys, args = self.args(run, i, i)
            assert await self.script(keys=keys, args=args) == i + 1

    async def pipelined(self, runs: list[str], n: int) -> None:
        for i in range(n):
            pipe = self.client.pipeline(transaction=False)
            for run in runs:
                keys, args = self.args(run, i, i)
                await self.script(keys=keys, args=args, client=pipe)
            assert await pipe.execute() == [i + 1] * len(runs)


async def _store_loop(store: RedisStore, run: str, n: int) -> None:
    version = 0
    for i in range(n):
        version = await store.commit(_commit(run, version, i))


async def _timed(work: Any, commits: int, cpu: dict[str, float], name: str) -> float:
    start, cpu_start = time.perf_counter(), time.process_time()
    await work
    cpu[name] = (time.process_time() - cpu_start) / commits * 1e6
    return commits / (time.perf_counter() - start)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def _primary_with_replica() -> Iterator[int]:
    """A private primary and one replica of it on loopback; yields the primary's port."""
    ports, procs = (_free_port(), _free_port()), []
    with tempfile.TemporaryDirectory(prefix="accord-bench-redis-") as tmp:
        try:
            for port, extra in (
                (ports[0], []),
                (ports[1], ["--replicaof", "127.0.0.1", str(ports[0])]),
            ):
                procs.append(subprocess.Popen(
                    ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp,
                     "--dbfilename", f"{port}.rdb", "--save", "", "--appendonly", "no", *extra],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                ))  # fmt: skip
            primary = redis.Redis(port=ports[0], decode_responses=True)
            deadline = time.monotonic() + 20
            while True:
                try:
                    info = primary.info("replication")
                    if info.get("slave0", {}).get("state") == "online":
                        break
                except redis.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("the private replica did not connect within 20 s")
                time.sleep(0.05)
            primary.close()
            yield ports[0]
        finally:
            for proc in procs:
                proc.kill()
                proc.wait(timeout=10)


async def _replicated(n: int) -> dict[str, float]:
    per_run = max(n // RUNS, 5)
    out: dict[str, float] = {}
    with _primary_with_replica() as port:
        for replicas in (0, 1):
            url = f"redis://127.0.0.1:{port}/0?prefix=r{replicas}&shards=8&replicas={replicas}"
            store = await RedisStore.connect(url)
            try:
                cpu: dict[str, float] = {}
                one = await _timed(_store_loop(store, "solo", n), n, cpu, "one")
                many = await _timed(
                    asyncio.gather(*(_store_loop(store, r, per_run) for r in _names())),
                    RUNS * per_run,
                    cpu,
                    "many",
                )
            finally:
                await store.close()
            out[f"one_task_replicas_{replicas}"] = round(one)
            out[f"many_tasks_replicas_{replicas}"] = round(many)
    return out


def _names() -> list[str]:
    return [f"run{r}" for r in range(RUNS)]


async def _run(smoke: bool) -> dict[str, Any]:
    n = 150 if smoke else 3000
    per_run = max(n // RUNS, 5)
    prefix = f"bench-{uuid.uuid4().hex[:10]}"
    client = aioredis.from_url(URL, decode_responses=True)
    store = await RedisStore.connect(f"{URL}?prefix={prefix}-s&shards=8")
    raw = Raw(client, f"{prefix}-r")
    runs = _names()
    cpu: dict[str, float] = {}
    try:
        for run in ["solo", *runs, *(f"p{r}" for r in runs)]:
            await raw.create(run)
        out = {
            "raw": {
                "one_task": await _timed(raw.loop("solo", n), n, cpu, "raw.one_task"),
                "many_tasks": await _timed(
                    asyncio.gather(*(raw.loop(r, per_run) for r in runs)),
                    RUNS * per_run,
                    cpu,
                    "raw.many_tasks",
                ),
                "pipelined": await _timed(
                    raw.pipelined([f"p{r}" for r in runs], per_run),
                    RUNS * per_run,
                    cpu,
                    "raw.pipelined",
                ),
            },
            "store": {
                "one_task": await _timed(_store_loop(store, "solo", n), n, cpu, "store.one_task"),
                "many_tasks": await _timed(
                    asyncio.gather(*(_store_loop(store, r, per_run) for r in runs)),
                    RUNS * per_run,
                    cpu,
                    "store.many_tasks",
                ),
            },
        }
    finally:
        for pattern in (f"{prefix}-s:*", f"{prefix}-r:*"):
            keys = [k async for k in client.scan_iter(match=pattern, count=1000)]
            for i in range(0, len(keys), 500):
                await client.delete(*keys[i : i + 500])
        await store.close()
        await client.aclose()
    for mode in ("one_task", "many_tasks"):
        out.setdefault("ratio", {})[mode] = round(out["store"][mode] / out["raw"][mode], 3)
    for side in ("raw", "store"):
        out[side] = {k: round(v) for k, v in out[side].items()}
    out["cpu_us"] = {k: round(v, 1) for k, v in cpu.items()}
    out["replicated"] = await _replicated(60 if smoke else 1500)
    return out


def run(smoke: bool) -> dict[str, Any]:
    return run_loop(_run(smoke))


if __name__ == "__main__":
    print(json.dumps(run(smoke="--smoke" in sys.argv), indent=2))
