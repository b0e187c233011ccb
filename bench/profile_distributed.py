"""`python -m bench.profile_distributed [bullmq|rabbitmq] [N]`: where a distributed run's time goes.

Runs the engine benchmark's model-ingest shape (no-op worker in the same process, 4 task slots)
on Redis + the named broker under pyinstrument's asyncio-aware profiler and writes the text
report to ``bench/out/profile-<broker>.txt``. pyinstrument samples wall-clock stacks, so time the
event loop spends waiting on Redis or the broker shows up as the awaiting frames. Not part of
``make bench``: a profile is a diagnosis, not a figure.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from pyinstrument import Profiler

from bench.bench_engine import _measure
from bench.engine_distributed import keyspace

OUT = Path(__file__).resolve().parent / "out"


async def _profiled(broker: str, n: int) -> str:
    declared: set[str] = set()
    async with keyspace(broker, declared) as (store_url, transport_url):
        profiler = Profiler(async_mode="enabled", interval=0.0005)
        profiler.start()
        figures = await _measure(store_url, transport_url, n, 5, declared)
        profiler.stop()
    header = f"{broker}: {n} runs, {figures.get('runs_per_s')} runs/s\n\n"
    return header + profiler.output_text(unicode=True, color=False, show_all=False)


def main(argv: list[str]) -> int:
    broker = argv[0] if argv else "bullmq"
    n = int(argv[1]) if len(argv) > 1 else 100
    report = asyncio.run(_profiled(broker, n))
    OUT.mkdir(exist_ok=True)
    path = OUT / f"profile-{broker}.txt"
    path.write_text(report)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
