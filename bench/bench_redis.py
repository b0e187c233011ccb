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

Needs Redis on 127.0.0.1:6379 (database 15, a throwaway key prefix, deleted afterwards).
Run: ``python -m bench.bench_redis`` (or ``--smoke``); ``python -m bench`` runs it with the rest.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from typing import Any

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


async def _run(smoke: bool) -> dict[str, Any]:
    n = 150 if smoke else 3000
    per_run = max(n // RUNS, 5)
    prefix = f"bench-{uuid.uuid4().hex[:10]}"
    client = aioredis.from_url(URL, decode_responses=True)
    store = await RedisStore.connect(f"{URL}?prefix={prefix}-s&shards=8")
    raw = Raw(client, f"{prefix}-r")
    runs = [f"run{r}" for r in range(RUNS)]
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
    return out


def run(smoke: bool) -> dict[str, Any]:
    return run_loop(_run(smoke))


if __name__ == "__main__":
    print(json.dumps(run(smoke="--smoke" in sys.argv), indent=2))
