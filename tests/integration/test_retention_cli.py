"""History retention at the command line, through the real ``accord`` binary: ``accord runs prune
--older-than`` and ``accord engine run --history-retention`` remove ended runs that saw no change
for that long, history and all, and keep live runs and recent ones; bad durations are a one-line
usage error (exit 2)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.services import ensure_redis, redis_url

from accord.adapters import open_store, open_transport
from accord.engine.machine.events import StageAccepted, StageSucceeded
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.testing.clock import FakeClock
from accord.testing.plans import model_ingest_shape

ACCORD = Path(sys.executable).parent / "accord"
PLAN = model_ingest_shape(name="retention-shape")
DAY = 86_400_000


def accord(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ACCORD), *args], capture_output=True, text=True, check=False, cwd=cwd, timeout=60
    )


async def _runs_at(url: str, at_ms: int) -> tuple[str, str]:
    """A completed run and a running one, both last changed at ``at_ms`` (the store's clock)."""
    clock = FakeClock(at_ms)
    store = open_store(url, clock=clock)
    engine = Engine(store, open_transport("memory://"), clock, EngineOptions(), owns_ports=True)
    try:
        await engine.register_plan(PLAN)
        done = await engine.start_run(PLAN.name, {"modelId": "m1"}, tenant="acme")
        for stage in ("render", "analyse", "metadata", "publish"):
            run = await engine.load(done)
            assert run is not None
            cur = run.stages[stage]
            ident: dict[str, Any] = {"run_id": done, "stage": stage, "attempt": cur.attempt}
            await engine.deliver(StageAccepted(**ident, fence=cur.fence))
            await engine.deliver(StageSucceeded(**ident, fence=cur.fence))
        live = await engine.start_run(PLAN.name, {"modelId": "m2"}, tenant="acme")
        return done, live
    finally:
        await engine.stop()


def seed(url: str) -> dict[str, str]:
    """Runs 40 days old and 1 day old, each one completed and one still running."""
    now = int(time.time() * 1000)
    old_done, old_live = asyncio.run(_runs_at(url, now - 40 * DAY))
    new_done, new_live = asyncio.run(_runs_at(url, now - DAY))
    return {"old_done": old_done, "old_live": old_live, "new_done": new_done, "new_live": new_live}


async def _present(url: str, run_ids: list[str]) -> dict[str, tuple[bool, int]]:
    """Whether each run is loaded, and how many history entries it has."""
    store = open_store(url)
    try:
        out = {}
        for run_id in run_ids:
            out[run_id] = (await store.load(run_id) is not None, len(await store.history(run_id)))
        return out
    finally:
        await store.close()


def present(url: str, runs: dict[str, str]) -> dict[str, bool]:
    seen = asyncio.run(_present(url, list(runs.values())))
    for run_id, (loaded, entries) in seen.items():
        assert loaded == (entries > 0), f"{run_id}: record and history disagree"
    return {name: seen[run_id][0] for name, run_id in runs.items()}


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "redis":
        ensure_redis()
        return redis_url()
    return f"sqlite:///{tmp_path / 'accord.db'}"


def test_runs_prune_removes_old_ended_runs_only(store_url: str, tmp_path: Path) -> None:
    runs = seed(store_url)
    done = accord("runs", "prune", "--older-than", "30d", "--store", store_url, "--json",
                  cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True and report["removed"] == 1
    assert present(store_url, runs) == {
        "old_done": False, "old_live": True, "new_done": True, "new_live": True,
    }  # fmt: skip

    listed = accord("runs", "list", "--store", store_url, "--json", cwd=tmp_path)
    assert runs["old_done"] not in {r["run_id"] for r in json.loads(listed.stdout)}
    gone = accord("runs", "show", runs["old_done"], "--store", store_url, cwd=tmp_path)
    assert gone.returncode == 1 and "not found" in gone.stderr

    again = accord("runs", "prune", "--older-than", "30d", "--store", store_url, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("removed 0 ended runs")

    shorter = accord("runs", "prune", "--older-than", "12h", "--store", store_url, cwd=tmp_path)
    assert shorter.returncode == 0 and shorter.stdout.startswith("removed 1 ended runs")
    assert present(store_url, runs) == {
        "old_done": False, "old_live": True, "new_done": False, "new_live": True,
    }  # fmt: skip


@pytest.mark.parametrize("bad", ["30", "thirty days", "30x", "-5d", "1.5h", ""])
def test_a_bad_duration_is_a_one_line_usage_error(bad: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'accord.db'}"
    plain = accord("runs", "prune", "--older-than", bad, "--store", url, cwd=tmp_path)
    assert plain.returncode == 2, plain.stderr
    assert "Traceback" not in plain.stderr
    (line,) = plain.stderr.strip().splitlines()
    assert line.startswith("error: --older-than: duration") and "30d" in line
    as_json = accord("runs", "prune", "--older-than", bad, "--store", url, "--json", cwd=tmp_path)
    assert as_json.returncode == 2
    doc = json.loads(as_json.stdout)
    assert doc["ok"] is False and doc["exit"] == 2 and "--older-than" in doc["error"]

    engine = accord("engine", "run", "--store", url, "--transport", url,
                    "--history-retention", bad, cwd=tmp_path)  # fmt: skip
    assert engine.returncode == 2 and "Traceback" not in engine.stderr
    (line,) = engine.stderr.strip().splitlines()
    assert line.startswith("error: --history-retention: duration")
    assert not (tmp_path / "accord.db").exists()  # refused before anything was opened


def _engine_until(url: str, cwd: Path, retention: str, runs: dict[str, str], gone: str) -> None:
    """Run ``accord engine run`` until run ``gone`` was pruned (or 20 s), then stop it."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [str(ACCORD), "engine", "run", "--store", url, "--transport", "memory://",
         "--no-platform", "--history-retention", retention],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while present(url, runs)[gone] and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def test_engine_run_prunes_with_its_retention(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'accord.db'}"
    runs = seed(url)
    _engine_until(url, tmp_path, "30d", runs, "old_done")
    assert present(url, runs) == {
        "old_done": False, "old_live": True, "new_done": True, "new_live": True,
    }  # fmt: skip


def test_engine_run_with_retention_off_keeps_every_run(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'accord.db'}"
    runs = seed(url)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [str(ACCORD), "engine", "run", "--store", url, "--transport", "memory://",
         "--no-platform", "--history-retention", "off"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        assert proc.stdout is not None
        while "running on" not in proc.stdout.readline() and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
        time.sleep(1.0)  # a retention pass, had there been one, runs as the engine starts
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert all(present(url, runs).values())


def test_an_unreachable_store_is_a_one_line_error_without_its_password(tmp_path: Path) -> None:
    url = "redis://user:pr1vate-pw@127.0.0.1:1/0"
    done = accord("runs", "prune", "--older-than", "30d", "--store", url, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: store 'redis://user:***@127.0.0.1:1/0'")
    assert "pr1vate-pw" not in done.stdout + done.stderr
