"""`accord engine run` as a real process: it picks up runs started elsewhere (their outbox
entries), serves outcomes from a worker, survives a `kill -9` mid-flight, and stops gracefully on
SIGTERM with exit code 0."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accord.adapters import open_store, open_transport
from accord.adapters.clock import SystemClock
from accord.engine.machine.replay import replay
from accord.engine.machine.state import HistoryEntry, RunState
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.testing.plans import QUEUES, model_ingest_shape
from accord.testing.workers import run_noop_worker

PLAN = model_ingest_shape(name="cli-process")
pytestmark = pytest.mark.slow


def _engine_process(url: str, log: Path) -> subprocess.Popen[bytes]:
    args = ["engine", "run", "--store", url, "--transport", url]
    args += ["--poll-ms", "20", "--lease-ms", "1000", "--grace-ms", "200"]
    args += ["--no-platform"]  # a hand-built plan: its results are not governed by schemas/
    code = "import sys; from accord.cli import main; sys.argv[0] = 'accord'; main()"
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdout=out,
            stderr=out,
            env={k: v for k, v in os.environ.items() if k != "ACCORD_CRASH_AT"}
            | {"PYTHONUNBUFFERED": "1"},
        )


async def test_engine_run_command_serves_runs_and_stops_gracefully(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}?visibility_ms=1000"
    log = tmp_path / "engine.log"
    clock = SystemClock()
    setup = Engine(
        open_store(url, clock=clock),
        open_transport(url, clock=clock),
        clock,
        options=EngineOptions(dispatch=False),
        owns_ports=True,
    )
    await setup.register_plan(PLAN)
    runs = [await setup.start_run(PLAN.name, {"modelId": f"m{i}"}) for i in range(5)]
    await setup.stop()

    transport = open_transport(url)
    stop = asyncio.Event()
    worker = asyncio.get_running_loop().create_task(run_noop_worker(transport, QUEUES, stop=stop))
    proc = _engine_process(url, log)
    store = open_store(url)
    try:
        await asyncio.sleep(1.0)
        proc.send_signal(signal.SIGKILL)  # mid-flight, no cleanup
        proc.wait(10)
        second_from = len(log.read_text())  # what the second engine writes starts here
        proc = _engine_process(url, log)
        deadline = time.monotonic() + 30
        pending = set(runs)
        while pending and time.monotonic() < deadline:
            for rid in list(pending):
                stored = await store.load(rid)
                if stored and RunState.from_json(stored.state).terminal:
                    pending.discard(rid)
            await asyncio.sleep(0.1)
        assert not pending, log.read_text()
        # the first engine may have finished every run: wait until the second one is serving
        serving = time.monotonic() + 30
        while "running on" not in log.read_text()[second_from:] and time.monotonic() < serving:
            await asyncio.sleep(0.05)
        assert "running on" in log.read_text()[second_from:], log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0, log.read_text()
        assert "stopped after" in log.read_text()
        for rid in runs:
            stored = await store.load(rid)
            assert stored is not None and stored.state["status"] == "completed"
            history = [HistoryEntry.from_json(h) for h in await store.history(rid)]
            assert replay(PLAN, history) == RunState.from_json(stored.state)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stop.set()
        await worker
        await transport.close()
        await store.close()
