"""asyncpg against psycopg 3 on the PostgreSQL store's commit path, in the same run.

One commit = the run row's compare-and-set + 1 history row + 1 outbox row + 1 timer upsert, the
shape of one engine transition, with pre-serialised JSON. Variants (commits per second and client
CPU microseconds per commit, one run committing sequentially and ``CONCURRENT`` runs at once on a
pool of ``POOL`` connections):

- ``asyncpg.tx``: ``BEGIN``, four statements, ``COMMIT`` — six round trips;
- ``asyncpg.cte``: one statement (data-modifying CTEs), its own transaction — one round trip;
- ``psycopg.pipeline``: psycopg 3 async in pipeline mode, ``BEGIN`` … ``COMMIT`` sent together;
- ``psycopg.cte``: psycopg 3 async, the same one statement as ``asyncpg.cte``.

Each variant runs twice (the second round in reverse order); each figure is the better of two.

Run: ``python -m bench.bench_postgres_driver [--smoke] [--url postgresql://postgres@127.0.0.1/test]``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import psycopg_pool

POOL, CONCURRENT = 8, 32
STATE = json.dumps({"stages": {f"s{n}": {"status": "running", "attempt": 1} for n in range(8)}})
HIST = json.dumps({"event": "JobCompleted", "stage": "s1", "attempt": 1})
BOX = json.dumps({"envelope": {"job": "x" * 200}})

SCHEMA = """
CREATE TABLE runs (run_id text PRIMARY KEY, version bigint NOT NULL, state text NOT NULL,
  history_len int NOT NULL, updated_at bigint NOT NULL);
CREATE TABLE history (run_id text NOT NULL, seq int NOT NULL, entry text NOT NULL,
  PRIMARY KEY (run_id, seq));
CREATE TABLE outbox (entry_id text PRIMARY KEY, run_id text NOT NULL, payload text NOT NULL,
  avail_at bigint NOT NULL);
CREATE TABLE timers (timer_id text PRIMARY KEY, run_id text NOT NULL, due_at bigint NOT NULL,
  payload text NOT NULL, avail_at bigint NOT NULL)
"""
UPDATE = (
    "UPDATE runs SET version = version + 1, state = $1, history_len = history_len + 1,"
    " updated_at = $2 WHERE run_id = $3 AND version = $4 RETURNING history_len"
)
HISTORY = "INSERT INTO history VALUES ($1, $2, $3)"
OUTBOX = "INSERT INTO outbox VALUES ($1, $2, $3, 0)"
TIMER = (
    "INSERT INTO timers VALUES ($1, $2, $3, $4, $3) ON CONFLICT (timer_id) DO UPDATE SET"
    " due_at = excluded.due_at, payload = excluded.payload, avail_at = excluded.due_at"
)
CTE = (
    "WITH r AS (UPDATE runs SET version = version + 1, state = $1,"
    " history_len = history_len + 1, updated_at = $2 WHERE run_id = $3 AND version = $4"
    " RETURNING history_len),"
    " h AS (INSERT INTO history SELECT $3, r.history_len - 1, $5 FROM r),"
    " o AS (INSERT INTO outbox SELECT $6, $3, $7, 0 FROM r),"
    " t AS (INSERT INTO timers SELECT $8, $3, $9, $7, $9 FROM r ON CONFLICT (timer_id) DO UPDATE"
    " SET due_at = excluded.due_at, payload = excluded.payload, avail_at = excluded.due_at)"
    " SELECT history_len FROM r"
)


def _psy(sql: str) -> str:
    """``$n`` placeholders as psycopg's named ones (``%(pn)s``), for :func:`_named` arguments."""
    for n in range(9, 0, -1):
        sql = sql.replace(f"${n}", f"%(p{n})s")
    return sql


def _named(*args: Any) -> dict[str, Any]:
    return {f"p{n}": a for n, a in enumerate(args, 1)}


Commit = Callable[[str, int], Awaitable[None]]


async def _asyncpg_variants(url: str, schema: str) -> dict[str, Commit]:
    pool = await asyncpg.create_pool(
        url, min_size=POOL, max_size=POOL, server_settings={"search_path": schema}
    )

    async def tx(run: str, v: int) -> None:
        async with pool.acquire() as c, c.transaction():
            seq = await c.fetchval(UPDATE, STATE, v, run, v)
            await c.execute(HISTORY, run, seq - 1, HIST)
            await c.execute(OUTBOX, f"{run}.{v}", run, BOX)
            await c.execute(TIMER, f"{run}.t", run, v, BOX)

    async def cte(run: str, v: int) -> None:
        async with pool.acquire() as c:
            await c.fetchval(CTE, STATE, v, run, v, HIST, f"{run}.{v}", BOX, f"{run}.t", v)

    _CLOSE.append(pool.close)
    return {"asyncpg.tx": tx, "asyncpg.cte": cte}


async def _psycopg_variants(url: str, schema: str) -> dict[str, Commit]:
    pool = psycopg_pool.AsyncConnectionPool(
        url, min_size=POOL, max_size=POOL, open=False,
        kwargs={"autocommit": True, "options": f"-c search_path={schema}"},
    )  # fmt: skip
    await pool.open(wait=True)
    update, history, outbox, timer, cte_sql = map(_psy, (UPDATE, HISTORY, OUTBOX, TIMER, CTE))

    async def pipeline(run: str, v: int) -> None:
        async with pool.connection() as c, c.pipeline():
            await c.execute("BEGIN")
            cur = await c.execute(update, _named(STATE, v, run, v))
            # the history row's sequence number is known to the caller here (version - 1 + 1)
            await c.execute(history, _named(run, v, HIST))
            await c.execute(outbox, _named(f"{run}.{v}", run, BOX))
            await c.execute(timer, _named(f"{run}.t", run, v, BOX))
            await c.execute("COMMIT")
            await cur.fetchone()

    async def cte(run: str, v: int) -> None:
        async with pool.connection() as c:
            args = _named(STATE, v, run, v, HIST, f"{run}.{v}", BOX, f"{run}.t", v)
            await (await c.execute(cte_sql, args)).fetchone()

    _CLOSE.append(pool.close)
    return {"psycopg.pipeline": pipeline, "psycopg.cte": cte}


_CLOSE: list[Callable[[], Awaitable[None]]] = []


async def _measure(fn: Commit, runs: int, commits: int, setup: Any) -> tuple[float, float]:
    names = [f"r{uuid.uuid4().hex[:8]}" for _ in range(runs)]
    await setup(names)

    async def one(run: str) -> None:
        for v in range(1, commits + 1):
            await fn(run, v)

    cpu, began = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one(r) for r in names))
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    total = runs * commits
    return total / wall, cpu / total * 1e6


async def main(url: str, smoke: bool) -> dict[str, Any]:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(url)
    await admin.execute(f"CREATE SCHEMA {schema}; SET search_path = {schema}; {SCHEMA}")

    async def setup(names: list[str]) -> None:
        await admin.executemany(
            f"INSERT INTO {schema}.runs VALUES ($1, 1, $2, 0, 0)", [(n, STATE) for n in names]
        )

    out: dict[str, Any] = {}
    try:
        variants = await _asyncpg_variants(url, schema) | await _psycopg_variants(url, schema)
        n = 100 if smoke else 1000
        # two rounds, the second in reverse order, each figure the better of its two: no
        # variant is favoured by running first (cold caches) or last (a larger table)
        order = [*variants.items(), *reversed(variants.items())]
        for name, fn in order:
            rate1, cpu1 = await _measure(fn, 1, n, setup)
            rate_c, cpu_c = await _measure(fn, CONCURRENT, max(n // 10, 10), setup)
            got = {
                "sequential_per_s": round(rate1), "sequential_cpu_us": round(cpu1),
                f"concurrent{CONCURRENT}_per_s": round(rate_c),
                f"concurrent{CONCURRENT}_cpu_us": round(cpu_c),
            }  # fmt: skip
            best = out.setdefault(name, got)
            for key, value in got.items():
                best[key] = min(best[key], value) if key.endswith("_us") else max(best[key], value)
            print(name, got, flush=True)
    finally:
        for close in _CLOSE:
            await close()
        await admin.execute(f"DROP SCHEMA {schema} CASCADE")
        await admin.close()
    return out


DEFAULT_URL = "postgresql://postgres@127.0.0.1/test"


def run(smoke: bool) -> dict[str, Any]:
    """The harness's entry point (``python -m bench``): every variant against the PostgreSQL on
    loopback (``make bench-services`` starts it)."""
    return asyncio.run(main(DEFAULT_URL, smoke))


if __name__ == "__main__":
    args = sys.argv[1:]
    target = args[args.index("--url") + 1] if "--url" in args else DEFAULT_URL
    print(json.dumps(asyncio.run(main(target, "--smoke" in args)), indent=2))
