"""Trigger-to-first-dispatch latency, per trigger type, on the embedded default (one SQLite file).

For each trigger type, the time from the trigger's event to the first job of the run it starts
being delivered on the worker queue (``p50_ms``, ``p99_ms``, ``max_ms`` over ``samples``):

- ``schedule``: from a scheduler pass that finds a due tick (:meth:`Scheduler.tick`; the claim of
  the fire record, admission, the run's first commit) to the job's delivery;
- ``webhook``: from sending a signed ``POST /v1/triggers/{workflow}/{trigger}`` over loopback to
  uvicorn (signature, replay claim, contract validation, admission, start) to the job's delivery;
- ``message``: from publishing the event on the trigger's queue (consumption, validation,
  dedupe, admission, start) to the job's delivery.

Each sample starts a new run (a new tick, a new dedupe key); the engine runs in the process with
its dispatcher started, and admission reads the live capability announcement.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from accord.adapters import open_engine
from accord.adapters.ingress.app import create_app
from accord.adapters.ingress.control import ControlStore
from accord.adapters.ingress.limits import ApiLimits
from accord.adapters.ingress.triggers import (
    MessageTriggers,
    SourceConfig,
    TriggerIntake,
    TriggerSources,
)
from accord.adapters.ingress.webhooks import sign_headers
from accord.contracts.sources import load_catalog
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.engine.runtime.schedules import Scheduler, due_ticks
from accord.workflow.compiler import compile_workflow
from accord.workflow.plan import Plan
from accord.workflow.triggers import ScheduleTrigger

ROOT = Path(__file__).resolve().parents[1]
SECRET = "whsec_" + base64.b64encode(b"b" * 32).decode()
QUEUE = "bench.triggers.jobs"
EVENTS = "bench.triggers.events"
DEFINITION = f"""
name: bench-triggers
version: "1"
owner: bench
review_date: "2999-12-31"
context: model-ingest-context@1
entry: extract
terminals: [completed, failed]
stages:
  - name: extract
    type: worker
    worker: metadata.extract@2
    queue: {QUEUE}
    input: {{ modelId: "${{context.modelId}}" }}
    on_success: completed
    on_failure: failed
triggers:
  - name: tick
    type: schedule
    cron: "* * * * *"
    overlap: allow
    context: {{ modelId: scheduled }}
  - name: hook
    type: webhook
    source: bench
    event: model-ingest-context@1
    context: {{ modelId: "${{event.modelId}}" }}
    dedupe: "${{event.modelId}}"
  - name: queued
    type: message
    event: model-ingest-context@1
    queue: {EVENTS}
    context: {{ modelId: "${{event.modelId}}" }}
    dedupe: "${{event.modelId}}"
"""


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _figures(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "samples": len(ordered),
        "p50_ms": round(statistics.median(ordered), 2),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 2),
        "max_ms": round(ordered[-1], 2),
    }


class _Jobs:
    """Deliveries of the worker queue, each acknowledged, stamped on arrival."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.arrived: asyncio.Queue[float] = asyncio.Queue()
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        async for delivery in self.engine.transport.consume(QUEUE, 16):
            self.arrived.put_nowait(time.perf_counter())
            await self.engine.transport.ack(delivery)

    async def after(self, began: float, fire: Callable[[], Awaitable[Any]]) -> float:
        await fire()
        arrived = await asyncio.wait_for(self.arrived.get(), 30)
        return (arrived - began) * 1000

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def _schedule(engine: Engine, plan: Plan, jobs: _Jobs, n: int) -> list[float]:
    sched = Scheduler(engine, [plan.name], misfire_ms=10**9)
    trigger = plan.triggers[0]
    assert isinstance(trigger, ScheduleTrigger)
    now = engine.clock.now_ms()
    ticks = due_ticks(trigger, now - (n + 1) * 60_000, now)[-n:]
    await sched.tick()  # first sight: the schedule starts now, nothing is due
    out = []
    for tick in reversed(ticks):  # each pass finds one earlier tick not yet decided
        await sched._set(plan.name, "tick", cursor=tick - 1)
        began = time.perf_counter()
        out.append(await jobs.after(began, sched.tick))
    return out


async def _webhook(engine: Engine, jobs: _Jobs, n: int, tmp: Path) -> list[float]:
    control = ControlStore(tmp / "control.db")
    app = create_app(engine, control, limits=ApiLimits(rate_per_s=10_000, burst=10_000))
    sources = TriggerSources({"bench": SourceConfig("bench", {"k1": SECRET})})
    app.state.triggers = TriggerIntake(engine, sources)
    server = _Server(uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off",
                                    log_level="warning", access_log=False))  # fmt: skip
    serve = asyncio.get_running_loop().create_task(server.serve())
    out = []
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            for i in range(n):
                body = json.dumps({"modelId": f"hook-{i}"}).encode()
                headers = sign_headers("k1", SECRET, f"msg_{uuid.uuid4().hex}", body)

                async def post(b: bytes = body, h: dict[str, str] = headers) -> None:
                    got = await client.post("/v1/triggers/bench-triggers/hook", content=b,
                                            headers=h)  # fmt: skip
                    assert got.status_code == 202, got.text

                out.append(await jobs.after(time.perf_counter(), post))
    finally:
        server.should_exit = True
        await serve
        control.close()
    return out


async def _message(engine: Engine, jobs: _Jobs, n: int) -> list[float]:
    intake = TriggerIntake(engine, TriggerSources())
    consumer = MessageTriggers(intake, engine.transport, "bench-triggers", "queued", EVENTS)
    consumer.start()
    out = []
    try:
        for i in range(n):
            body = json.dumps({"modelId": f"msg-{i}"}).encode()

            async def publish(b: bytes = body, mid: str = f"ev-{i}") -> None:
                await engine.transport.publish(EVENTS, mid, b)

            out.append(await jobs.after(time.perf_counter(), publish))
    finally:
        await consumer.stop()
    return out


async def _run(smoke: bool) -> dict[str, Any]:
    n = 5 if smoke else 50
    catalog = load_catalog(ROOT / "schemas" / "contracts")
    plan = compile_workflow(DEFINITION, "bench-triggers.yaml", catalog).unwrap()
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        url = f"sqlite:///{tmp / 'bench.db'}"
        engine = open_engine(url, url, options=EngineOptions(poll_ms=5), catalog=catalog)
        await engine.register_plan(plan)
        await engine.announce("bench-worker", ["metadata.extract@2"], 3_600_000)
        await engine.start()
        jobs = _Jobs(engine)
        try:
            return {
                "schedule": _figures(await _schedule(engine, plan, jobs, n)),
                "webhook": _figures(await _webhook(engine, jobs, n, tmp)),
                "message": _figures(await _message(engine, jobs, n)),
            }
        finally:
            await jobs.stop()
            await engine.stop()


def run(smoke: bool = False) -> dict[str, Any]:
    return asyncio.run(_run(smoke))


if __name__ == "__main__":
    print(json.dumps(run(smoke="--smoke" in sys.argv), indent=2))
