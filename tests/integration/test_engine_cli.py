"""`accord runs …` and `accord engine reconcile` against a real SQLite store."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from accord.adapters import open_engine, open_store, open_transport
from accord.adapters.clock import SystemClock
from accord.cli import app
from accord.engine.machine.events import StageAccepted, StageSucceeded
from accord.engine.runtime.orchestrator import Engine
from accord.testing.plans import model_ingest_shape

PLAN = model_ingest_shape(name="cli-shape")


def _seed(url: str) -> tuple[str, str]:
    """One completed run and one waiting on its first job."""

    async def go() -> tuple[str, str]:
        clock = SystemClock()
        engine = Engine(
            open_store(url, clock=clock), open_transport(url, clock=clock), clock, owns_ports=True
        )
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
            waiting = await engine.start_run(PLAN.name, {"modelId": "m2"}, tenant="acme")
            return done, waiting
        finally:
            await engine.stop()

    return asyncio.run(go())


def test_runs_commands_read_and_steer(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    done, waiting = _seed(url)
    cli = CliRunner()

    listed = cli.invoke(app, ["runs", "list", "--store", url, "--json"])
    assert listed.exit_code == 0, listed.output
    rows = {r["run_id"]: r for r in json.loads(listed.output)}
    assert rows[done]["status"] == "completed" and rows[waiting]["status"] == "running"
    only = cli.invoke(app, ["runs", "list", "--store", url, "--status", "completed", "--json"])
    assert [r["run_id"] for r in json.loads(only.output)] == [done]

    shown = cli.invoke(app, ["runs", "show", done, "--store", url, "--json"])
    assert json.loads(shown.output)["stages"]["publish"]["status"] == "completed"
    history = cli.invoke(app, ["runs", "history", done, "--store", url, "--json"])
    assert json.loads(history.output)[0]["event"]["kind"] == "run-started"
    explained = cli.invoke(app, ["runs", "explain", done, "--store", url])
    assert explained.exit_code == 0 and "now completed" in explained.output

    missing = cli.invoke(app, ["runs", "show", "run_nope", "--store", url])
    assert missing.exit_code == 1
    refused = cli.invoke(app, ["runs", "redrive", waiting, "render", "--store", url])
    assert refused.exit_code == 1  # render is queued, not failed: the machine refuses

    cancelled = cli.invoke(
        app, ["runs", "cancel", waiting, "--store", url, "--reason", "t", "--json"]
    )
    assert cancelled.exit_code == 0, cancelled.output
    assert json.loads(cancelled.output)["intent"] is not None
    late = cli.invoke(app, ["runs", "cancel", done, "--store", url])
    assert late.exit_code == 1

    report = cli.invoke(app, ["engine", "reconcile", "--store", url, "--transport", url, "--json"])
    assert report.exit_code == 0, report.output
    assert json.loads(report.output)["republished"] >= 1  # the cancel's outbox entries


def test_engine_run_hosts_the_platform_actions(tmp_path: Path) -> None:
    """`accord engine run` registers cache.lookup, catalogue.publish and audit by default, so a
    separately started engine can run the model-ingest workflow's action stages."""
    from accord.cli.engine import _with_platform

    async def go() -> list[str]:
        url = f"sqlite:///{tmp_path / 'p.db'}"
        engine = open_engine(url, url)
        try:
            await _with_platform(engine, tmp_path / "state", Path("schemas/contracts"), [])
            return engine.registry.capabilities()
        finally:
            await engine.stop()

    capabilities = asyncio.run(go())
    for needed in ("cache.lookup@1", "catalogue.publish@2", "audit.run-terminal@1"):
        assert needed in capabilities


def test_engine_run_refuses_an_unknown_workflow_to_watch(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'w.db'}"
    args = ["engine", "run", "--store", url, "--transport", url, "--workflow", "nope"]
    result = CliRunner().invoke(app, [*args, "--state", str(tmp_path / "state")])
    assert result.exit_code == 2, result.output
    assert "no active version of workflow 'nope'" in result.output


def test_engine_run_passes_the_store_hold_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--store-hold-ms` bounds how long intake holds an outcome while the store is unavailable
    (accord.engine.runtime.holding); 0 nacks at once, and a negative value is a usage error."""
    from accord.cli import engine as engine_cli

    made: list[int] = []
    opened = engine_cli.open_engine

    def recording(*args: Any, **kwargs: Any) -> Engine:
        engine = opened(*args, **kwargs)
        made.append(engine.hold.hold_ms)
        return engine

    monkeypatch.setattr(engine_cli, "open_engine", recording)
    url = f"sqlite:///{tmp_path / 'h.db'}"
    args = ["engine", "run", "--store", url, "--transport", url, "--workflow", "nope"]
    args += ["--state", str(tmp_path / "state")]
    for hold in ("250", "0"):
        result = CliRunner().invoke(app, [*args, "--store-hold-ms", hold])
        assert result.exit_code == 2 and "no active version" in result.output  # stops early
    assert made == [250, 0]
    refused = CliRunner().invoke(app, [*args, "--store-hold-ms", "-1"])
    assert refused.exit_code == 2 and not made[2:]
