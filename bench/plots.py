"""PNG plots beside RESULTS.md: per-hop latency distributions and throughput vs task slots.

- ``hops.png``: the empirical distribution (CDF, log-scale ms) of every per-hop latency sample
  the peers recorded in their sequential-latency phase (``bench/out/samples/<peer>.json``), with
  Accord's per-hop p50 and p99 from the engine benchmark as marked points (the engine reports
  percentiles, not samples) — the same hops, end of one task to start of the next.
- ``scaling.png``: runs/s against task slots (1, 2, 4) for each peer, and Accord's figures at
  slots ``bench_scaling`` measured (``scaling.<backend>.scaling.<slots>``; failing that the
  engine benchmark's, or its 4-slot throughput); with the fleet benchmark, the distributed
  back-ends as deployed: the configurations with one engine process, at their task slots in all
  (worker processes × slots each).

For the distributed back-ends, the hop marks are the fleet benchmark's (engine and worker
processes apart) when it ran, else the in-process engine benchmark's.

matplotlib (Agg backend, no display) comes with the ``dev`` extra.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from bench.summary import FLEET_BACKENDS, PEERS, deployed, figure, fleet_configs, peer_ok

BACKENDS = ("memory", "sqlite", "bullmq", "rabbitmq")


def _hop_samples(samples: Path) -> dict[str, list[float]]:
    out = {}
    for peer in PEERS:
        path = samples / f"{peer}.json"
        if path.exists():
            values = json.loads(path.read_text()).get("hops_ms", [])
            if values:
                out[peer] = sorted(float(v) for v in values if v > 0)
    return out


def _scaling(results: dict[str, Any]) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    for peer in PEERS:
        if not peer_ok(results, peer):
            continue
        points = [(s, figure(results, "peers", f"{peer}.scaling.{s}")) for s in (1, 2, 4, 8)]
        found = [(s, v) for s, v in points if v is not None]
        if found:
            series[peer] = found
    for backend in BACKENDS:
        points = [
            (s, figure(results, "scaling", f"{backend}.scaling.{s}") or
             figure(results, "engine", f"{backend}.scaling.{s}"))
            for s in (1, 2, 4, 8)
        ]  # fmt: skip
        found = [(s, v) for s, v in points if v is not None]
        if not found:
            rate = figure(results, "engine", f"{backend}.runs_per_s")
            found = [(4, rate)] if rate is not None else []
        if found:
            series[f"accord {backend}"] = found
    for broker in FLEET_BACKENDS:
        fleet = []
        for label, prefix in fleet_configs(results, broker):
            config = re.fullmatch(r"e(\d+)w(\d+)(?:s(\d+))?", label.split()[0])
            rate = figure(results, "fleet", f"{prefix}.runs_per_s")
            if config and config[1] == "1" and rate is not None:
                fleet.append((int(config[2]) * int(config[3] or 4), rate))
        if fleet:
            series[f"accord {broker} fleet (1 engine; x: workers × slots)"] = sorted(fleet)
    return series


def write(results: dict[str, Any], out: Path, samples: Path) -> list[Path]:
    """Write the plots into ``out``; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, ax = plt.subplots(figsize=(8, 5))
    for peer, values in _hop_samples(samples).items():
        fractions = [(i + 1) / len(values) for i in range(len(values))]
        ax.step(values, fractions, where="post", label=f"{peer} ({len(values)} hops)")
    for backend in BACKENDS:
        p50 = deployed(results, backend, "hop_p50_ms_single_run") or deployed(
            results, backend, "hop_p50_ms"
        )
        p99 = deployed(results, backend, "hop_p99_ms_single_run") or deployed(
            results, backend, "hop_p99_ms"
        )
        if p50 is not None and p50 > 0:
            xs, ys = ([p50, p99], [0.5, 0.99]) if p99 and p99 > 0 else ([p50], [0.5])
            ax.plot(xs, ys, marker="o", linestyle="--", label=f"accord {backend} (p50, p99)")
    ax.set_xscale("log")
    ax.set_xlabel("per-hop latency, ms (end of a task → start of the next)")
    ax.set_ylabel("fraction of hops ≤ x")
    ax.set_title("Per-hop latency, A → fork(B, C) → join → D, sequential runs")
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "hops.png", dpi=110)
    plt.close(fig)
    written.append(out / "hops.png")

    fig, ax = plt.subplots(figsize=(8, 5))
    ticks: set[int] = set()
    for name, points in _scaling(results).items():
        slots, rates = zip(*points, strict=True)
        ax.plot(slots, rates, marker="o", label=name)
        ticks.update(int(s) for s in slots)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sorted(ticks), [str(t) for t in sorted(ticks)])
    ax.minorticks_off()
    ax.set_xlabel("task slots")
    ax.set_ylabel("runs/s (log)")
    ax.set_title("Throughput vs task slots (100–1,000 runs started at once)")
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "scaling.png", dpi=110)
    plt.close(fig)
    written.append(out / "scaling.png")
    return written
