"""Store and embedded-queue throughput on SQLite, next to a raw sqlite3 loop in the same run.

One commit = the run row's compare-and-set + 1 history row + 1 outbox row + 1 timer upsert, the
shape of one engine transition. Figures (all per second):

- ``raw.<sync>``: a bare ``sqlite3`` loop, one ``BEGIN IMMEDIATE … COMMIT`` per commit, same
  schema, pre-serialised JSON: the limit to report against.
- ``store.<sync>.sequential``: ``SqliteStore.commit`` awaited one after another (one run).
- ``store.<sync>.concurrent``: ``CONCURRENT_RUNS`` runs committing at once (group commit).
- ``ratio.<sync>``: sequential store rate / raw rate.
- ``queue``: embedded queue, publish N then consume+ack N with prefetch 32, messages per second.

Run: ``python -m bench.bench_store`` (or ``--smoke``); ``python -m bench`` runs it with the rest.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from accord.adapters import open_store, open_transport
from accord.adapters.stores.sqlite import SCHEMA
from accord.engine.ports import Commit, OutboxEntry, Store, Timer
from accord.loop import run as run_loop

CONCURRENT_RUNS = 32
STATE = {"stages": {f"s{n}": {"status": "running", "attempt": 1} for n in range(8)}}


def _commit(run_id: str, version: int, n: int) -> Commit:
    return Commit(
        run_id,
        version,
        STATE | {"n": n},
        history=[{"event": "stage-succeeded", "n": n}],
        outbox=[OutboxEntry(f"{run_id}/{n}", run_id, "job:q", {"n": n})],
        timers_set=[Timer(f"{run_id}/deadline", run_id, 10**13 + n, {"kind": "execution"})],
        index={"status": "running", "workflow": "bench"},
    )


def raw_loop(path: Path, sync: str, n: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {sync}")
    for statement in SCHEMA.split(";"):
        conn.execute(statement)
    conn.execute(
        "INSERT INTO accord_runs VALUES ('r', 0, '{}', 0, 'running', 'bench', NULL, 0, '{}')"
    )
    state = json.dumps(STATE)
    start = time.perf_counter()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute(
            "UPDATE accord_runs SET version = version + 1, state = ?, history_len = history_len + 1"
            " WHERE run_id = 'r' AND version = ? RETURNING history_len",
            (state, i),
        ).fetchone()
        conn.execute("INSERT INTO accord_history VALUES ('r', ?, ?)", (row[0], f'{{"n":{i}}}'))
        conn.execute(
            "INSERT INTO accord_outbox (entry_id, run_id, topic, payload, created_at, avail_at)"
            " VALUES (?, 'r', 'job:q', ?, 0, 0)",
            (f"r/{i}", f'{{"n":{i}}}'),
        )
        conn.execute(
            "INSERT INTO accord_timers (timer_id, run_id, due_at, payload, shard, avail_at)"
            " VALUES ('r/deadline', 'r', ?, '{}', 0, ?)"
            " ON CONFLICT (timer_id) DO UPDATE SET due_at = excluded.due_at,"
            " avail_at = excluded.avail_at, owner = NULL",
            (i, i),
        )
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return n / elapsed


async def store_sequential(store: Store, n: int) -> float:
    version = 0
    start = time.perf_counter()
    for i in range(n):
        version = await store.commit(_commit("solo", version, i))
    return n / (time.perf_counter() - start)


async def store_concurrent(store: Store, per_run: int) -> float:
    async def one(run: int) -> None:
        version = 0
        for i in range(per_run):
            version = await store.commit(_commit(f"run{run}", version, i))

    start = time.perf_counter()
    await asyncio.gather(*(one(r) for r in range(CONCURRENT_RUNS)))
    return CONCURRENT_RUNS * per_run / (time.perf_counter() - start)


async def queue_rate(path: Path, n: int) -> float:
    transport = open_transport(f"sqlite:///{path}?synchronous=NORMAL")
    start = time.perf_counter()
    for i in range(n):
        await transport.publish("bench", f"m{i}", b'{"n":1}')
    stream = transport.consume("bench", prefetch=32)
    for _ in range(n):
        await transport.ack(await anext(stream))
    rate = n / (time.perf_counter() - start)
    await stream.aclose()  # type: ignore[attr-defined]
    await transport.close()
    return rate


async def _run(smoke: bool, tmp: Path) -> dict[str, Any]:
    n = {"FULL": 100 if smoke else 1500, "NORMAL": 300 if smoke else 5000}
    out: dict[str, Any] = {"raw": {}, "store": {}, "ratio": {}}
    for sync in ("FULL", "NORMAL"):
        raw = raw_loop(tmp / f"raw-{sync}.db", sync, n[sync])
        store = open_store(f"sqlite:///{tmp}/store-{sync}.db?synchronous={sync}")
        sequential = await store_sequential(store, n[sync])
        concurrent = await store_concurrent(store, max(n[sync] // CONCURRENT_RUNS, 3))
        await store.close()
        out["raw"][sync] = round(raw)
        out["store"][sync] = {"sequential": round(sequential), "concurrent": round(concurrent)}
        out["ratio"][sync] = round(sequential / raw, 3)
    memory = open_store("memory://")
    out["store"]["memory"] = {"sequential": round(await store_sequential(memory, n["NORMAL"]))}
    out["queue"] = round(await queue_rate(tmp / "queue.db", 300 if smoke else 5000))
    return out


def run(smoke: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="accord-bench-") as tmp:
        return run_loop(_run(smoke, Path(tmp)))


if __name__ == "__main__":
    print(json.dumps(run(smoke="--smoke" in sys.argv), indent=2))
