"""Traces and metrics: what they cost the engine.

Same plan and worker as :mod:`bench.bench_engine` (``render → fork(analyse, metadata) → join →
publish``, an in-process no-op worker with 4 task slots), on the SQLite store with its embedded
queue, N runs started at once. Phases, alternated three times (a shared machine's load drifts):

- ``off``: no sink and no metrics observer (telemetry entries are not even written);
- ``written``: a sink that does nothing: the telemetry entries are committed and dispatched
  (what any sink, the search projector included, costs before it does anything);
- ``spans``: the OpenTelemetry span builder as the engine's telemetry sink, exporting OTLP/HTTP
  protobuf (batch processor, SDK defaults) to a loopback receiver that reads and discards;
- ``metrics``: the metrics observer on every committed transition, no sink;
- ``both``: spans and metrics.

Figures: ``engine_runs_per_s_<phase>`` (best of three), ``<phase>_cost_pct`` against ``off``
(best against best) and ``…_of_medians``, ``spans_over_written_pct_of_medians`` (the span
builder and exporter alone), and ``spans_per_run`` as exported.
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

PHASES = ("off", "written", "spans", "metrics", "both")


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


async def _phase(folder: Path, n: int, phase: str, tracing: otel.Tracing) -> dict[str, Any]:
    url = f"sqlite:///{folder / f'{uuid.uuid4().hex[:8]}.db'}"
    tracker = _Tracker()
    sink: Any = otel.OtelSink(tracing) if phase in ("spans", "both") else None
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
        t0 = time.perf_counter()
        runs = [await engine.start_run(PLAN.name, {"modelId": f"m{i}"}) for i in range(n)]
        await tracker.wait(runs)
        elapsed = time.perf_counter() - t0
        return {"runs_per_s": n / elapsed, "spans": getattr(sink, "spans", 0)}
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
    tracing = otel.tracing("accord-bench")
    assert tracing is not None
    try:
        got: dict[str, list[dict[str, Any]]] = {p: [] for p in PHASES}
        with tempfile.TemporaryDirectory(prefix="accord-bench-telemetry-") as tmp:
            for _ in range(1 if smoke else 3):
                for phase in PHASES:
                    got[phase].append(await _phase(Path(tmp), n, phase, tracing))
        tracing.flush()
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
    figures["spans_over_written_pct_of_medians"] = round(
        100 * (1 - median["spans"] / median["written"]), 1
    )
    spans = [r["spans"] for r in got["spans"]]
    figures["spans_per_run"] = round(statistics.median(spans) / n, 1)
    figures["otlp_requests"] = _Discard.bodies
    return figures


def run(smoke: bool) -> dict[str, Any]:
    return asyncio.run(_main(smoke))


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run("--smoke" in sys.argv), indent=2))
