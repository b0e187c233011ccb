"""An engine, the platform actions and a fleet of SDK workers in one process.

:func:`ingest_stack` is what ``accord demo``, the end-to-end tests and the benchmark run: open the
store and transport by URL (``url`` names both, as one SQLite file does; ``transport=`` names
another: ``bullmq://…``, ``amqp://…``), register the platform actions (cache, catalogue, audit)
and the cache writer, start one :class:`~accord.worker.runtime.Runtime` per worker on the
engine's transport, announce capabilities, check admission, register and activate the plan, and
start the engine::

    async with ingest_stack(url, plan, catalog, workers, state=...) as stack:
        run_id = await stack.engine.start_run(plan.name, {"modelId": "m1"}, tenant="demo")

Leaving the block stops the workers gracefully first (in-flight jobs finish), then the engine,
then waits for pending cache writes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accord.actions import Platform, PlatformConfig, register_platform_actions
from accord.actions.config import Locator
from accord.adapters import open_engine
from accord.contracts.catalog import Catalog
from accord.contracts.sealing import Keyring
from accord.engine.runtime.checks import contract_result_check
from accord.engine.runtime.orchestrator import Engine, EngineOptions, Observer
from accord.errors import EngineError
from accord.objects.ports import ObjectStore
from accord.worker.acceptance import AcceptanceLog
from accord.worker.runtime import Runtime
from accord.worker.sdk import Worker
from accord.workflow.plan import Plan

__all__ = ["Stack", "ingest_stack", "wait_terminal"]


@dataclass
class Stack:
    engine: Engine
    platform: Platform
    runtimes: list[Runtime]
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


@contextlib.asynccontextmanager
async def ingest_stack(
    url: str,
    plan: Plan,
    catalog: Catalog,
    workers: Sequence[Worker],
    *,
    state: Path,
    services: Mapping[str, Any] | None = None,
    observers: Sequence[Observer] = (),
    heartbeat_ms: int = 2_000,
    slots: int = 4,
    poll_ms: int = 10,
    check_admission: bool = True,
    transport: str | None = None,
    sealing: Keyring | None = None,
    locate: Locator | None = None,
    cache_store: ObjectStore | None = None,
) -> AsyncIterator[Stack]:
    engine = open_engine(
        url,
        transport or url,
        options=EngineOptions(poll_ms=poll_ms),
        result_checks=[contract_result_check(catalog)],
        catalog=catalog,
        sealing=sealing,
    )

    async def load_run(run_id: str) -> dict[str, Any] | None:
        stored = await engine.store.load(run_id)
        return dict(stored.state) if stored else None

    config = PlatformConfig(
        state, catalog=catalog, load_run=load_run, locate=locate, cache_store=cache_store
    )
    platform = register_platform_actions(engine.registry, config)
    platform.writer.watch(plan)
    engine.observers.extend([platform.writer, *observers])
    runtimes = []
    for w in workers:
        w.services.update(services or {})
        log = AcceptanceLog(state / "workers" / f"{w.name}.acceptance.db")
        runtimes.append(Runtime(w, engine.transport, catalog=catalog, acceptance=log,
                                announce=engine.announce, heartbeat_ms=heartbeat_ms,
                                slots=slots, sealing=sealing))  # fmt: skip
    stack = Stack(engine, platform, runtimes)
    try:
        for rt in runtimes:
            await engine.announce(rt.worker_id, rt.worker.capabilities, 30_000)
        refused = await engine.admit(plan) if check_admission else []
        if refused:
            raise EngineError("plan not admitted: " + "; ".join(d.message for d in refused))
        await engine.register_plan(plan)
        await engine.start()
        spawn = asyncio.get_running_loop().create_task
        stack.tasks = [spawn(rt.run(stack.stop)) for rt in runtimes]
        yield stack
    finally:
        stack.stop.set()
        await asyncio.gather(*stack.tasks, return_exceptions=True)
        await engine.executor.wait_idle()
        await engine.stop()
        await platform.writer.drain()
        for rt in runtimes:
            rt.acceptance.close()
        platform.close()


async def wait_terminal(engine: Engine, run_ids: Sequence[str], timeout_s: float = 120) -> None:
    """Poll the store until every run is terminal (``TimeoutError`` after ``timeout_s``)."""
    async with asyncio.timeout(timeout_s):
        pending = set(run_ids)
        while pending:
            for run_id in list(pending):
                run = await engine.load(run_id)
                if run is not None and run.terminal:
                    pending.discard(run_id)
            if pending:
                await asyncio.sleep(0.02)
