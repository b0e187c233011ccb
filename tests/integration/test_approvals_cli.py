"""``accord runs approve|reject``: a decision on a waiting gate, through a SQLite store."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from typer.testing import CliRunner

from accord.adapters import open_store, open_transport
from accord.adapters.clock import SystemClock
from accord.cli import app
from accord.engine.runtime.orchestrator import Engine
from accord.workflow.plan import ApprovalStage, Approvers, Plan

FORM = "model-ingest-context@1"


def _plan(form: str | None) -> Plan:
    gate = ApprovalStage(
        name="review",
        approvers=Approvers(role="author"),
        options=("approve", "reject"),
        on_approve="completed",
        on_reject="failed",
        timeout_ms=3_600_000,
        on_timeout="failed",
        form=form,
    )
    return Plan.create(name=f"cli-gate-{bool(form)}", version="1", entry="review", stages=(gate,))


def _seed(url: str, plan: Plan, count: int) -> list[str]:
    async def go() -> list[str]:
        clock = SystemClock()
        engine = Engine(
            open_store(url, clock=clock), open_transport(url, clock=clock), clock, owns_ports=True
        )
        try:
            await engine.register_plan(plan)
            return [
                await engine.start_run(plan.name, {"modelId": f"m{i}"}, tenant="acme")
                for i in range(count)
            ]
        finally:
            await engine.stop()

    return asyncio.run(go())


def test_approve_and_reject_record_the_decision_and_refuse_a_second(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    yes, no = _seed(url, _plan(None), 2)
    cli = CliRunner()
    done = cli.invoke(app, ["runs", "approve", yes, "review", "--store", url,
                            "--comment", "ship it", "--json"])  # fmt: skip
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["status"] == "completed"
    shown = json.loads(cli.invoke(app, ["runs", "show", yes, "--store", url, "--json"]).output)
    (decision,) = shown["stages"]["review"]["result"]["decisions"]
    assert decision["by"].startswith("cli:") and decision["comment"] == "ship it"
    again = cli.invoke(app, ["runs", "reject", yes, "review", "--store", url, "--json"])
    assert again.exit_code == 1
    assert "refused by the run's rules: late" in json.loads(again.output)["error"]
    rejected = cli.invoke(app, ["runs", "reject", no, "review", "--store", url])
    assert rejected.exit_code == 0, rejected.output
    assert "failed" in rejected.output
    explained = cli.invoke(app, ["runs", "explain", no, "--store", url]).output
    assert "reject of gate 'review' by cli:" in explained
    not_gate = cli.invoke(app, ["runs", "approve", no, "nothing", "--store", url, "--json"])
    assert not_gate.exit_code == 1 and "no approval gate" in json.loads(not_gate.output)["error"]


def test_form_data_is_checked_against_the_gates_form_contract(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    (run,) = _seed(url, _plan(FORM), 1)
    cli = CliRunner()
    bad = cli.invoke(app, ["runs", "approve", run, "review", "--store", url,
                           "--form", '{"modelId": 7}', "--json"])  # fmt: skip
    assert bad.exit_code == 1 and "invalid" in json.loads(bad.output)["error"]
    assert "modelId" in json.loads(bad.output)["error"]
    not_json = cli.invoke(app, ["runs", "approve", run, "review", "--store", url,
                                "--form", "{nope", "--json"])  # fmt: skip
    assert not_json.exit_code == 2 and "--form" in json.loads(not_json.output)["error"]
    form = tmp_path / "form.json"
    form.write_text('{"modelId": "m-0"}', encoding="utf-8")
    good = cli.invoke(app, ["runs", "approve", run, "review", "--store", url,
                            "--form", f"@{form}", "--json"])  # fmt: skip
    assert good.exit_code == 0, good.output
    assert json.loads(good.output)["status"] == "completed"
