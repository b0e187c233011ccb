"""Workflow compile time for generated plans of 10, 100 and 1,000 stages.

The generated definitions repeat one block of ten stages — four tasks (workers and actions, with
retry and timeouts), a decision over a completed stage's result with a ``"true"`` fallback, and
a fork of two branches into a join — so every check layer does real work: schema, graph with
fork membership, contracts and bindings with completion guarantees, CEL, the deadline budget.

Figures (milliseconds, median of several runs unless smoke):

- ``compile_ms.<n>`` / ``compile_cpu_ms.<n>``: wall and CPU time from parsed data (all five
  layers, plan construction and digest) — the compiler's own cost; target ≤ 200 ms for 1,000
  stages (CPU time is the stable figure on a shared host);
- ``compile_text_ms.<n>``: from YAML text, parsing with line/column tracking included (the
  pure-Python ruamel.yaml composer dominates this at large sizes);
- ``plan_bytes.<n>``: size of the canonical plan JSON.

Run: ``python -m bench.bench_compile [--smoke]``; ``python -m bench`` runs it with the rest.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from accord.testing.strategies import synthetic_catalog
from accord.workflow.compiler import compile_definition, compile_workflow

SIZES = (10, 100, 1_000)


def _task(name: str, nxt: str, kind: str, reads: str | None) -> dict[str, Any]:
    stage: dict[str, Any] = {"name": name, "type": kind, "on_success": nxt, "on_failure": "failed"}
    if kind == "worker":
        stage |= {"worker": "work.a@1", "queue": "q-a", "input": {"id": "${context.id}"}}
        if reads:
            stage["input"]["count"] = f'${{stages["{reads}"].result.nested.x}}'
        stage["retry"] = {"max_attempts": 2, "initial_backoff_ms": 100, "max_backoff_ms": 1000}
        stage["timeouts"] = {"queue_deadline_ms": 1_000, "execution_deadline_ms": 5_000}
    else:
        stage |= {"action": "act.a@1", "input": {"id": "x"}}
    return stage


def definition(n: int) -> dict[str, Any]:
    """A valid definition of exactly ``n`` stages (``n`` a multiple of ten)."""
    stages: list[dict[str, Any]] = []
    blocks = n // 10
    for b in range(blocks):
        p = f"b{b}-"
        after = f"b{b + 1}-t0" if b + 1 < blocks else "completed"
        prior = f"b{b - 1}-t3" if b else None
        stages += [
            _task(p + "t0", p + "t1", "worker", prior),
            _task(p + "t1", p + "t2", "action", None),
            _task(p + "t2", p + "d", "worker", p + "t0"),
            {
                "name": p + "d",
                "type": "decision",
                "on_evaluation_error": "failed",
                "branches": [
                    {"when": f'stages["{p}t2"].result.score > 0.5', "next": p + "f"},
                    {"when": "true", "next": p + "f"},
                ],
            },
            {"name": p + "f", "type": "fork", "branches": [p + "x0", p + "y0"]},
            _task(p + "x0", p + "x1", "worker", p + "t2"),
            _task(p + "x1", p + "j", "action", None),
            _task(p + "y0", p + "j", "worker", p + "t0"),
            {
                "name": p + "j",
                "type": "join",
                "required": [p + "x0", p + "y0"],
                "on_success": p + "t3",
                "on_failure": "failed",
            },
            _task(p + "t3", after, "worker", p + "x0"),
        ]
    return {
        "name": f"bench-{n}",
        "version": "1",
        "entry": "b0-t0",
        "context": "ctx@1",
        "deadline_ms": 30 * 86_400_000,
        "stages": stages,
        "terminals": ["completed", "failed"],
    }


def _median_ms(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median (wall, CPU) milliseconds; CPU time is what the compiler costs on a busy host."""
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
    return round(statistics.median(wall), 2), round(statistics.median(cpu), 2)


def run(smoke: bool = False) -> dict[str, Any]:
    catalog = synthetic_catalog()
    keys = ("compile_ms", "compile_cpu_ms", "compile_text_ms", "plan_bytes")
    out: dict[str, dict[str, float]] = {k: {} for k in keys}
    for n in SIZES:
        doc = definition(n)
        text = json.dumps(doc, indent=1)  # JSON is YAML; ruamel composes it with positions
        plan = compile_definition(doc, catalog).unwrap()
        assert len(plan.stages) == n
        repeats = 1 if smoke else (5 if n >= 1_000 else 10)

        def from_data(d: dict[str, Any] = doc) -> object:
            return compile_definition(d, catalog)

        def from_text(t: str = text) -> object:
            return compile_workflow(t, "bench.yaml", catalog)

        out["compile_ms"][str(n)], out["compile_cpu_ms"][str(n)] = _median_ms(from_data, repeats)
        out["compile_text_ms"][str(n)] = _median_ms(from_text, 1 if smoke else 3)[0]
        out["plan_bytes"][str(n)] = len(plan.canonical_bytes())
    return out


if __name__ == "__main__":
    print(json.dumps(run("--smoke" in sys.argv[1:]), indent=2))
