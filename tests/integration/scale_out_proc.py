"""The scale-out soak's child programs: ``python scale_out_proc.py engine|worker ARGS``.

``engine STORE TRANSPORT PLAN_JSON OWNER COUNT RUN_PREFIX GO_FILE`` — an engine process
(``accord.adapters.open_engine`` with the no-op platform actions), which registers the compiled
plan, starts, prints ``ready``, waits for ``GO_FILE`` to exist, starts ``COUNT`` runs with ids
``run_<RUN_PREFIX><n>`` and then serves until SIGTERM, when it stops gracefully and prints its
counters as one JSON line.

``worker TRANSPORT MARKS_REDIS MARKS_PREFIX SEED STATE_DIR SLOTS`` — a worker process: the Worker
SDK runtime serving the no-op worker over a :class:`FaultyTransport`. Its acceptance records live
in a file of its own incarnation: a killed worker's records die with it, as on a replaced machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from scale_out_support import FaultyTransport, noop_actions, noop_worker

from accord.adapters import open_engine, open_transport
from accord.engine.runtime.orchestrator import EngineOptions
from accord.loop import run as run_loop
from accord.worker.acceptance import AcceptanceLog
from accord.worker.runtime import Runtime
from accord.workflow.plan import Plan


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def engine_main(  # noqa: PLR0917 - one positional per command-line argument
    store: str, transport: str, plan_path: str, owner: str, count: str, prefix: str, go: str
) -> None:

    stop = _stop_on_signals()
    plan = Plan.from_json(json.loads(Path(plan_path).read_text()))
    engine = open_engine(
        store, transport, options=EngineOptions(owner=owner, poll_ms=20), actions=noop_actions()
    )
    await engine.register_plan(plan)
    await engine.start()
    print("ready", flush=True)
    while not Path(go).exists() and not stop.is_set():
        await asyncio.sleep(0.01)
    run_ids = [f"run_{prefix}{n:05d}" for n in range(int(count))]
    for n in range(0, len(run_ids), 25):  # a few at a time: intake keeps flowing meanwhile
        batch = run_ids[n : n + 25]
        await asyncio.gather(
            *(engine.start_run(plan.name, {"modelId": f"m-{r}"}, run_id=r) for r in batch)
        )
    await stop.wait()
    await engine.stop()
    stats = {"transitions": engine.transitions, "conflicts": engine.conflicts}
    print(json.dumps(stats), flush=True)


async def worker_main(  # noqa: PLR0917
    transport: str, marks_redis: str, marks: str, seed: str, state: str, slots: str
) -> None:
    stop = _stop_on_signals()
    port = FaultyTransport(open_transport(transport), marks_redis, marks, int(seed))
    log = AcceptanceLog(Path(state) / f"soak-{os.getpid()}.acceptance.db")
    runtime = Runtime(noop_worker(), port, acceptance=log, slots=int(slots))
    print("ready", flush=True)
    try:
        await runtime.run(stop)
    finally:
        await port.close()
        log.close()
    print(json.dumps(runtime.stats), flush=True)


if __name__ == "__main__":
    role, args = sys.argv[1], sys.argv[2:]
    # the loop `accord engine run` and `accord worker run` pick (uvloop where installed)
    run_loop(engine_main(*args) if role == "engine" else worker_main(*args))
