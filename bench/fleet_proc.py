"""The processes of :mod:`bench.bench_fleet`'s fleet: ``python -m bench.fleet_proc worker|engine``.

``worker TRANSPORT_URL OUT WORKER_ID SLOTS`` serves the benchmark plan's capabilities with no-op
handlers on the Worker SDK runtime, as ``accord worker run`` does (:class:`~accord.worker.Runtime`,
its acceptance record in a SQLite file beside ``OUT``); it prints ``ready`` once it consumes and
``warm`` when it receives its first job. Each job's receipt ("start") and answer ("end") are
stamped with :func:`time.perf_counter` (``CLOCK_MONOTONIC``: one clock for every process on the
machine), kept in memory and written to ``OUT`` as JSON when SIGTERM stops the worker. On
SIGUSR1 it prints ``stats OUTCOMES MESSAGES``: the outcomes it has sent and the broker messages
that carried them (:class:`~accord.worker.batching.OutcomeBatcher`).

``engine STORE_URL TRANSPORT_URL OUT`` runs one more engine process (the plan is already in the
store); it prints ``ready OWNER`` once started (``OWNER``: its id in the store's shard leases),
``done RUN_ID T`` for every run whose terminal transition it committed (``T`` on the same
clock), and ``stats TRANSITIONS CONFLICTS OWNERSHIP_LOST SHARDS_GAINED`` on SIGUSR1 (commits
that lost a compare-and-set, fenced commits refused because the shard had changed hands, shards
taken). SIGTERM stops it, and its totals go to ``OUT``. Either stops by itself when the
benchmark process goes away.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from accord.adapters import open_engine, open_transport
from accord.adapters.clock import SystemClock
from accord.cli._redaction import sealing_from_env
from accord.engine.runtime.orchestrator import Delivered, Engine, EngineOptions
from accord.loop import run as run_loop
from accord.testing.plans import QUEUES
from accord.worker import AcceptanceLog, Context, Runtime, Worker
from accord.worker.wire import Job

_watchers: set[asyncio.Task[None]] = set()


def _stop_on(stop: asyncio.Event) -> None:
    """SIGTERM sets ``stop``, and so does losing the benchmark process (no orphans left behind)."""
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    parent = os.getppid()

    async def watch() -> None:
        while not stop.is_set():
            if os.getppid() != parent:
                stop.set()
            await asyncio.sleep(1)

    task = loop.create_task(watch())
    _watchers.add(task)  # held until done: the loop keeps only a weak reference
    task.add_done_callback(_watchers.discard)


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _noop(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    ref = payload.get("storageConnectionRef")  # the sealing benchmark's secret, handed back
    return {} if ref is None else {"ref": ref}


def noop_worker() -> Worker:
    """No-op handlers for the benchmark plan's capabilities (``test.<queue>@1``)."""
    worker = Worker("bench")
    for queue in QUEUES:
        worker.bind(f"test.{queue}@1", _noop, queue=queue)
    return worker


async def worker(transport_url: str, out: Path, worker_id: str, slots: int) -> None:
    transport = open_transport(transport_url, clock=SystemClock())
    stamps: dict[str, dict[str, float]] = {"start": {}, "end": {}}
    served = 0

    def observe(what: str, job: Job) -> None:
        nonlocal served
        stamps[what].setdefault(f"{job.run_id} {job.stage}", time.perf_counter())
        if what == "start":
            served += 1
            if served == 1:
                _say("warm")

    stop = asyncio.Event()
    _stop_on(stop)
    log = AcceptanceLog(out.parent / f"{worker_id}.acceptance.db")
    runtime = Runtime(
        noop_worker(), transport, acceptance=log, slots=slots, worker_id=worker_id,
        observe=observe, sealing=sealing_from_env(),
    )  # fmt: skip
    answers = runtime.outcomes
    asyncio.get_running_loop().add_signal_handler(
        signal.SIGUSR1, lambda: _say(f"stats {answers.outcomes} {answers.messages}")
    )
    serving = asyncio.get_running_loop().create_task(runtime.run(stop))
    await asyncio.sleep(0.05)  # the consumers subscribe
    gc.collect()
    gc.freeze()
    _say("ready")
    await serving
    declared = sorted(getattr(transport, "declared", ()))
    await transport.close()
    log.close()
    out.write_text(json.dumps({**stamps, "served": served, "declared": declared}))


def engine_stats(accord: Engine) -> str:
    """The ``stats`` line of an engine process: its counters in :data:`ENGINE_COUNTERS` order."""
    counts = (accord.transitions, accord.conflicts, accord.ownership_lost, accord.shards.gained)
    return "stats " + " ".join(str(c) for c in counts)


ENGINE_COUNTERS = ("transitions", "conflicts", "ownership_lost", "shards_gained")


async def engine(store_url: str, transport_url: str, out: Path) -> None:
    reported: set[str] = set()

    def report(done: Delivered) -> None:
        if done.run is not None and done.run.terminal and done.run_id not in reported:
            reported.add(done.run_id)
            _say(f"done {done.run_id} {time.perf_counter()!r}")

    accord = open_engine(store_url, transport_url, SystemClock(), options=EngineOptions(poll_ms=20))
    accord.observers.append(report)
    stop = asyncio.Event()
    _stop_on(stop)
    asyncio.get_running_loop().add_signal_handler(
        signal.SIGUSR1, lambda: _say(engine_stats(accord))
    )
    await accord.start()
    gc.collect()
    gc.freeze()
    _say(f"ready {accord.owner}")
    try:
        await stop.wait()
    finally:
        declared = sorted(getattr(accord.transport, "declared", ()))
        await accord.stop()
    counts = (accord.transitions, accord.conflicts, accord.ownership_lost, accord.shards.gained)
    totals = dict(zip(ENGINE_COUNTERS, counts, strict=True))
    out.write_text(json.dumps({**totals, "declared": declared}))


def main(argv: list[str]) -> None:
    role, *args = argv
    if role == "worker":
        url, out, worker_id, slots = args
        run_loop(worker(url, Path(out), worker_id, int(slots)))
    elif role == "engine":
        store_url, transport_url, out = args
        run_loop(engine(store_url, transport_url, Path(out)))
    else:
        raise SystemExit(f"unknown role {role!r}: worker or engine")


if __name__ == "__main__":
    main(sys.argv[1:])
