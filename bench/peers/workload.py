"""The reference workload every system runs, and the measuring helpers they share.

The shape is model-ingest with no-op tasks: ``A → fork(B, C) → join → D``. Each task records
wall-clock start and end (``time.time()``, comparable across processes on one machine) and
hands them on with its result, so the caller gets every timestamp of a run back with the run's
result and no extra store is written. From them:

- hops (end of one task to start of the next): ``A→B``, ``A→C`` and ``join→D`` (the later of
  B and C ending, to D starting): three per run;
- transitions per run: fixed by the shape, not by how a system counts its own steps — run start
  plus each of the four tasks started and completed (9), so transitions/s compare like for like.

Every peer works within a wall-clock budget (``$BENCH_BUDGET_S``) so ``make bench`` stays
bounded on a slow or loaded machine: a batch that its measured rate predicts would overrun is
not started, and is listed under ``skipped`` with the prediction, never silently left out; the
sequential latency phase stops early at the deadline and reports how many runs it took.

This module is imported inside each peer's own virtual environment (the repository root on
``PYTHONPATH``), so it uses the standard library only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

STAGES = ("A", "B", "C", "D")
TRANSITIONS_PER_RUN = 9
TASK_SLOTS = 4
Stamps = dict[str, list[float]]


def sizes(smoke: bool) -> dict[str, Any]:
    """Run counts: throughput batches, sequential latency runs, worker-count sweep."""
    if smoke:
        return {"throughput": [20], "latency": 10, "scaling": [], "scaling_runs": 0}
    return {"throughput": [200, 1000], "latency": 200, "scaling": [1, 2, 4], "scaling_runs": 100}


class Budget:
    """Wall-clock allowance for one peer's measurements."""

    def __init__(self) -> None:
        self.deadline = time.monotonic() + float(os.environ.get("BENCH_BUDGET_S", "600"))
        self.skipped: list[str] = []
        self.rate = 0.0  # runs/s last measured, to predict the next batch

    def phase_end(self, share: float) -> float:
        """A deadline for a phase allowed ``share`` of what is left."""
        return time.monotonic() + share * max(self.left(), 0)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def allows(self, what: str, runs: int) -> bool:
        if self.rate <= 0 or runs / self.rate <= self.left():
            return True
        self.skipped.append(
            f"{what}: {runs} runs predicted {runs / self.rate:.0f} s at {self.rate:.1f} runs/s,"
            f" {max(self.left(), 0):.0f} s of budget left"
        )
        return False


def stamp(started: float) -> list[float]:
    return [started, time.time()]


def hops_ms(stamps: Stamps) -> dict[str, float]:
    """The three hops of one run, in milliseconds."""
    join = max(stamps["B"][1], stamps["C"][1])
    return {
        "A→B": (stamps["B"][0] - stamps["A"][1]) * 1000,
        "A→C": (stamps["C"][0] - stamps["A"][1]) * 1000,
        "join→D": (stamps["D"][0] - join) * 1000,
    }


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency_figures(e2e_ms: list[float], runs: list[Stamps]) -> dict[str, Any]:
    hops = [hops_ms(s) for s in runs]
    every = [v for h in hops for v in h.values()]
    out: dict[str, Any] = {
        "e2e_p50_ms": round(percentile(e2e_ms, 0.5), 3),
        "e2e_p99_ms": round(percentile(e2e_ms, 0.99), 3),
        "hop_p50_ms": round(percentile(every, 0.5), 3),
        "hop_p99_ms": round(percentile(every, 0.99), 3),
    }
    for name in ("A→B", "A→C", "join→D"):
        out[f"hop_{name}_p50_ms"] = round(percentile([h[name] for h in hops], 0.5), 3)
    return out


def throughput_figures(runs: int, seconds: float, cpu_s: float) -> dict[str, float]:
    return {
        "runs_per_s": round(runs / seconds, 1),
        "transitions_per_s": round(runs * TRANSITIONS_PER_RUN / seconds, 1),
        "cpu_ms_per_run": round(cpu_s * 1000 / runs, 3),
    }


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (Linux ``/proc``)."""
    tree, out, todo = _children(), [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(tree.get(current, []))
    return out


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of the given live processes."""
    ticks, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def peak_rss_mib(pids: list[int]) -> float:
    """Sum of each process's peak resident set (``VmHWM``)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return round(total / 1024, 1)


def finish(figures: dict[str, Any], budget: Budget, e2e: list[float], runs: list[Stamps]) -> None:
    """Add the latency figures and what the budget skipped, then emit."""
    figures["latency"] = latency_figures(e2e, runs) | {"runs": len(e2e)}
    if len(e2e) < figures.pop("latency_planned", len(e2e)):
        budget.skipped.append(f"latency: stopped after {len(e2e)} runs at the phase deadline")
    figures["skipped"] = "; ".join(budget.skipped) or "none"
    emit(figures, {"hops_ms": [v for s in runs for v in hops_ms(s).values()]})


def emit(figures: dict[str, Any], samples: dict[str, list[float]]) -> None:
    """Print the figures as the last stdout line; raw hop samples go to ``$BENCH_SAMPLES``."""
    path = os.environ.get("BENCH_SAMPLES")
    if path:
        Path(path).write_text(json.dumps(samples))
    sys.stdout.write(json.dumps(figures) + "\n")
    sys.stdout.flush()
