"""The search projector under the fleet benchmark's load (:mod:`bench.bench_fleet`).

With ``ACCORD_BENCH_FLEET_LAG=1`` the fleet benchmark's own engine (this process) gets the
projector as ``accord engine run`` wires it — a :class:`~accord.adapters.telemetry.FanoutSink`
with the :class:`~accord.engine.runtime.projector.Projector` required in it, ``linger_ms`` 100,
a SQLite projection in the benchmark's temporary folder — while the store and queues are the
configuration's (Redis with BullMQ or RabbitMQ, or PostgreSQL). Figures over the throughput
phase: ``projector_lag_p50_ms`` / ``_p95_ms`` / ``_max_ms`` (the projector's lag metric after
each batch: the age of its newest event when indexed), ``projection_catch_up_ms`` (last run
ended → the projection holds the last 20 runs as ended) and ``projector_events_per_s`` (of its
own time). Only configurations with one engine are meaningful: a second engine process has no
projector and writes no telemetry.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from accord.adapters.projection import open_projection
from accord.adapters.telemetry import FanoutSink
from accord.engine.runtime.projector import Projector
from bench.bench_engine import _pct

ENV = "ACCORD_BENCH_FLEET_LAG"
LINGER_MS = 100  # as accord.cli.telemetry.LINGER_MS


class LagWatch:
    """The projector of the fleet's engine, its lag after each batch and its busy time."""

    def __init__(self, folder: Path) -> None:
        self.projection = open_projection(f"sqlite:///{folder / 'fleet.projection.db'}")
        self.sink = FanoutSink()
        self.projector: Projector | None = None
        self.lags: list[int] = []
        self.busy_s = 0.0
        self.events = 0

    def attach(self, engine: Any) -> None:
        self.projector = Projector(engine.store, self.projection, engine.clock,
                                   linger_ms=LINGER_MS)  # fmt: skip
        self.sink.register("projection", self, required=True)
        engine.observers.append(self.projector)

    async def emit(self, events: Any) -> None:
        assert self.projector is not None
        began = time.perf_counter()
        try:
            await self.projector.emit(events)
        finally:
            self.busy_s += time.perf_counter() - began
        self.events += len(events)
        self.lags.append(self.projector.stats.lag_ms)

    def mark(self) -> None:
        """The throughput phase starts: forget the warm-up's figures."""
        self.lags.clear()
        self.busy_s, self.events = 0.0, 0

    async def figures(self, runs: list[str], done: dict[str, float]) -> dict[str, Any]:
        lags, busy, events = list(self.lags), self.busy_s, self.events
        last = max(done[r] for r in runs)
        caught = float("nan")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            docs = [await self.projection.get(r) for r in runs[-20:]]
            if all(d is not None and d.body.get("ended_at_ms") for d in docs):
                caught = (time.perf_counter() - last) * 1000
                break
            await asyncio.sleep(0.01)
        return {
            "projector_lag_p50_ms": _pct([float(x) for x in lags], 0.5),
            "projector_lag_p95_ms": _pct([float(x) for x in lags], 0.95),
            "projector_lag_max_ms": float(max(lags, default=0)),
            "projection_catch_up_ms": round(caught, 1),
            "projector_events_per_s": round(events / busy, 1) if busy else 0.0,
        }

    async def close(self) -> None:
        if self.projector is not None:
            await self.projector.drain()
        await self.projection.close()


def watch() -> LagWatch | None:
    """A :class:`LagWatch` (its projection in a temporary folder) when ``ACCORD_BENCH_FLEET_LAG``
    asks for one, else ``None``."""
    if os.environ.get(ENV, "").strip() in ("", "0"):
        return None
    return LagWatch(Path(tempfile.mkdtemp(prefix="accord-fleet-lag-")))
