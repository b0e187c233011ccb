"""Bad input at the `accord` command line: a located one-line error, the documented exit code
(1 refused, 2 usage), never a traceback, and with ``--json`` exactly one JSON document on stdout."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from accord.adapters import open_store, open_transport
from accord.cli import app
from accord.engine.machine.events import StageAccepted, StageSucceeded
from accord.engine.runtime.orchestrator import Engine
from accord.testing.clock import FakeClock
from accord.testing.plans import model_ingest_shape

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / "workflows" / "model-ingest.yaml"
T0 = 1_700_000_000_000  # 2023-11-14T22:13:20.000Z


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository root with the real contract sources and the model-ingest workflow."""
    shutil.copytree(REPO / "schemas" / "contracts", tmp_path / "schemas" / "contracts")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    text = WORKFLOW.read_text(encoding="utf-8")
    (tmp_path / "wf.yaml").write_text(text, encoding="utf-8")
    (tmp_path / "latin1.yaml").write_bytes(("# Entwurf für café\n" + text).encode("latin-1"))
    (tmp_path / "utf16.yaml").write_bytes(text.encode("utf-16"))  # with its byte-order mark
    monkeypatch.chdir(tmp_path)
    return tmp_path


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def no_traceback(result: Result) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception


# --- 1. workflow files that are not UTF-8 ---------------------------------------------------


@pytest.mark.parametrize("command", ["check", "compile", "activate"])
@pytest.mark.parametrize(
    ("name", "where", "hint"),
    [
        ("latin1.yaml", "latin1.yaml:1:12", "byte 11 (0xfc)"),  # the ü of "für"
        ("utf16.yaml", "utf16.yaml:1:1", "UTF-16 byte-order mark"),
    ],
)
def test_workflow_file_not_utf8_is_refused_with_its_location(
    scratch: Path, command: str, name: str, where: str, hint: str
) -> None:
    store = ["--store", "memory://"] if command == "activate" else []
    text = invoke("workflow", command, name, *store)
    no_traceback(text)
    assert text.exit_code == 1
    (line,) = [ln for ln in text.stderr.splitlines() if "workflow-encoding" in ln]
    assert line.startswith(where + ": error workflow-encoding") and hint in line

    as_json = invoke("workflow", command, name, *store, "--json")
    no_traceback(as_json)
    assert as_json.exit_code == 1
    doc = json.loads(as_json.stdout)
    assert doc["ok"] is False and doc["exit"] == 1
    (diag,) = doc["diagnostics"]
    assert diag["code"] == "workflow-encoding" and diag["file"] == name and hint in diag["message"]


def test_workflow_file_not_utf8_real_binary_prints_no_traceback(scratch: Path) -> None:
    accord = Path(sys.executable).parent / "accord"
    for name in ("latin1.yaml", "utf16.yaml"):
        done = subprocess.run(
            [str(accord), "workflow", "check", name], capture_output=True, text=True, check=False
        )
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr and f"{name}:1:" in done.stderr


# --- 2. --json prints one document in every outcome -----------------------------------------

BAD_SOURCE = "bad-source"  # setups a case may need
CASES: list[tuple[str, int, str | None]] = [
    ("contracts lint no/such/dir", 2, None),
    ("contracts lint", 1, BAD_SOURCE),
    ("contracts diff nope@1 thumbnail-generation-request@2", 2, None),
    ("contracts diff progress@1 progress@1 --mode sideways", 2, None),
    ("contracts diff progress@1 thumbnail.render@3", 2, None),
    ("contracts diff schemas/contracts/progress.v1.yaml progress@1", 1, BAD_SOURCE),
    ("contracts publish", 1, BAD_SOURCE),
    ("contracts codegen", 1, BAD_SOURCE),
    ("contracts validate nope@1 m.json", 2, None),
    ("contracts validate progress@1 missing.json", 2, None),
    ("contracts validate thumbnail.render@3 m.json", 2, None),
    ("contracts validate progress@1 m.json", 1, None),
    ("contracts show nope", 2, None),
    ("workflow check missing.yaml", 2, None),
    ("workflow check wf.yaml --contracts nope", 2, None),
    ("workflow check wf.yaml", 1, BAD_SOURCE),
    ("workflow check latin1.yaml", 1, None),
    ("workflow compile bad.yaml", 1, None),
    ("workflow compile wf.yaml --out pyproject.toml/plan.json", 2, None),
    ("workflow graph wf.yaml", 2, None),  # no --json option there: a usage error, in JSON
    ("workflow activate missing.yaml --store {store}", 2, None),
    ("workflow activate wf.yaml --store bogus://x", 2, None),
    ("workflow activate wf.yaml --store sqlite:///pyproject.toml/x.db", 2, None),
    ("workflow versions never --store {store}", 1, None),
    ("workflow rollback never --store {store}", 1, None),
    ("workflow show never --store {store}", 1, None),
    ("runs list --store bogus://x", 2, None),
    ("runs list --store {store} --limit 0", 2, None),
    ("runs show --store {store}", 2, None),
    ("runs show run_nope --store {store}", 1, None),
    ("runs show run_nope --store sqlite:///pyproject.toml", 2, None),
    ("runs history run_nope --store {store}", 1, None),
    ("runs explain run_nope --store {store}", 1, None),
    ("runs cancel run_nope --store {store}", 1, None),
    ("runs redrive run_nope render --store {store}", 1, None),
    ("engine reconcile --store bogus://x", 2, None),
    ("engine reconcile --store {store} --transport bogus://x", 2, None),
    ("demo --models empty", 2, None),
    ("demo --store memory://", 2, None),
    ("demo --contracts-only", 1, BAD_SOURCE),
    ("worker run nope:worker --transport memory://", 2, None),
]


@pytest.mark.parametrize(("command", "code", "setup"), CASES, ids=[c[0] for c in CASES])
def test_json_refusal_prints_exactly_one_document(
    scratch: Path, command: str, code: int, setup: str | None
) -> None:
    (scratch / "m.json").write_text('{"percent": "lots"}')
    (scratch / "empty").mkdir()
    wf = (scratch / "wf.yaml").read_text(encoding="utf-8")
    (scratch / "bad.yaml").write_text(wf.replace("next: publish", "next: publsh", 1))
    if setup == BAD_SOURCE:
        bad = scratch / "schemas" / "contracts" / "progress.v1.yaml"
        bad.write_text(bad.read_text().replace("type: number", "type: numbr"))
    args = command.format(store=f"sqlite:///{scratch / 'accord.db'}").split()
    result = invoke(*args, "--json")
    no_traceback(result)
    assert result.exit_code == code, result.output
    doc: Any = json.loads(result.stdout)  # exactly one document: anything more is "Extra data"
    assert isinstance(doc, dict) and doc["ok"] is False, doc
    assert doc.get("exit", code) == code
    if "exit" in doc:  # a refusal from the shared helper says what, in one line
        assert isinstance(doc["error"], str) and doc["error"] and "\n" not in doc["error"]


def test_json_internal_error_still_prints_one_document(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(url: str) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr("accord.cli.runs.open_store", broken)
    result = invoke("runs", "list", "--store", "memory://", "--json")
    assert isinstance(result.exception, RuntimeError)  # a bug keeps its traceback
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and doc["error"] == "internal error: RuntimeError: boom"


@pytest.mark.node  # the contract phase generates the TypeScript bindings too
def test_demo_contracts_only_json_prints_one_document(scratch: Path) -> None:
    package = REPO / "bindings" / "typescript"
    target = scratch / "bindings" / "typescript"
    shutil.copytree(package, target, ignore=shutil.ignore_patterns("node_modules", "dist"))
    (target / "node_modules").symlink_to(package / "node_modules")
    result = invoke("demo", "--contracts-only", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] is True
    assert [s["step"] for s in doc["steps"]][:1] == ["lint"] and doc["steps"][0]["result"] == "ok"


# --- 3. contracts diff --transitive between two files ---------------------------------------

WIDGET = """\
kind: message
name: widget
wireVersion: {version}
owner: platform
description: A widget, outside the workspace's sources.
payload:
  size: {{type: integer, required: true}}
{extra}"""


def test_diff_transitive_between_two_files_compares_them(scratch: Path) -> None:
    elsewhere = scratch / "elsewhere"
    elsewhere.mkdir()
    old, new = elsewhere / "widget.v1.yaml", elsewhere / "widget.v2.yaml"
    old.write_text(WIDGET.format(version=1, extra=""))
    new.write_text(WIDGET.format(version=2, extra="  colour: {type: string, required: true}\n"))
    plain = invoke("contracts", "diff", str(old), str(new), "--json")
    assert plain.exit_code == 1, plain.output
    transitive = invoke("contracts", "diff", str(old), str(new), "--transitive", "--json")
    assert transitive.exit_code == 1, transitive.output
    doc = json.loads(transitive.stdout)
    assert doc["transitive"] is True and doc["ok"] is False
    assert [r["old"] for r in doc["reports"]] == ["widget@1"]
    assert {f["code"] for f in doc["failures"]} == {"compat-not-backward"}
    assert any("colour" in f["path"] for f in doc["failures"])
    text = invoke("contracts", "diff", str(old), str(new), "--transitive")
    assert text.exit_code == 1 and "incompatible" in text.output


# --- 4. human times in `runs history|show|list` ---------------------------------------------


def _seed(url: str) -> str:
    """One completed run whose times are known: each event 1.25 s after the one before."""

    async def go() -> str:
        clock = FakeClock(T0)
        plan = model_ingest_shape(name="cli-times")
        engine = Engine(
            open_store(url, clock=clock), open_transport(url, clock=clock), clock, owns_ports=True
        )
        try:
            await engine.register_plan(plan)
            run_id = await engine.start_run(plan.name, {"modelId": "m1"}, tenant="acme")
            for stage in ("render", "analyse", "metadata", "publish"):
                run = await engine.load(run_id)
                assert run is not None
                cur = run.stages[stage]
                ident: dict[str, Any] = {"run_id": run_id, "stage": stage, "attempt": cur.attempt}
                clock.advance(1250)
                await engine.deliver(StageAccepted(**ident, fence=cur.fence))
                clock.advance(1250)
                await engine.deliver(StageSucceeded(**ident, fence=cur.fence))
            return run_id
        finally:
            await engine.stop()

    return asyncio.run(go())


def test_runs_history_prints_iso_utc_times_and_offsets(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'times.db'}"
    run_id = _seed(url)
    env = {"COLUMNS": "200"}
    text = CliRunner().invoke(app, ["runs", "history", run_id, "--store", url], env=env)
    assert text.exit_code == 0, text.output
    lines = text.stdout.splitlines()
    assert lines[0].split()[:4] == ["1", "2023-11-14T22:13:20.000Z", "+0.000s", "run-started"]
    accepted = next(ln for ln in lines if "stage-accepted" in ln).split()
    assert accepted[1:3] == ["2023-11-14T22:13:21.250Z", "+1.250s"]
    assert str(T0) not in text.stdout  # no epoch milliseconds in the human table
    as_json = CliRunner().invoke(app, ["runs", "history", run_id, "--store", url, "--json"])
    entries = json.loads(as_json.stdout)
    assert entries[0]["at_ms"] == T0 and entries[0]["event"]["kind"] == "run-started"


def test_runs_show_and_list_print_iso_utc_times(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'times.db'}"
    run_id = _seed(url)
    env = {"COLUMNS": "200"}
    shown = CliRunner().invoke(app, ["runs", "show", run_id, "--store", url], env=env)
    assert shown.exit_code == 0, shown.output
    assert "started 2023-11-14T22:13:20.000Z" in shown.stdout
    render = next(ln for ln in shown.stdout.splitlines() if ln.strip().startswith("render"))
    assert "+0.000s" in render and "+2.500s" in render  # dispatched, finished
    listed = CliRunner().invoke(app, ["runs", "list", "--store", url], env=env)
    assert listed.exit_code == 0 and "2023-11-14T22:13:20.000Z" in listed.stdout
    assert str(T0) not in shown.stdout + listed.stdout
    assert (
        json.loads(
            CliRunner().invoke(app, ["runs", "show", run_id, "--store", url, "--json"]).stdout
        )["started_at_ms"]
        == T0
    )
