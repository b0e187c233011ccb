"""End to end: the model-ingest workflow through the Worker SDK, on SQLite with the embedded queue.

Two fleets, both compiled from ``workflows/model-ingest.yaml`` and run by :func:`ingest_stack`
(engine, platform actions with the cache writer, SDK runtimes with acceptance records,
heartbeats and contract validation on both sides):

- ``noop``: handlers that return a fixed contract-valid result at once. Every run has its own
  model id with no stored model, so the lookup cannot key the cache and each run takes the
  worker branch — this measures the platform, not the work. N runs are started together
  (``noop``: hops include queueing behind the other runs), then runs one at a time
  (``noop_one_at_a_time``: the bare per-hop latency).
- ``real``: the three reference workers over the sample models in ``examples/models`` (smoke:
  one model), first ``cold`` (workers run) and then ``warm`` (every model a cache hit).

Per-hop latency, from timestamps taken inside the handlers and by an engine observer:
``start_to_render`` (run started → render handler entered: lookup action, decision, dispatch,
queue, acceptance), ``render_to_branch`` (render handler returned → each fork branch's handler
entered), ``join_to_terminal`` (last branch returned → run terminal: join, publish, audit
finaliser). Figures in ms, p50 and p99; throughput in runs per second of wall time.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from accord.cli._demo_run import reference_workers
from accord.cli.demo import model_files
from accord.cli.workflow import compile_file
from accord.contracts.catalog import Catalog
from accord.contracts.fixture_values import message_of
from accord.contracts.sources import load_catalog
from accord.engine.runtime.orchestrator import Delivered
from accord.loop import run as run_loop
from accord.worker import Context, Worker
from accord.worker.fleet import ingest_stack, wait_terminal
from accord.worker.storage import ObjectStorage, StorageMap
from accord.workflow.plan import Plan, TaskStage

ROOT = Path(__file__).resolve().parents[1]
Marks = dict[str, dict[str, float]]  # run id → mark name → perf_counter seconds


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2) if ordered else -1.0


def _hops(marks: Marks) -> dict[str, float]:
    hops: dict[str, list[float]] = defaultdict(list)
    for m in marks.values():
        if "render-thumbnail:start" in m:
            hops["start_to_render"].append(m["render-thumbnail:start"] - m["started"])
            for branch in ("semantic-analysis", "technical-metadata"):
                hops["render_to_branch"].append(m[f"{branch}:start"] - m["render-thumbnail:end"])
            last = max(m["semantic-analysis:end"], m["technical-metadata:end"])
            hops["join_to_terminal"].append(m["terminal"] - last)
        hops["run"].append(m["terminal"] - m["started"])
    out: dict[str, float] = {}
    for name, values in hops.items():
        ms = [v * 1000 for v in values]
        out[f"{name}_p50_ms"], out[f"{name}_p99_ms"] = _pct(ms, 0.5), _pct(ms, 0.99)
    return out


def _instrument(worker: Worker, marks: Marks) -> Worker:
    """The same handlers, with entry and exit marked per run and stage."""
    timed = Worker(worker.name, services=worker.services)
    for cap, binding in worker.bindings.items():

        async def handle(payload: dict[str, Any], ctx: Context, b: Any = binding) -> Any:
            marks[ctx.run_id][f"{ctx.stage}:start"] = time.perf_counter()
            if b.is_async:
                result = await b.handler(payload, ctx)
            else:
                result = await asyncio.to_thread(b.handler, payload, ctx)
            marks[ctx.run_id][f"{ctx.stage}:end"] = time.perf_counter()
            return result

        timed.bind(cap, handle)
    return timed


def _noop_fleet(plan: Plan, catalog: Catalog) -> list[Worker]:
    fleet = []
    for stage in plan.stages:
        if isinstance(stage, TaskStage) and stage.type == "worker":
            contract = catalog.message(stage.capability.result)
            assert contract is not None
            fixed = message_of(contract.payload, full=False)
            w = Worker(f"noop-{stage.name}")

            async def handle(payload: dict[str, Any], ctx: Context, r: Any = fixed) -> Any:
                return dict(r) | {"modelId": payload["modelId"]}

            w.bind(stage.capability.ref, handle)
            fleet.append(w)
    return fleet


async def _pass(  # noqa: PLR0917 - one pass, every part explicit
    url: str, plan: Plan, catalog: Catalog, workers: list[Worker], models: list[str],
    state: Path, services: dict[str, Any] | None = None, *, one_by_one: bool = False,
) -> dict[str, float]:  # fmt: skip
    marks: Marks = defaultdict(dict)

    def observe(d: Delivered) -> None:
        if d.run is not None and d.run.terminal and "terminal" not in marks[d.run_id]:
            marks[d.run_id]["terminal"] = time.perf_counter()

    timed = [_instrument(w, marks) for w in workers]
    async with ingest_stack(url, plan, catalog, timed, state=state, services=services,
                            observers=[observe], slots=8) as stack:  # fmt: skip
        began = time.perf_counter()
        runs = []
        for model in models:
            run_id = await stack.engine.start_run(plan.name, {"modelId": model}, tenant="bench")
            marks[run_id]["started"] = time.perf_counter()
            runs.append(run_id)
            if one_by_one:
                await wait_terminal(stack.engine, [run_id], 600)
        await wait_terminal(stack.engine, runs, 600)
        wall = time.perf_counter() - began
        done = [await stack.engine.load(r) for r in runs]
        await stack.platform.writer.drain()
    completed = sum(1 for r in done if r is not None and r.status == "completed")
    return {"runs": len(runs), "completed": completed, "runs_per_s": round(len(runs) / wall, 2),
            **_hops({r: marks[r] for r in runs})}  # fmt: skip


async def _measure(smoke: bool, tmp: Path) -> dict[str, Any]:
    catalog = load_catalog(ROOT / "schemas" / "contracts")
    plan = compile_file(ROOT / "workflows" / "model-ingest.yaml", catalog).unwrap()
    n = 10 if smoke else 100
    noop = await _pass(f"sqlite:///{tmp / 'noop.db'}", plan, catalog, _noop_fleet(plan, catalog),
                       [f"m{i}" for i in range(n)], tmp / "noop")  # fmt: skip
    single = await _pass(f"sqlite:///{tmp / 'one.db'}", plan, catalog,
                         _noop_fleet(plan, catalog), [f"s{i}" for i in range(3 if smoke else 20)],
                         tmp / "one", one_by_one=True)  # fmt: skip
    samples = model_files(ROOT / "examples" / "models")[: 1 if smoke else None]
    state = tmp / "real"
    storage = ObjectStorage(state / "objects", "bench")
    for model_id, path in samples:
        storage.put_bytes(f"models/{model_id}{path.suffix.lower()}", path.read_bytes())
    services = {"storage": StorageMap.local(state / "objects")}
    real, ids = reference_workers(ROOT), [m for m, _ in samples]
    url = f"sqlite:///{tmp / 'real.db'}"
    cold = await _pass(url, plan, catalog, real, ids, state, services)
    warm = await _pass(url, plan, catalog, real, ids, state, services)
    return {
        "noop": noop,
        "noop_one_at_a_time": single,
        "real_cold": cold,
        "real_warm": warm,
        "models": len(ids),
    }


def run(smoke: bool) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="accord-bench-e2e-"))
    try:
        return run_loop(_measure(smoke, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
