"""Crash tests with real processes on the embedded default (SQLite store + embedded queue).

Each scenario starts runs, lets an engine process and a worker process work on them, kills one
of them at a chosen point (the engine's dispatcher calls ``os._exit(137)`` at ``ACCORD_CRASH_AT``,
the same effect as ``kill -9``: no cleanup, no flush), restarts it, and then requires that every
run reached a terminal state exactly as its history explains: the history replays to the stored
record (I12), the per-run invariants hold, and the outbox and queues are empty (I1, I7).
"""

from __future__ import annotations

import asyncio
import os
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
from accord.testing.invariants import assert_i1_terminal, assert_run_invariants
from accord.testing.plans import QUEUES, model_ingest_shape

PROCS = Path(__file__).with_name("crash_procs.py")
PLAN = model_ingest_shape(name="crash-shape", lookup_action=True, finaliser=True)
RUNS = 8

pytestmark = pytest.mark.slow


def _spawn(role: str, url: str, **env: str) -> subprocess.Popen[bytes]:
    full = {k: v for k, v in os.environ.items() if k != "ACCORD_CRASH_AT"} | env
    db = Path(url.split("///", 1)[1].split("?", maxsplit=1)[0])
    log = db.with_suffix(f".{role}.{time.time_ns()}.log")
    with log.open("wb") as err:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [sys.executable, str(PROCS), role, url], env=full, stdout=err, stderr=err
        )
    proc.args = [str(log)]  # where to look when it misbehaves
    return proc


def _log(proc: subprocess.Popen[bytes]) -> str:
    return Path(str(proc.args[0])).read_text(errors="replace")[-4000:]  # type: ignore[index]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def _wait_exit(proc: subprocess.Popen[bytes], timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert proc.returncode is not None, f"no crash at the crash point:\n{_log(proc)}"
    return proc.returncode


async def _start_runs(url: str) -> list[str]:
    """Start runs without publishing anything: the engine process's sweep hands them off."""
    clock = SystemClock()
    setup = Engine(
        open_store(url, clock=clock),
        open_transport(url, clock=clock),
        clock,
        options=EngineOptions(dispatch=False),
        owns_ports=True,
    )
    try:
        await setup.register_plan(PLAN)
        return [await setup.start_run(PLAN.name, {"modelId": f"m{i}"}) for i in range(RUNS)]
    finally:
        await setup.stop()


async def _wait_all_terminal(url: str, runs: list[str], timeout_s: float = 30) -> None:
    store = open_store(url)
    try:
        deadline = time.monotonic() + timeout_s
        pending = set(runs)
        while pending and time.monotonic() < deadline:
            for rid in list(pending):
                stored = await store.load(rid)
                if stored and RunState.from_json(stored.state).terminal:
                    pending.discard(rid)
            await asyncio.sleep(0.1)
        assert not pending, f"I1: runs not terminal after restart: {sorted(pending)}"
    finally:
        await store.close()


async def _wait_drained(url: str, timeout_s: float = 30) -> None:
    """Entries leased by the killed engine come back when their lease lapses; the survivor's
    sweep then republishes them (I7 is eventual: published at least once, then marked done)."""
    store = open_store(url)
    try:
        deadline = time.monotonic() + timeout_s
        while await store.claim_outbox(100, "check", 0) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    finally:
        await store.close()


async def _check_explained(url: str, runs: list[str]) -> list[list[HistoryEntry]]:
    """Every run completed as its history explains; outbox and queues drained."""
    store, transport = open_store(url), open_transport(url)
    histories = []
    try:
        for rid in runs:
            stored = await store.load(rid)
            assert stored is not None
            run = RunState.from_json(stored.state)
            history = [HistoryEntry.from_json(h) for h in await store.history(rid)]
            assert_i1_terminal(run)
            assert run.status == "completed", f"run {rid}: {run.status} {run.error}"
            assert replay(PLAN, history) == run
            assert_run_invariants(PLAN, run, history)
            histories.append(history)
        assert await store.claim_outbox(100, "check", 0) == [], "I7: outbox not drained"
        for queue in QUEUES:
            assert await transport.dead_letters(queue) == []
    finally:
        await transport.close()
        await store.close()
    return histories


async def _engine_crash_scenario(tmp_path: Path, point: str) -> list[list[HistoryEntry]]:
    url = f"sqlite:///{tmp_path / 'crash.db'}?visibility_ms=1000"
    runs = await _start_runs(url)
    worker = _spawn("worker", url)
    first = _spawn("engine", url, ACCORD_CRASH_AT=point)
    try:
        assert await _wait_exit(first, 30) == 137
        again = _spawn("engine", url)
        try:
            await _wait_all_terminal(url, runs)
            await _wait_drained(url)
        finally:
            _stop(again)
        assert again.returncode == 0, _log(again)
    finally:
        _stop(first)
        _stop(worker)
    return await _check_explained(url, runs)


async def test_engine_killed_between_commit_and_publish(tmp_path: Path) -> None:
    await _engine_crash_scenario(tmp_path, "after-commit:6")


async def test_engine_killed_between_publish_and_outbox_done(tmp_path: Path) -> None:
    await _engine_crash_scenario(tmp_path, "after-publish:6")


async def test_worker_killed_after_acceptance(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'worker.db'}?visibility_ms=1000"
    runs = await _start_runs(url)
    engine = _spawn("engine", url)
    doomed = _spawn("worker", url, WORKER_CRASH_AFTER_ACCEPT="1", WORKER_ID="doomed")
    try:
        assert await _wait_exit(doomed, 30) == 137
        survivor = _spawn("worker", url)
        try:
            await _wait_all_terminal(url, runs)
        finally:
            _stop(survivor)
    finally:
        _stop(engine)
        _stop(doomed)
    histories = await _check_explained(url, runs)
    # the dead worker's acceptance is on record, and the same attempt was then completed by the
    # survivor from the redelivered job (its acceptance had the same message id: deduplicated)
    for hist in histories:
        taken = [
            (h.event["stage"], h.event["attempt"]) for h in hist
            if h.event["kind"] == "stage-accepted" and h.event["worker_id"] == "doomed"
        ]  # fmt: skip
        if taken:
            done = [
                (h.event["stage"], h.event["attempt"]) for h in hist
                if h.event["kind"] == "stage-succeeded" and h.accepted
            ]  # fmt: skip
            assert taken[0] in done
            break
    else:
        pytest.fail("no acceptance by the killed worker is on record")
