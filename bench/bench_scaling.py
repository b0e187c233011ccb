"""Accord's throughput against task slots: the Accord series of ``scaling.png``.

The same workload and worker as ``bench_engine`` (model-ingest shape, no-op worker in process,
engine from URLs), with the worker's task slots set to 1, 2, 4 and 8 in turn: N runs started at
once, runs/s until every run is terminal. Backends: ``memory`` and ``sqlite`` (WAL FULL, store
and embedded queue in one file, a fresh file per slot count). Figures:
``<backend>.scaling.<slots>`` runs/s — the keys :mod:`bench.plots` draws, next to the peers'
own ``scaling.<slots>`` from ``bench_peers``.

Run: ``python -m bench.bench_scaling [--smoke]``; ``python -m bench`` runs it with the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import tempfile
import time
from typing import Any

from accord.adapters import open_engine
from accord.adapters.clock import SystemClock
from accord.engine.runtime.orchestrator import Delivered, EngineOptions
from accord.loop import run as run_loop
from accord.testing.plans import QUEUES, model_ingest_shape
from accord.testing.workers import run_noop_worker

PLAN = model_ingest_shape(name="bench-scaling")


async def _rate(url: str, slots: int, n: int) -> float:
    done: set[str] = set()
    changed = asyncio.Event()

    def observe(delivered: Delivered) -> None:
        if delivered.run is not None and delivered.run.terminal:
            done.add(delivered.run_id)
            changed.set()

    engine = open_engine(
        url, url, SystemClock(), options=EngineOptions(poll_ms=20), observers=[observe]
    )
    await engine.register_plan(PLAN)
    await engine.start()
    stop = asyncio.Event()
    worker = asyncio.get_running_loop().create_task(
        run_noop_worker(engine.transport, QUEUES, task_slots=slots, stop=stop)
    )
    try:
        began = time.perf_counter()
        runs = [await engine.start_run(PLAN.name, {"modelId": f"m{i}"}) for i in range(n)]
        deadline = time.monotonic() + 120
        while not done.issuperset(runs):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(set(runs) - done)} of {n} runs unfinished")
            changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), 1.0)
        return n / (time.perf_counter() - began)
    finally:
        stop.set()
        await worker
        await engine.stop()


def run(smoke: bool) -> dict[str, Any]:
    n, slot_counts = (20, (1, 4)) if smoke else (200, (1, 2, 4, 8))
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="accord-scaling-") as tmp:
        for backend in ("memory", "sqlite"):
            rates = {}
            for slots in slot_counts:
                url = "memory://" if backend == "memory" else f"sqlite:///{tmp}/s{slots}.db"
                rates[str(slots)] = round(run_loop(_rate(url, slots, n)), 1)
            out[backend] = {"scaling": rates}
    return out


if __name__ == "__main__":
    print(json.dumps(run(smoke="--smoke" in sys.argv), indent=2))
