"""Traces and metrics: what they cost the engine.

Same plan and worker as :mod:`bench.bench_engine` (``render → fork(analyse, metadata) → join →
publish``, an in-process no-op worker with 4 task slots), on the SQLite store with its embedded
queue, N runs started at once. After one warm-up phase (not counted), phases alternated three
times, each round starting one phase later (a shared machine's load drifts):

- ``off``: no sink and no metrics observer (telemetry entries are not even written);
- ``written``: a sink that does nothing: the telemetry entries are committed and dispatched
  (what any sink, the search projector included, costs before it does anything);
- ``spans``: the OpenTelemetry span builder as the engine's telemetry sink, exporting OTLP/HTTP
  protobuf (batch processor, SDK defaults) to a loopback receiver that reads and discards;
- ``spans_10`` and ``spans_0``: the same sampled at 0.1 and at 0 (``--trace-sample``): a dropped
  run's events are skipped before any span is built, and a ratio of 0 registers no span
  builder (:func:`accord.adapters.telemetry.otel.register`), so nothing is written for it;
- ``metrics``: the metrics observer on every committed transition, no sink;
- ``both``: spans and metrics.

Figures: ``engine_runs_per_s_<phase>`` (best of three), ``<phase>_cost_pct`` against ``off``
(best against best) and ``…_of_medians``, ``cpu_ms_per_run_<phase>`` (process CPU, the exporter's
thread and the loopback receiver's included; medians) and ``<phase>_cpu_cost_pct``,
``spans_over_written_pct_of_medians`` (the span builder and exporter alone), and
``spans_per_run`` / ``spans_10_per_run`` as exported.
"""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from accord.adapters import open_engine
from accord.adapters.clock import SystemClock
from accord.adapters.telemetry import metrics as mx
from accord.adapters.telemetry import otel
from accord.engine.ports import JsonValue
from accord.engine.runtime.orchestrator import EngineOptions
from accord.testing.plans import QUEUES
from accord.testing.workers import run_noop_worker
from bench.bench_engine import PLAN, _Tracker

PHASES = ("off", "written", "spans", "spans_10", "spans_0", "metrics", "both")
RATIOS = {"spans": 1.0, "spans_10": 0.1, "spans_0": 0.0, "both": 1.0}


class _Nothing:
    """A sink that takes every batch and does nothing: telemetry written and dispatched only."""

    async def emit(self, events: Any) -> None:
        return None


class _Discard(BaseHTTPRequestHandler):
    bodies = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).bodies += 1
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


async def _phase(
    folder: Path, n: int, phase: str, tracings: dict[float, otel.Tracing]
) -> dict[str, Any]:
    url = f"sqlite:///{folder / f'{uuid.uuid4().hex[:8]}.db'}"
    tracker = _Tracker()
    sink: Any = None
    if phase in RATIOS:  # what register() gives the engine at that ratio
        ratio = RATIOS[phase]
        sink = otel.OtelSink(tracings[ratio]) if ratio > 0 else None
    if phase == "written":
        sink = _Nothing()
    engine = open_engine(url, url, SystemClock(), options=EngineOptions(poll_ms=20),
                         observers=[tracker.transition], sink=sink)  # fmt: skip
    if phase in ("metrics", "both"):
        mx.EngineMetrics.attach(engine, mx.Metrics("accord-bench", env={}))
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
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        return {"runs_per_s": n / elapsed, "spans": getattr(sink, "spans", 0),
                "cpu_ms_per_run": cpu * 1000 / n}  # fmt: skip
    finally:
        stop.set()
        await worker
        await engine.stop()
        gc.unfreeze()


async def _main(smoke: bool) -> dict[str, Any]:
    n = 40 if smoke else 400
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Discard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    saved = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{server.server_address[1]}"
    otel.reset()
    tracings = {r: otel.Tracing("accord-bench", r) for r in (1.0, 0.1)}
    try:
        got: dict[str, list[dict[str, Any]]] = {p: [] for p in PHASES}
        with tempfile.TemporaryDirectory(prefix="accord-bench-telemetry-") as tmp:
            await _phase(Path(tmp), n, "off", tracings)  # warm-up, not counted
            for round_ in range(1 if smoke else 3):
                # each round starts one phase later: no phase always runs first (or last)
                for phase in PHASES[round_:] + PHASES[:round_]:
                    got[phase].append(await _phase(Path(tmp), n, phase, tracings))
        for tracing in tracings.values():
            tracing.flush()
            tracing.close()
    finally:
        otel.reset()
        if saved is None:
            os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        else:
            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = saved
        server.shutdown()
        server.server_close()
    best = {p: max(r["runs_per_s"] for r in got[p]) for p in PHASES}
    median = {p: statistics.median(r["runs_per_s"] for r in got[p]) for p in PHASES}
    figures: dict[str, JsonValue] = {"runs": n}
    for p in PHASES:
        figures[f"engine_runs_per_s_{p}"] = round(best[p], 1)
    for p in PHASES[1:]:
        figures[f"{p}_cost_pct"] = round(100 * (1 - best[p] / best["off"]), 1)
        figures[f"{p}_cost_pct_of_medians"] = round(100 * (1 - median[p] / median["off"]), 1)
    cpu = {p: statistics.median(r["cpu_ms_per_run"] for r in got[p]) for p in PHASES}
    for p in PHASES:
        figures[f"cpu_ms_per_run_{p}"] = round(cpu[p], 2)
    for p in PHASES[1:]:
        figures[f"{p}_cpu_cost_pct"] = round(100 * (cpu[p] / cpu["off"] - 1), 1)
    figures["spans_over_written_pct_of_medians"] = round(
        100 * (1 - median["spans"] / median["written"]), 1
    )
    for p in ("spans", "spans_10"):
        spans = [r["spans"] for r in got[p]]
        figures[f"{p}_per_run"] = round(statistics.median(spans) / n, 2)
    figures["spans_per_run"] = figures.pop("spans_per_run")
    figures["otlp_requests"] = _Discard.bodies
    return figures


def run(smoke: bool) -> dict[str, Any]:
    return asyncio.run(_main(smoke))


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run("--smoke" in sys.argv), indent=2))
