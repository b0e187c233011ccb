"""DBOS Transact on the reference workload, with its SQLite system database.

Runs inside the DBOS peer's own virtual environment. DBOS is a library: workflows and steps run
in this process and every step's checkpoint is written to the system database, here a SQLite
file (``system_database_url = sqlite:///…``). The workflow is async: step ``A``, then
``asyncio.gather`` of steps ``B`` and ``C``, then ``D``. DBOS has no task slots of its own for
in-process steps, so the 4-slot pool is a semaphore around the step bodies.

Memory and CPU are this process (DBOS, the workflows and the caller share it).

Run: ``python -m bench.peers.dbos_peer [--smoke]``; prints one JSON line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
import time
from typing import Any

from dbos import DBOS

from bench.peers import workload as w

SLOTS: dict[str, asyncio.Semaphore] = {}


async def _task(name: str) -> list[float]:
    async with SLOTS["pool"]:
        return w.stamp(time.time())


@DBOS.step(name="A")
async def task_a() -> list[float]:
    return await _task("A")


@DBOS.step(name="B")
async def task_b() -> list[float]:
    return await _task("B")


@DBOS.step(name="C")
async def task_c() -> list[float]:
    return await _task("C")


@DBOS.step(name="D")
async def task_d() -> list[float]:
    return await _task("D")


@DBOS.workflow(name="ingest")
async def ingest() -> dict[str, list[float]]:
    a = await task_a()
    b, c = await asyncio.gather(task_b(), task_c())
    return {"A": a, "B": b, "C": c, "D": await task_d()}


async def _batch(n: int) -> list[Any]:
    handles = [await DBOS.start_workflow_async(ingest) for _ in range(n)]
    return [await h.get_result() for h in handles]


async def _throughput(n: int) -> dict[str, float]:
    pids = [os.getpid()]
    cpu0, t0 = w.cpu_seconds(pids), time.perf_counter()
    await _batch(n)
    elapsed = time.perf_counter() - t0
    return w.throughput_figures(n, elapsed, w.cpu_seconds(pids) - cpu0)


async def _main(smoke: bool) -> None:
    from importlib.metadata import version

    sizes = w.sizes(smoke)
    figures: dict[str, Any] = {"version": version("dbos"), "throughput": {}, "scaling": {}}
    SLOTS["pool"] = asyncio.Semaphore(w.TASK_SLOTS)
    budget, e2e, stamps = w.Budget(), [], []
    await _batch(1)
    for i, n in enumerate(sizes["throughput"]):
        if budget.allows(f"throughput.{n}", n):
            figures["throughput"][str(n)] = await _throughput(n)
            budget.rate = figures["throughput"][str(n)]["runs_per_s"]
        if i == 0:  # latency right after the first batch, so a slow peer still has it
            figures["latency_planned"], end = sizes["latency"], budget.phase_end(0.4)
            for _ in range(sizes["latency"]):
                if len(e2e) >= 10 and time.monotonic() > end:
                    break
                began = time.perf_counter()
                stamps.extend(await _batch(1))
                e2e.append((time.perf_counter() - began) * 1000)
    for slots in sizes["scaling"]:
        if budget.allows(f"scaling.{slots}", sizes["scaling_runs"]):
            SLOTS["pool"] = asyncio.Semaphore(slots)
            rate = await _throughput(sizes["scaling_runs"])
            figures["scaling"][str(slots)] = rate["runs_per_s"]
    figures["rss_mib"] = w.peak_rss_mib([os.getpid()])
    w.finish(figures, budget, e2e, stamps)


def main(smoke: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="accord-bench-dbos-") as tmp:
        # BENCH_DBOS_DATABASE_URL (postgresql://…) puts the system database in PostgreSQL, so
        # DBOS and Accord's PostgreSQL store are measured on the same server
        url = os.environ.get("BENCH_DBOS_DATABASE_URL") or f"sqlite:///{tmp}/dbos.sqlite"
        DBOS(config={"name": "accord-bench", "system_database_url": url,
                     "run_admin_server": False, "log_level": "WARNING"})  # fmt: skip
        logging.getLogger("dbos").setLevel(logging.WARNING)
        DBOS.launch()
        try:
            asyncio.run(_main(smoke))
        finally:
            DBOS.destroy()


if __name__ == "__main__":
    main(smoke="--smoke" in sys.argv)
