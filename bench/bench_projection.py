"""The search projection: what it costs the engine, how far it lags, how fast it indexes.

Same plan and worker as :mod:`bench.bench_engine` (``render → fork(analyse, metadata) → join →
publish``, an in-process no-op worker with 4 task slots), on the SQLite store with its embedded
queue, N runs started at once. Figures:

- ``engine_runs_per_s_projection_off`` / ``_on``: runs/s with no sink (telemetry entries are not
  even written) and with the projector registered in the telemetry fan-out (SQLite FTS5
  projection beside the store, as ``accord engine run`` opens it by default); phases alternate
  off/on three times; ``projection_cost_pct`` compares the best of each, ``…_of_medians``
  their medians (the machine is shared: its load drifts between phases);
- ``cpu_ms_per_run_projection_off`` / ``_on`` and ``projection_cpu_cost_pct``: this process's
  CPU per run (engine, worker, projector and both database threads), medians: a figure the
  machine's other load disturbs far less than runs/s;
- ``lag_p50_ms`` / ``lag_p95_ms`` / ``lag_max_ms``: the projector's lag metric (age of a batch's
  newest event when the batch is indexed) over every batch of the loaded phase;
  ``catch_up_ms``: from the last run ending to the projection holding it as ended;
- ``projector_events_per_s``: telemetry events per second of time spent in the projector
  (``emit``), during the loaded phase; ``documents_per_event``: documents written per event;
- ``projector_events_per_s_alone_<adapter>``: the same events (as many per run as the loaded
  phase saw) replayed into a fresh projector with nothing else running, in batches of 500;
- ``rebuild_documents_per_s_<adapter>``: ``accord telemetry rebuild`` speed from the store of
  the loaded phase into a fresh SQLite and PostgreSQL projection.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from accord.adapters import open_engine, open_store
from accord.adapters.clock import SystemClock
from accord.adapters.projection import default_projection_url, open_projection
from accord.adapters.telemetry import FanoutSink
from accord.cli.telemetry import LINGER_MS
from accord.engine.ports import JsonValue
from accord.engine.runtime.orchestrator import EngineOptions
from accord.engine.runtime.projector import Projector, rebuild
from accord.testing.plans import QUEUES
from accord.testing.workers import run_noop_worker
from bench.bench_engine import PLAN, _Tracker


class _Timed:
    """The projector with its time in ``emit`` and its lag after each batch recorded."""

    def __init__(self, projector: Projector) -> None:
        self.projector = projector
        self.busy_s = 0.0
        self.lags: list[int] = []

    async def emit(self, events: Any) -> None:
        began = time.perf_counter()
        try:
            await self.projector.emit(events)
        finally:
            self.busy_s += time.perf_counter() - began
        self.lags.append(self.projector.stats.lag_ms)


async def _phase(folder: Path, n: int, projection: bool) -> dict[str, Any]:
    url = f"sqlite:///{folder / f'{uuid.uuid4().hex[:8]}.db'}"
    tracker = _Tracker()
    sink = FanoutSink() if projection else None
    engine = open_engine(url, url, SystemClock(), options=EngineOptions(poll_ms=20),
                         observers=[tracker.transition], sink=sink)  # fmt: skip
    timed = None
    proj = None
    if sink is not None:
        purl = default_projection_url(url)
        assert purl is not None
        proj = open_projection(purl)
        timed = _Timed(Projector(engine.store, proj, engine.clock, linger_ms=LINGER_MS))
        sink.register("projection", timed, required=True)
    await engine.register_plan(PLAN)
    await engine.start()
    gc.collect()
    gc.freeze()
    stop = asyncio.Event()
    worker = asyncio.get_running_loop().create_task(
        run_noop_worker(engine.transport, QUEUES, task_slots=4, stop=stop)
    )
    try:
        t0, cpu0 = time.perf_counter(), time.process_time()
        runs = [await engine.start_run(PLAN.name, {"modelId": f"m{i}"}) for i in range(n)]
        await tracker.wait(runs)
        elapsed = time.perf_counter() - t0
        cpu_ms = (time.process_time() - cpu0) * 1000 / n
        out: dict[str, Any] = {"runs_per_s": n / elapsed, "url": url, "cpu_ms_per_run": cpu_ms}
        if timed is not None and proj is not None:
            last = max(tracker.done.values())
            while True:  # until every run reads as ended in the projection
                docs = [await proj.get(r) for r in runs[-20:]]
                if all(d is not None and d.body.get("ended_at_ms") for d in docs):
                    break
                await asyncio.sleep(0.01)
            out["catch_up_ms"] = (time.perf_counter() - last) * 1000
            stats = timed.projector.stats
            out["lags"] = timed.lags
            out["events_per_s"] = stats.events / timed.busy_s if timed.busy_s else 0.0
            out["documents_per_event"] = stats.indexed / max(1, stats.events)
            out["failed"] = stats.failed
            out["events"] = stats.events
        return out
    finally:
        stop.set()
        await worker
        await engine.stop()
        gc.unfreeze()
        if proj is not None:
            await proj.close()


async def _rebuild_speed(store_url: str, projection_url: str) -> float:
    store = open_store(store_url)
    projection = open_projection(projection_url)
    try:
        projector = Projector(store, projection, SystemClock())
        began = time.perf_counter()
        await rebuild(store, projector)
        return projector.stats.indexed / (time.perf_counter() - began)
    finally:
        await projection.close()
        await store.close()


async def _replay_speed(store_url: str, projection_url: str, per_run: int) -> float:
    """Telemetry events per second a fresh projector takes with nothing else running: every
    run of the store named by ``per_run`` events (as many as a run of the plan commits), in
    dispatcher-sized batches of 500, runs interleaved as concurrent runs' events are."""
    store = open_store(store_url)
    projection = open_projection(projection_url)
    try:
        runs = [r.run_id for r in await store.list_runs(limit=1_000_000)]
        events: list[dict[str, JsonValue]] = [
            {"run_id": r, "at_ms": 1} for _ in range(per_run) for r in runs
        ]
        projector = Projector(store, projection, SystemClock())
        began = time.perf_counter()
        for start in range(0, len(events), 500):
            await projector.emit(events[start : start + 500])
        return len(events) / (time.perf_counter() - began)
    finally:
        await projection.close()
        await store.close()


def _pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))]) if ordered else 0.0


async def _main(smoke: bool) -> dict[str, Any]:
    n = 40 if smoke else 400
    with tempfile.TemporaryDirectory(prefix="accord-bench-projection-") as tmp:
        folder = Path(tmp)
        off: list[float] = []
        off_cpu: list[float] = []
        on: list[dict[str, Any]] = []
        for _ in range(1 if smoke else 3):  # alternating: a shared machine's load drifts
            phase = await _phase(folder, n, projection=False)
            off.append(phase["runs_per_s"])
            off_cpu.append(phase["cpu_ms_per_run"])
            on.append(await _phase(folder, n, projection=True))
        on_cpu = statistics.median(r["cpu_ms_per_run"] for r in on)
        best_on = max(on, key=lambda r: r["runs_per_s"])
        lags = [lag for r in on for lag in r["lags"]]
        best_off = max(off)
        median_on = statistics.median(r["runs_per_s"] for r in on)
        figures: dict[str, JsonValue] = {
            "runs": n,
            "engine_runs_per_s_projection_off": round(best_off, 1),
            "engine_runs_per_s_projection_on": round(best_on["runs_per_s"], 1),
            "projection_cost_pct": round(100 * (1 - best_on["runs_per_s"] / best_off), 1),
            "engine_runs_per_s_projection_off_median": round(statistics.median(off), 1),
            "engine_runs_per_s_projection_on_median": round(median_on, 1),
            "projection_cost_pct_of_medians": round(
                100 * (1 - median_on / statistics.median(off)), 1
            ),
            "cpu_ms_per_run_projection_off": round(statistics.median(off_cpu), 3),
            "cpu_ms_per_run_projection_on": round(on_cpu, 3),
            "projection_cpu_cost_pct": round(100 * (on_cpu / statistics.median(off_cpu) - 1), 1),
            "linger_ms": LINGER_MS,
            "lag_p50_ms": _pct(lags, 0.5),
            "lag_p95_ms": _pct(lags, 0.95),
            "lag_max_ms": float(max(lags, default=0)),
            "catch_up_ms": round(statistics.median(r["catch_up_ms"] for r in on), 1),
            "projector_events_per_s": round(statistics.median(r["events_per_s"] for r in on), 1),
            "documents_per_event": round(best_on["documents_per_event"], 2),
            "failed_documents": sum(int(r["failed"]) for r in on),
        }
        store_url = str(best_on["url"])
        fresh = f"sqlite:///{folder / 'rebuilt.projection.db'}"
        figures["rebuild_documents_per_s_sqlite"] = round(await _rebuild_speed(store_url, fresh), 1)
        per_run = max(1, round(sum(r["events"] for r in on) / (n * len(on))))
        replay = f"sqlite:///{folder / 'replayed.projection.db'}"
        speed = await _replay_speed(store_url, replay, per_run)
        figures["projector_events_per_s_alone_sqlite"] = round(speed, 1)
        try:
            from tests.services import POSTGRES_DSN, _pg_answers

            if _pg_answers(POSTGRES_DSN):
                schema = f"bench_{uuid.uuid4().hex[:10]}"
                pg = f"{POSTGRES_DSN}?schema={schema}"
                speed = await _rebuild_speed(store_url, pg)
                figures["rebuild_documents_per_s_postgres"] = round(speed, 1)
                speed = await _replay_speed(store_url, pg + "_replay", per_run)
                figures["projector_events_per_s_alone_postgres"] = round(speed, 1)
                import psycopg

                with psycopg.connect(POSTGRES_DSN, autocommit=True) as conn:
                    for name in (schema, schema + "_replay"):
                        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
            else:
                figures["rebuild_documents_per_s_postgres"] = "PostgreSQL not answering"
        except ImportError:
            figures["rebuild_documents_per_s_postgres"] = "tests.services not importable"
        return figures


def run(smoke: bool) -> dict[str, Any]:
    return asyncio.run(_main(smoke))


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run("--smoke" in sys.argv), indent=2))
