"""Engine throughput and latency on the model-ingest shape, next to a raw SQLite loop.

Shape: ``render → fork(analyse, metadata) → join → publish``, four worker stages answered by an
in-process no-op worker with 4 task slots over the transport (accepted, then succeeded), so each
run is 9 transitions (start, 4 × accepted + succeeded). Backends: ``memory`` and ``sqlite`` (WAL,
``synchronous=FULL``, store and embedded queue in one file), ``bullmq`` (Redis store + BullMQ on
the same server) and ``rabbitmq`` (Redis store + RabbitMQ, durable quorum queues with confirms);
the last two on fresh prefixes, removed afterwards (:mod:`bench.engine_distributed`). Figures:

- ``runs_per_s`` / ``transitions_per_s``: N runs started at once, until all are terminal;
- ``hop_p50_ms`` / ``hop_p99_ms``: end of one task (its result published) to the start of the
  next (its job received by the worker), during the throughput phase (so including queueing
  behind the other runs); ``hop_*_single_run``: the same with one run in flight;
- ``single_run_p50_ms``: one run at a time, start to terminal;
- ``cpu_ms_per_run``: process CPU (engine and worker share the process) over the throughput
  phase, per run; ``rss_mib``: resident set size after the phase, except for ``sqlite``, where
  it is the peak RSS of a fresh interpreter running that variant alone (this process has loaded
  every other benchmark module; its own figure stays as ``rss_mib_in_process``);
- ``direct``: the shell alone, one run at a time driven through ``deliver`` with hand-off off,
  so each transition is exactly one commit (no queue traffic);
- ``raw_sqlite_tx_per_s``: a bare loop of one write transaction per transition (a run-record
  upsert plus a history insert, same file settings): the ceiling to report against;
  ``commit_per_transition`` sets the ``direct`` SQLite figure next to it, with their ratio;
- ``cpu_ms_per_run`` is split into ``loop_thread_cpu_ms_per_run`` (engine and worker) and the
  rest (the database thread); ``load_average_*``: the machine's load around the run;
- last, a profiled copy of the SQLite throughput phase writes where the time goes to
  ``bench/out/engine-profile.txt`` (:mod:`bench.engine_profile`); its speed is not a figure.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import resource
import sqlite3
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from accord.adapters import open_engine
from accord.adapters.clock import SystemClock
from accord.engine.machine.events import StageAccepted, StageSucceeded
from accord.engine.runtime.orchestrator import Delivered, Engine, EngineOptions
from accord.loop import run as run_loop
from accord.testing.plans import QUEUES, model_ingest_shape
from accord.testing.workers import run_noop_worker
from bench.engine_distributed import fresh_rss_mib, keyspace
from bench.engine_profile import OUT as PROFILE_OUT
from bench.engine_profile import profile_phase

PLAN = model_ingest_shape(name="bench-shape")
NEXT = {"render": ("analyse", "metadata"), "analyse": ("publish",), "metadata": ("publish",)}


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _rss_mib() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _Tracker:
    """Collects worker start/end times per (run, stage) and wakes waiters on terminal runs."""

    def __init__(self) -> None:
        self.start: dict[tuple[str, str], float] = {}
        self.end: dict[tuple[str, str], float] = {}
        self.done: dict[str, float] = {}
        self.changed = asyncio.Event()

    def observe(self, what: str, envelope: Mapping[str, Any]) -> None:
        key = (str(envelope["runId"]), str(envelope["stage"]))
        (self.start if what == "start" else self.end).setdefault(key, time.perf_counter())

    def transition(self, done: Delivered) -> None:
        if done.run is not None and done.run.terminal and done.run_id not in self.done:
            self.done[done.run_id] = time.perf_counter()
            self.changed.set()

    async def wait(self, run_ids: list[str], timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while any(r not in self.done for r in run_ids):
            self.changed.clear()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{sum(r not in self.done for r in run_ids)} runs unfinished")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 1.0)

    async def one_at_a_time(self, engine: Engine, n: int) -> tuple[list[float], list[str]]:
        """``n`` runs, each started when the one before has ended: their start-to-terminal
        times (ms) and their ids."""
        single, alone = [], []
        for i in range(n):
            began = time.perf_counter()
            rid = await engine.start_run(PLAN.name, {"modelId": f"s{i}"})
            await self.wait([rid])
            single.append((self.done[rid] - began) * 1000)
            alone.append(rid)
        return single, alone

    def hops(self, run_ids: list[str]) -> list[float]:
        out = []
        for rid in run_ids:
            for stage, successors in NEXT.items():
                for succ in successors:
                    if succ == "publish":  # the join releases on the later branch
                        ends = [self.end.get((rid, s)) for s in ("analyse", "metadata")]
                        end = max((e for e in ends if e is not None), default=None)
                    else:
                        end = self.end.get((rid, stage))
                    begin = self.start.get((rid, succ))
                    if end is not None and begin is not None and stage != "metadata":
                        out.append((begin - end) * 1000)
        return out


def _count_database_calls(engine: Engine) -> Counter[str]:
    """Count the SQLite jobs (store and queue share one database thread) by operation: where
    the time goes when each write transaction ends in an fsync."""
    calls: Counter[str] = Counter()
    db = getattr(engine.store, "db", None)
    if db is None:
        return calls
    write, read = db.write, db.read

    async def counted_write(fn: Any, what: str, kind: str = "store", **options: Any) -> Any:
        calls[f"{kind}.{what}"] += 1
        return await write(fn, what, kind, **options)

    async def counted_read(fn: Any, what: str, kind: str = "store") -> Any:
        calls[f"{kind}.{what}(read)"] += 1
        return await read(fn, what, kind)

    db.write, db.read = counted_write, counted_read
    return calls


async def _measure(
    store_url: str, transport_url: str, n: int, singles: int, declared: set[str] | None = None
) -> dict[str, Any]:
    clock = SystemClock()
    tracker = _Tracker()
    engine = open_engine(
        store_url,
        transport_url,
        clock,
        options=EngineOptions(poll_ms=20),
        observers=[tracker.transition],
    )
    transport = engine.transport
    calls = _count_database_calls(engine)
    await engine.register_plan(PLAN)
    await engine.start()
    # as `accord engine run` does: long-lived start-up objects leave the collector's scans,
    # which otherwise cost multi-millisecond pauses in the middle of a hop
    gc.collect()
    gc.freeze()
    stop = asyncio.Event()
    worker = asyncio.get_running_loop().create_task(
        run_noop_worker(transport, QUEUES, task_slots=4, stop=stop, observe=tracker.observe)
    )
    try:
        calls.clear()
        cpu0, t0, tr0 = time.process_time(), time.perf_counter(), engine.transitions
        loop0 = time.thread_time()
        runs = [await engine.start_run(PLAN.name, {"modelId": f"m{i}"}) for i in range(n)]
        await tracker.wait(runs)
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        loop_cpu = time.thread_time() - loop0
        per_run = {what: round(k / n, 2) for what, k in sorted(calls.items())}
        transitions = engine.transitions - tr0
        hops = tracker.hops(runs)
        single, alone = await tracker.one_at_a_time(engine, singles)
        idle_hops = tracker.hops(alone)
        return {
            "runs_per_s": round(n / elapsed, 1),
            "transitions_per_s": round(transitions / elapsed, 1),
            "transitions_per_run": round(transitions / n, 2),
            "hop_p50_ms": round(_pct(hops, 0.5), 3),
            "hop_p99_ms": round(_pct(hops, 0.99), 3),
            "hop_p50_ms_single_run": round(_pct(idle_hops, 0.5), 3),
            "hop_p99_ms_single_run": round(_pct(idle_hops, 0.99), 3),
            "single_run_p50_ms": round(statistics.median(single), 3),
            "cpu_ms_per_run": round(cpu * 1000 / n, 3),
            "loop_thread_cpu_ms_per_run": round(loop_cpu * 1000 / n, 3),
            "rss_mib": round(_rss_mib(), 1),
            "conflicts": engine.conflicts,
            **({"db_calls_per_run": per_run} if per_run else {}),
        }
    finally:
        stop.set()
        await worker
        if declared is not None:  # broker queues to delete afterwards
            declared.update(getattr(transport, "declared", ()))
        await engine.stop()


async def _distributed(broker: str, n: int, singles: int) -> dict[str, Any]:
    declared: set[str] = set()
    async with keyspace(broker, declared) as (store_url, transport_url):
        return await _measure(store_url, transport_url, n, singles, declared)


async def _direct(url: str, n: int) -> dict[str, float]:
    """Commit-per-transition speed of the shell alone: runs driven by calling ``deliver``
    (accepted, succeeded for each stage) with hand-off switched off, so every transition is
    exactly one store commit: the figure to set against the raw SQLite loop."""
    engine = open_engine(url, url, SystemClock(), options=EngineOptions(dispatch=False))
    await engine.register_plan(PLAN)
    try:
        cpu0, t0 = time.process_time(), time.perf_counter()
        for i in range(n):
            rid = await engine.start_run(PLAN.name, {"modelId": f"d{i}"})
            for stage in ("render", "analyse", "metadata", "publish"):
                run = engine.runs.get(rid)
                assert run is not None
                cur = run[1].stages[stage]
                ident: dict[str, Any] = {
                    "run_id": rid,
                    "stage": stage,
                    "attempt": cur.attempt,
                    "fence": cur.fence,
                }
                await engine.deliver(StageAccepted(**ident))
                await engine.deliver(StageSucceeded(**ident))
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        return {
            "transitions_per_s": round(engine.transitions / elapsed, 1),
            "us_per_transition": round(elapsed * 1e6 / engine.transitions, 1),
            "cpu_us_per_transition": round(cpu * 1e6 / engine.transitions, 1),
        }
    finally:
        await engine.stop()


def _raw_sqlite(path: Path, transactions: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE runs (id TEXT PRIMARY KEY, version INT, state TEXT)")
    conn.execute("CREATE TABLE history (id TEXT, seq INT, entry TEXT, PRIMARY KEY (id, seq))")
    state = "x" * 2500  # about the size of a model-ingest run record as JSON
    began = time.perf_counter()
    for i in range(transactions):
        run, seq = f"r{i // 9}", i % 9
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO runs VALUES (?, ?, ?) ON CONFLICT (id) DO UPDATE"
            " SET version = excluded.version, state = excluded.state",
            (run, seq, state),
        )
        conn.execute("INSERT INTO history VALUES (?, ?, ?)", (run, seq, state[:300]))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - began
    conn.close()
    return transactions / elapsed


def run(smoke: bool) -> dict[str, Any]:
    n, singles = (20, 5) if smoke else (200, 30)
    out: dict[str, Any] = {"load_average_start": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory(prefix="accord-bench-") as tmp:
        for backend in ("memory", "sqlite"):
            workdir = Path(tmp) / backend
            workdir.mkdir()
            url = "memory://" if backend == "memory" else f"sqlite:///{workdir / 'bench.db'}"
            out[backend] = run_loop(_measure(url, url, n, singles))
            url = "memory://" if backend == "memory" else f"sqlite:///{workdir / 'direct.db'}"
            out[backend]["direct"] = run_loop(_direct(url, n))
        out["sqlite"]["rss_mib_in_process"] = out["sqlite"]["rss_mib"]
        out["sqlite"]["rss_mib"] = fresh_rss_mib(n)
        for broker in ("bullmq", "rabbitmq"):
            out[broker] = run_loop(_distributed(broker, 10 if smoke else n, singles))
        out["raw_sqlite_tx_per_s"] = round(_raw_sqlite(Path(tmp) / "raw.db", n * 9), 1)
        profiled = Path(tmp) / "profiled"
        profiled.mkdir()
        url = f"sqlite:///{profiled / 'bench.db'}"
        out["profile_cpu_split"] = profile_phase(
            lambda: _measure(url, url, n, 1), n, out=PROFILE_OUT
        )
    out["load_average_end"] = round(os.getloadavg()[0], 2)
    # the engine's commit-per-transition speed next to the bare loop, measured in this run
    out["commit_per_transition"] = {
        "engine_sqlite_transitions_per_s": out["sqlite"]["direct"]["transitions_per_s"],
        "raw_sqlite_tx_per_s": out["raw_sqlite_tx_per_s"],
        "ratio": round(
            out["sqlite"]["direct"]["transitions_per_s"] / out["raw_sqlite_tx_per_s"], 3
        ),
    }
    out["sqlite_vs_raw_ratio"] = round(
        out["sqlite"]["transitions_per_s"] / out["raw_sqlite_tx_per_s"], 3
    )
    out["sqlite_direct_vs_raw_ratio"] = round(
        out["sqlite"]["direct"]["transitions_per_s"] / out["raw_sqlite_tx_per_s"], 3
    )
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(run(smoke=False), indent=2))
