"""The physical limits Accord's figures are reported against: the parts alone, no Accord code.

- ``redis_cas.{one_task,many_tasks,pipelined}``: calls/s of a bare compare-and-set Lua script
  (``HGET`` version, compare, ``HSET`` version + state) through redis-py's asyncio client on
  127.0.0.1:6379 (database 15, throwaway keys deleted afterwards): one task awaiting each call;
  ``TASKS`` tasks each on its own key, concurrently; ``TASKS`` calls per pipeline round.
- ``sqlite_tx.{NORMAL,FULL}``: single-row write transactions/s (``BEGIN IMMEDIATE``, one
  ``UPDATE``, ``COMMIT``) in WAL mode with that ``synchronous`` setting.
- ``queue.raw_sqlite``: messages/s through the least a durable SQLite queue must do — one
  ``INSERT`` transaction to publish, one ``DELETE … RETURNING`` transaction to consume and settle —
  in WAL with ``synchronous=NORMAL``; ``queue.embedded``: the embedded transport's publish, then
  consume + ack, on the same settings (the figure the raw loop bounds).

``bench_store`` and ``bench_redis`` measure the heavier commit shapes next to the adapters; these
are the canonical limits the summary's ratios use. Run: ``python -m bench.bench_limits [--smoke]``.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from accord.adapters import open_transport
from accord.loop import run as run_loop

URL = "redis://127.0.0.1:6379/15"
TASKS = 32
CAS = """
if redis.call('HGET', KEYS[1], 'v') ~= ARGV[1] then return -1 end
redis.call('HSET', KEYS[1], 'v', ARGV[1] + 1, 'state', ARGV[2])
return ARGV[1] + 1
"""


async def _cas_loop(script: Any, key: str, calls: int) -> None:
    for i in range(calls):
        assert await script(keys=[key], args=[i, "s"]) == i + 1


async def _redis(calls: int) -> dict[str, float]:
    client = aioredis.from_url(URL)
    prefix = f"bench-limits-{uuid.uuid4().hex[:10]}"
    script = client.register_script(CAS)
    keys = [f"{prefix}:{n}" for n in range(TASKS * 2 + 1)]
    per_task = max(calls // TASKS, 5)
    out: dict[str, float] = {}
    try:
        for key in keys:
            await client.hset(key, "v", 0)
        began = time.perf_counter()
        await _cas_loop(script, keys[0], calls)
        out["one_task"] = calls / (time.perf_counter() - began)
        began = time.perf_counter()
        await asyncio.gather(*(_cas_loop(script, k, per_task) for k in keys[1 : TASKS + 1]))
        out["many_tasks"] = TASKS * per_task / (time.perf_counter() - began)
        began = time.perf_counter()
        for i in range(per_task):
            pipe = client.pipeline(transaction=False)
            for key in keys[TASKS + 1 :]:
                await script(keys=[key], args=[i, "s"], client=pipe)
            assert await pipe.execute() == [i + 1] * TASKS
        out["pipelined"] = TASKS * per_task / (time.perf_counter() - began)
    finally:
        await client.delete(*keys)
        await client.aclose()
    return {k: round(v) for k, v in out.items()}


def _connect(path: Path, sync: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {sync}")
    return conn


def sqlite_tx(path: Path, sync: str, n: int) -> float:
    conn = _connect(path, sync)
    conn.execute("CREATE TABLE runs (id TEXT PRIMARY KEY, version INTEGER, state TEXT)")
    conn.execute("INSERT INTO runs VALUES ('r', 0, '{}')")
    began = time.perf_counter()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE runs SET version = ?, state = ? WHERE id = 'r'", (i + 1, "{}"))
        conn.execute("COMMIT")
    rate = n / (time.perf_counter() - began)
    conn.close()
    return rate


def raw_queue(path: Path, n: int) -> float:
    conn = _connect(path, "NORMAL")
    conn.execute("CREATE TABLE q (id INTEGER PRIMARY KEY, queue TEXT, body BLOB)")
    began = time.perf_counter()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO q (queue, body) VALUES ('bench', ?)", (f'{{"n":{i}}}',))
        conn.execute("COMMIT")
    for _ in range(n):
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute(
            "DELETE FROM q WHERE id = (SELECT min(id) FROM q WHERE queue = 'bench') RETURNING body"
        ).fetchone()
        conn.execute("COMMIT")
        assert row is not None
    rate = n / (time.perf_counter() - began)
    conn.close()
    return rate


async def embedded_queue(path: Path, n: int) -> float:
    transport = open_transport(f"sqlite:///{path}?synchronous=NORMAL")
    began = time.perf_counter()
    for i in range(n):
        await transport.publish("bench", f"m{i}", b'{"n":1}')
    stream = transport.consume("bench", prefetch=32)
    for _ in range(n):
        await transport.ack(await anext(stream))
    rate = n / (time.perf_counter() - began)
    await stream.aclose()  # type: ignore[attr-defined]
    await transport.close()
    return rate


def run(smoke: bool) -> dict[str, Any]:
    calls, tx, msgs = (200, 200, 200) if smoke else (5000, 3000, 3000)
    out: dict[str, Any] = {"redis_cas": run_loop(_redis(calls)), "sqlite_tx": {}}
    with tempfile.TemporaryDirectory(prefix="accord-limits-") as tmp:
        for sync in ("NORMAL", "FULL"):
            out["sqlite_tx"][sync] = round(sqlite_tx(Path(tmp) / f"tx-{sync}.db", sync, tx))
        out["queue"] = {
            "raw_sqlite": round(raw_queue(Path(tmp) / "raw-queue.db", msgs)),
            "embedded": round(run_loop(embedded_queue(Path(tmp) / "queue.db", msgs))),
        }
    return out


if __name__ == "__main__":
    print(json.dumps(run(smoke="--smoke" in sys.argv), indent=2))
