"""Running engines settle canaries on their own: two real ``accord engine run`` processes on one
SQLite store abort a canary whose seeded failure rate breaks its criteria and promote a healthy
one once its window of ended runs is reached; each decision is made exactly once (one claim, one
activation), names the engine that made it and says why. A decision by hand that comes second is
refused with ``canary-decided``."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from tests.services import ensure_redis, redis_url

from accord.adapters import open_engine
from accord.engine.runtime import canary
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.errors import StageFailed
from accord.testing.plans import pin
from accord.testing.workers import run_noop_worker
from accord.workflow.canary import CanaryError, Criteria, Split, parse_share
from accord.workflow.plan import Plan, TaskStage

ROOT = Path(__file__).resolve().parents[2]
ACCORD = str(Path(sys.executable).with_name("accord"))
OWNERS = ("canary-a", "canary-b")
RUNS = 60  # per workflow; half go to the canary
WINDOW = 10  # ended canary runs before a verdict


def _plan(workflow: str, version: int) -> Plan:
    stage = TaskStage(
        name="check",
        type="worker",
        capability=pin("test.check", version),
        input={},
        on_success="completed",
        on_failure="failed",
        queue=f"{workflow}-v{version}",
    )
    return Plan.create(name=workflow, version=f"{version}.0.0", entry="check", stages=(stage,))


def _seeded_failure(run_id: str) -> bool:
    return int(hashlib.sha256(f"seed-3:{run_id}".encode()).hexdigest(), 16) % 2 == 0


async def _fails_half(envelope: Mapping[str, Any]) -> dict[str, Any]:
    if _seeded_failure(str(envelope["runId"])):
        raise StageFailed("seeded failure", failure_code="seeded")
    return {}


def _engines(url: str, tmp: Path) -> list[subprocess.Popen[bytes]]:
    common = ["--store", url, "--transport", url, "--no-platform", "--poll-ms", "20"]
    common += ["--canary-every-ms", "50", "--history-retention", "off"]
    common += ["--state", str(tmp / "state")]
    env = {**os.environ, "NO_COLOR": "1", "ACCORD_LOG_LEVEL": "INFO"}
    procs = []
    for owner in OWNERS:
        with (tmp / f"{owner}.log").open("wb") as log:
            argv = [ACCORD, "engine", "run", *common, "--owner", owner]
            procs.append(subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=log, env=env))
    return procs


async def _running(procs: list[subprocess.Popen[bytes]], tmp: Path, timeout_s: float = 30) -> None:
    """Both engines are up (their start line is logged), so both contend for each decision."""
    deadline = time.monotonic() + timeout_s
    for proc, owner in zip(procs, OWNERS, strict=True):
        while f"engine {owner} running" not in (tmp / f"{owner}.log").read_text():
            assert proc.poll() is None, (tmp / f"{owner}.log").read_text()
            assert time.monotonic() < deadline, f"{owner} did not start within {timeout_s}s"
            await asyncio.sleep(0.05)


def _stop(procs: list[subprocess.Popen[bytes]], tmp: Path) -> list[str]:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    logs = []
    for proc, owner in zip(procs, OWNERS, strict=True):
        proc.wait(timeout=30)
        logs.append((tmp / f"{owner}.log").read_text())
        assert proc.returncode == 0, logs[-1]
    return logs


@contextlib.asynccontextmanager
async def _workers(engine: Engine) -> AsyncIterator[None]:
    stop = asyncio.Event()
    spawn = asyncio.get_running_loop().create_task
    fine = ["checked-bad-v1", "checked-good-v1", "checked-good-v2"]
    tasks = [
        spawn(run_noop_worker(engine.transport, fine, stop=stop, worker_id="fine")),
        spawn(
            run_noop_worker(
                engine.transport,
                ["checked-bad-v2"],
                handler=_fails_half,
                stop=stop,
                worker_id="bad",
            )
        ),
    ]
    try:
        yield
    finally:
        stop.set()
        await asyncio.gather(*tasks)


async def _decided(engine: Engine, workflow: str, timeout_s: float = 60) -> Split:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        split = await canary.current(engine.store, workflow)
        assert split is not None
        if split.state != "running":
            return split
        await asyncio.sleep(0.05)
    raise AssertionError(f"{workflow}: no engine decided its canary within {timeout_s}s")


@pytest.mark.timeout(120)
async def test_engines_abort_a_failing_canary_and_promote_a_healthy_one_exactly_once(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'canary.db'}"
    # this process only starts runs and serves the jobs: the engine processes do the rest
    engine = open_engine(url, url, options=EngineOptions(canary_every_ms=0))
    for workflow in ("checked-bad", "checked-good"):
        await engine.register_plan(_plan(workflow, 1))
        await canary.begin(
            engine.store,
            _plan(workflow, 2),
            parse_share("50%"),
            criteria=Criteria(
                max_increase=0.05 if workflow == "checked-bad" else 0.0, min_runs=WINDOW
            ),
            by="key:author",
            reason="try v2",
            now_ms=1,
        )
    procs = _engines(url, tmp_path)
    try:
        await _running(procs, tmp_path)
        async with _workers(engine):
            for n in range(RUNS):
                for workflow in ("checked-bad", "checked-good"):
                    await engine.start_run(workflow, {}, run_id=f"{workflow}-{n:03d}")
            await engine.dispatcher.flush()
            bad = await _decided(engine, "checked-bad")
            good = await _decided(engine, "checked-good")
    finally:
        logs = _stop(procs, tmp_path)
    try:
        assert bad.state == "aborted", bad
        assert bad.decided_by in OWNERS and "above by more than 5.0%" in bad.decision, bad
        assert good.state == "promoted", good
        assert good.decided_by in OWNERS and "within 0.0%" in good.decision, good
        ended = int(good.decision.split(" over ")[1].split(" runs")[0])
        assert ended >= WINDOW, good.decision  # not before its window of ended runs
        store: Any = engine.store
        assert await store.get_active("checked-bad") == _plan("checked-bad", 1).digest
        assert await store.get_active("checked-good") == _plan("checked-good", 2).digest
        # exactly once: the split's record moved once (begin, decision) and so did the version
        for workflow in ("checked-bad", "checked-good"):
            trail = await store.plan_versions(canary.PREFIX + workflow)
            assert len(trail) == 2, (workflow, trail)
        assert len(await store.plan_versions("checked-bad")) == 1  # v1 stayed active
        assert len(await store.plan_versions("checked-good")) == 2  # v1, then v2 once
        # the deciding engine logged who and why; neither engine's pass failed
        said = [line for log in logs for line in log.splitlines() if "canary of checked-" in line]
        assert len(said) == 2, said
        assert not any("canary pass failed" in log for log in logs), logs
        # a decision by hand after the engines' is refused and names the decider
        with pytest.raises(CanaryError) as refused:
            await canary.abort(engine.store, "checked-good", by="key:author", why="late", now_ms=9)
        assert refused.value.code == "canary-none"
        later = await engine.start_run("checked-good", {}, run_id="after-promotion")
        stored = await engine.store.load(later)
        assert stored is not None and stored.state["plan_digest"] == good.canary
    finally:
        await engine.stop()


@pytest.mark.parametrize("stack", ["sqlite", "redis"])
async def test_a_second_decision_of_one_split_is_refused_and_a_stranded_claim_is_finished(
    stack: str, tmp_path: Path
) -> None:
    """The compare-and-set itself, on SQLite and on Redis: the claim decides; a decider that
    stopped between the claim and the switch is finished by the next settle, from its claim."""
    if stack == "redis":
        ensure_redis()
        url = redis_url(f"cc{uuid.uuid4().hex[:10]}")
    else:
        url = f"sqlite:///{tmp_path / 'cas.db'}"
    engine = open_engine(url, "memory://", options=EngineOptions(canary_every_ms=0))
    try:
        await engine.register_plan(_plan("checked", 1))
        split = await canary.begin(
            engine.store, _plan("checked", 2), 5000, by="key:author", now_ms=1
        )
        # the claim of engine-x is recorded, but it stopped before switching the version
        claim = split.decided("promoted", "engine-x", "criteria held", 5)
        key = canary._key(split).removeprefix("canary:")
        await engine.store.put_plan(canary.CLAIM + key, claim.to_json())
        with pytest.raises(CanaryError) as refused:
            await canary.abort(engine.store, "checked", by="key:author", why="by hand", now_ms=6)
        assert refused.value.code == "canary-decided"
        assert "promoted by engine-x: criteria held" in str(refused.value)
        now = await canary.current(engine.store, "checked")
        assert now == claim  # finished from the claim: promoted, by engine-x
        assert await engine.store.get_active("checked") == split.canary
        done, found = await canary.settle(engine.store, "checked", by="engine-y", now_ms=7)
        assert done == claim and found.decision == "wait"  # already decided: nothing more
    finally:
        await engine.stop()
