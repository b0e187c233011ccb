"""The running part of ``accord demo``: compile, start the fleet, ingest, watch, report.

Models are copied into the tenant's object store under ``models/<modelId>.<ext>`` (the key the
workers and the cache lookup resolve from a bare ``modelId``), one run is started per model, and
the live table is redrawn from the store until every run is terminal. The store and transport
are the embedded SQLite file in the state directory unless ``store``/``transport`` name others
(Redis with BullMQ or RabbitMQ): the same engine, actions and workers then talk through the real
store and broker, each worker on its own connection, as they would from separate processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import sys
import time
from pathlib import Path
from typing import Any

from rich.live import Live

from accord.cli._common import console
from accord.cli._demo_view import ModelRun, live_table, summarise, summary_table
from accord.cli._registry import Workspace
from accord.cli.workflow import compile_file
from accord.contracts.sealing import Keyring
from accord.contracts.sources import load_catalog
from accord.engine.machine.state import RunState
from accord.engine.runtime.orchestrator import Engine
from accord.worker.fleet import ingest_stack
from accord.worker.storage import ObjectStorage, StorageMap
from accord.workflow.plan import Plan

WORKERS = (
    ("thumbnail-render", "accord_worker_thumbnail_render.handler"),
    ("semantic-analyse", "accord_worker_semantic_analyse.handler"),
    ("metadata-extract", "accord_worker_metadata_extract.handler"),
)


def reference_workers(root: Path) -> list[Any]:
    """The three reference workers; from ``workers/*/src`` when they are not installed."""
    found = []
    for folder, module_name in WORKERS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            for base in (root, Path(__file__).resolve().parents[3]):  # workspace, then checkout
                sys.path.insert(0, str(base / "workers" / folder / "src"))
            module = importlib.import_module(module_name)
        found.append(module.worker)
    return found


__all__ = ["run_demo"]


async def start_and_follow(
    engine: Engine,
    plan: Plan,
    models: list[tuple[str, Path]],
    tenant: str,
    title: str,
    *,
    quiet: bool,
) -> tuple[list[ModelRun], dict[str, RunState | None]]:
    """Start one run of ``plan`` per model and follow them to their ends, drawn as a live table
    unless ``quiet``; the runs and their final records."""
    runs = [
        ModelRun(model_id, path, await engine.start_run(plan.name, {"modelId": model_id},
                                                        tenant=tenant))
        for model_id, path in models
    ]  # fmt: skip
    states: dict[str, RunState | None] = {}
    view = None if quiet else Live(live_table(runs, states, title), console=console,
                                   refresh_per_second=8)  # fmt: skip
    with view or contextlib.nullcontext():
        while True:
            for mr in runs:
                states[mr.run_id] = await engine.load(mr.run_id)
            if view is not None:
                view.update(live_table(runs, states, title))
            if all(s is not None and s.terminal for s in states.values()):
                return runs, states
            await asyncio.sleep(0.1)


def _ingest(objects: Path, tenant: str, models: list[tuple[str, Path]]) -> None:
    storage = ObjectStorage(objects, tenant)
    for model_id, path in models:
        key = f"models/{model_id}{path.suffix.lower()}"
        data = path.read_bytes()
        target = objects / tenant / key
        if not target.is_file() or target.read_bytes() != data:
            storage.put_bytes(key, data)


async def run_demo(
    ws: Workspace,
    models: list[tuple[str, Path]],
    state: Path,
    tenant: str,
    *,
    quiet: bool,
    store: str | None = None,
    transport: str | None = None,
    sealing: Keyring | None = None,
) -> list[dict[str, Any]]:
    catalog = load_catalog(ws.sources)
    workflow = ws.root / "workflows" / "model-ingest.yaml"
    plan = compile_file(workflow, catalog).unwrap()
    state.mkdir(parents=True, exist_ok=True)
    objects = state / "objects"
    await asyncio.to_thread(_ingest, objects, tenant, models)
    workers = reference_workers(ws.root)
    url = store or f"sqlite:///{state / 'accord.db'}"
    services = {"storage": StorageMap.local(objects)}
    if not quiet:
        console.print(f"workflow [bold]{plan.name}@{plan.version}[/bold] compiled: {plan.digest}")
    started = time.perf_counter()
    async with ingest_stack(
        url, plan, catalog, workers, state=state, services=services, transport=transport,
        sealing=sealing,
    ) as stack:  # fmt: skip
        engine = stack.engine
        if not quiet:
            live = await engine.live_capabilities()
            console.print("admitted; live capabilities: " + ", ".join(sorted(live)))
        title = f"model-ingest over {len(models)} models (tenant {tenant})"
        runs, states = await start_and_follow(engine, plan, models, tenant, title, quiet=quiet)
        if not quiet:
            console.print()
        await stack.platform.writer.drain()
    elapsed = time.perf_counter() - started
    rows = []
    for mr in runs:
        run = states[mr.run_id]
        assert run is not None
        rows.append(summarise(mr, run, state, objects))
    if not quiet:
        hits = sum(r["route"] == "cache hit" for r in rows)
        console.print(summary_table(rows, f"{len(rows)} models in {elapsed:.1f} s, {hits} from "
                                          "the cache"))  # fmt: skip
        _where(state, objects, tenant, hits, len(rows), store)
    return rows


def _where(  # noqa: PLR0917 - the report's parts
    state: Path, objects: Path, tenant: str, hits: int, total: int, store: str | None
) -> None:
    here = Path.cwd()

    def show(p: Path) -> str:
        return str(p.relative_to(here)) if p.is_relative_to(here) else str(p)

    console.print("outputs:")
    console.print(f"  thumbnails and models  {show(objects / tenant)}")
    console.print(f"  stage result cache     {show(state / 'cache')}")
    console.print(f"  catalogue (SQLite)     {show(state / 'catalogue.db')}")
    console.print(f"  audit log (SQLite)     {show(state / 'audit.db')}")
    runs = store or show(state / "accord.db")
    console.print(f"  runs and history       {runs}  (accord runs … --store …)")
    if hits < total:
        console.print("run [bold]accord demo[/bold] again: the same models come from the cache.")
