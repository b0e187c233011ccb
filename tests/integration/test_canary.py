"""Canary activation on SQLite with the embedded queue: a 10% canary receives 10% ± 3 of 1,000
starts, every run records which version admitted it and why, and a canary with a seeded failure
rate is aborted by its promotion criteria (a healthy one is promoted); the command line drives a
canary of the real model-ingest workflow."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from engine_shell_support import wait_terminal

from accord.adapters import open_engine
from accord.engine.runtime import canary
from accord.engine.runtime.actions import ActionContext
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.errors import StageFailed
from accord.workflow.canary import Criteria, bucket, parse_share
from accord.workflow.plan import CapabilityPin, Plan, TaskStage

ROOT = Path(__file__).resolve().parents[2]
ACCORD = str(Path(sys.executable).with_name("accord"))
STARTS = 1_000
FAILING = 40  # percent of the canary's runs its handler fails (seeded by run id)


def _pin(version: int) -> CapabilityPin:
    fake = "sha256:" + "ab" * 32
    return CapabilityPin(
        "action",
        "test.check",
        version,
        f"test.check-request@{version}",
        "test.check-result@1",
        fake,
        fake,
    )


def _plan(version: int) -> Plan:
    stage = TaskStage(
        name="check",
        type="action",
        capability=_pin(version),
        input={},
        on_success="completed",
        on_failure="failed",
    )
    return Plan.create(name="checked", version=f"{version}.0.0", entry="check", stages=(stage,))


def _seeded_failure(run_id: str) -> bool:
    return int(hashlib.sha256(f"seed-7:{run_id}".encode()).hexdigest(), 16) % 100 < FAILING


async def passes(payload: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
    return {"ok": True}


async def fails_sometimes(payload: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
    if _seeded_failure(ctx.run_id):
        raise StageFailed("seeded failure", failure_code="seeded")
    return {"ok": True}


def _engine(url: str, canary_handler: Any) -> Engine:
    actions = {"test.check@1": passes, "test.check@2": canary_handler}
    return open_engine(url, url, options=EngineOptions(poll_ms=10), actions=actions)


async def _start_all(engine: Engine, n: int) -> list[str]:
    return [await engine.start_run("checked", {}, run_id=f"run-{i:04d}") for i in range(n)]


async def _by_digest(engine: Engine, rids: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for rid in rids:
        stored = await engine.store.load(rid)
        assert stored is not None
        out.setdefault(stored.state["plan_digest"], []).append(rid)
    return out


async def test_a_ten_percent_canary_gets_ten_percent_and_aborts_on_its_failure_rate(
    tmp_path: Path,
) -> None:
    stable, new = _plan(1), _plan(2)
    engine = _engine(f"sqlite:///{tmp_path / 'canary.db'}", fails_sometimes)
    await engine.register_plan(stable)
    await engine.start()
    try:
        split = await canary.begin(
            engine.store,
            new,
            parse_share("10%"),
            criteria=Criteria(max_increase=0.05, min_runs=50),
            by="key:author",
            reason="check v2",
            now_ms=1,
        )
        assert split.stable == stable.digest and split.canary == new.digest
        rids = await _start_all(engine, STARTS)
        sides = await _by_digest(engine, rids)
        share = len(sides.get(new.digest, []))
        assert 70 <= share <= 130, share  # 10% ± 3 of 1,000
        assert share + len(sides[stable.digest]) == STARTS
        for rid in rids[:50]:  # each run records the version that admitted it and why
            started = (await engine.store.history(rid))[0]["event"]
            admission = started["admission"]
            assert admission["digest"] == started["plan_digest"]
            assert admission["reason"] == ("canary" if bucket(rid) < 1000 else "stable")
            assert admission["share"] == "10%"
        await wait_terminal(engine.store, rids, timeout_s=90)
        await engine.executor.wait_idle()

        split, old_out, new_out, verdict = await canary.status(engine.store, "checked")
        assert old_out.ended == STARTS - share and old_out.failed == 0
        expected = sum(1 for rid in sides[new.digest] if _seeded_failure(rid))
        assert new_out.ended == share and new_out.failed == expected
        assert verdict.decision == "abort", verdict
        split, _ = await canary.settle(engine.store, "checked", by="engine", now_ms=2)
        assert split.state == "aborted" and "above by more than 5.0%" in split.decision
        assert await engine.store.get_active("checked") == stable.digest
        later = await engine.start_run("checked", {}, run_id="after-abort")
        stored = await engine.store.load(later)
        assert stored is not None and stored.state["plan_digest"] == stable.digest
        started = (await engine.store.history(later))[0]["event"]
        assert started["admission"] == {"digest": stable.digest, "reason": "active"}
    finally:
        await engine.stop()


async def test_a_healthy_canary_is_promoted_and_then_takes_every_run(tmp_path: Path) -> None:
    stable, new = _plan(1), _plan(2)
    engine = _engine(f"sqlite:///{tmp_path / 'canary.db'}", passes)
    await engine.register_plan(stable)
    await engine.start()
    try:
        await canary.begin(
            engine.store,
            new,
            parse_share("25%"),
            criteria=Criteria(max_increase=0.0, min_runs=20),
            by="key:author",
            now_ms=1,
        )
        rids = await _start_all(engine, 40)  # too few canary runs ended yet: wait
        first = rids[:2]
        await wait_terminal(engine.store, first)
        _, _, _, verdict = await canary.status(engine.store, "checked")
        assert verdict.decision == "wait"
        rids += [await engine.start_run("checked", {}, run_id=f"more-{i}") for i in range(100)]
        await wait_terminal(engine.store, rids, timeout_s=60)
        await engine.executor.wait_idle()
        split, verdict = await canary.settle(engine.store, "checked", by="engine", now_ms=2)
        assert verdict.decision == "promote" and split.state == "promoted"
        assert await engine.store.get_active("checked") == new.digest
        rid = await engine.start_run("checked", {}, run_id="after-promote")
        stored = await engine.store.load(rid)
        assert stored is not None and stored.state["plan_digest"] == new.digest
    finally:
        await engine.stop()


async def _cli(*args: str) -> tuple[int, Any]:
    proc = await asyncio.create_subprocess_exec(
        ACCORD,
        *args,
        "--json",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "USER": "author"},
    )
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, json.loads(out)


async def test_the_command_line_runs_a_canary_of_model_ingest(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    source = ROOT / "workflows" / "model-ingest.yaml"
    code, doc = await _cli("workflow", "activate", str(source), "--store", store)
    assert code == 0, doc
    stable = doc["digest"]
    newer = tmp_path / "mi.yaml"
    newer.write_text(source.read_text().replace('"2.3.0"', '"2.4.0"'), encoding="utf-8")
    code, doc = await _cli(
        "workflow", "activate", str(newer), "--canary", "10%", "--store", store, "--min-runs", "5"
    )
    assert code == 0 and doc["canary"]["share"] == "10%", doc
    assert doc["canary"]["stable"] == stable and doc["canary"]["state"] == "running"
    code, again = await _cli(
        "workflow", "activate", str(newer), "--canary", "10%", "--store", store
    )
    assert code == 1 and "canary-running" in again["error"]
    code, status = await _cli("workflow", "canary", "model-ingest", "--store", store)
    assert code == 0 and status["verdict"]["decision"] == "wait"
    code, auto = await _cli("workflow", "promote", "model-ingest", "--auto", "--store", store)
    assert code == 0 and auto["decision"] == "wait"
    code, done = await _cli(
        "workflow", "abort", "model-ingest", "--store", store, "--reason", "not yet"
    )
    assert code == 0 and done["canary"]["state"] == "aborted"
    assert done["canary"]["decision"] == "not yet" and done["canary"]["decided_by"] == "cli:author"
    code, doc = await _cli("workflow", "abort", "model-ingest", "--store", store)
    assert code == 1 and "no running canary" in doc["error"]
    code, doc = await _cli("workflow", "activate", str(newer), "--canary", "150%", "--store", store)
    assert code == 2 and "below 100%" in doc["error"]
