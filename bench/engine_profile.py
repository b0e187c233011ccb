"""Where an engine run's time goes: a profile of the SQLite throughput phase, as text.

Used by :mod:`bench.bench_engine` after its measured phases (profiling slows everything down, so
the profiled phase is a separate one and its speed is not reported as a figure). The engine and
the in-process worker share the event-loop thread; every SQLite statement runs on the database's
own thread, which ``cProfile`` (one thread per profiler) does not see. So the report gives:

- the CPU split between the event-loop thread and the database thread (``time.thread_time`` in
  each), per run;
- the top functions of the event-loop thread by cumulative and by own time;
- the database thread's top functions (a second profiler, switched on inside that thread).

The text goes to ``bench/out/engine-profile.txt`` (written whole, then renamed into place).
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import os
import pstats
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from accord.adapters import _sqlite

__all__ = ["OUT", "profile_phase"]

OUT = Path(__file__).with_name("out") / "engine-profile.txt"


def _top(profile: cProfile.Profile, key: str, count: int) -> str:
    buf = io.StringIO()
    stats = pstats.Stats(profile, stream=buf)
    stats.strip_dirs().sort_stats(key).print_stats(count)
    lines = buf.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    return "\n".join(lines[start:])


def profile_phase(
    phase: Callable[[], Coroutine[Any, Any, dict[str, Any]]], runs: int, *, out: Path = OUT
) -> dict[str, float]:
    """Run ``phase`` (an engine throughput phase of ``runs`` runs) under the profilers; write the
    report; return the CPU split per run."""
    serve = _sqlite.Database._serve
    db_profiles: list[cProfile.Profile] = []
    db_cpu: list[float] = []

    def profiled_serve(self: _sqlite.Database) -> None:
        profile = cProfile.Profile()
        db_profiles.append(profile)
        began = time.thread_time()
        profile.enable()
        try:
            serve(self)
        finally:
            profile.disable()
            db_cpu.append(time.thread_time() - began)

    _sqlite.Database._serve = profiled_serve  # type: ignore[method-assign]
    loop_profile = cProfile.Profile()
    try:
        began = time.thread_time()
        loop_profile.enable()
        figures = asyncio.run(phase())
        loop_profile.disable()
        loop_cpu = time.thread_time() - began
    finally:
        _sqlite.Database._serve = serve  # type: ignore[method-assign]
    split = {
        "loop_thread_cpu_ms_per_run": round(loop_cpu * 1000 / runs, 3),
        "db_thread_cpu_ms_per_run": round(sum(db_cpu) * 1000 / runs, 3),
    }
    parts = [
        f"Engine profile: SQLite (WAL, synchronous=FULL) + embedded queue, {runs} runs at once,"
        f" no-op worker in process. Load average at start: {os.getloadavg()[0]:.2f}.",
        "Profiled figures (slowed by the profiler, not the benchmark's): "
        + ", ".join(f"{k}={v}" for k, v in figures.items() if not isinstance(v, dict)),
        "CPU per run (unprofiled share is similar): "
        + ", ".join(f"{k}={v}" for k, v in split.items()),
        "\n== event-loop thread, by cumulative time ==\n" + _top(loop_profile, "cumulative", 40),
        "\n== event-loop thread, by own time ==\n" + _top(loop_profile, "tottime", 30),
    ]
    for i, profile in enumerate(db_profiles):
        parts.append(f"\n== database thread {i}, by own time ==\n" + _top(profile, "tottime", 15))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("\n".join(parts) + "\n")
    os.replace(tmp, out)
    return split
