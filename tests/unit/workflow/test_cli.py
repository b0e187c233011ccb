"""`accord workflow …`: exit codes, JSON output, activation through a real SQLite store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from accord.cli import app

from .conftest import EXAMPLE, ROOT

runner = CliRunner()


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(ROOT / "schemas" / "contracts", tmp_path / "schemas" / "contracts")
    shutil.copy(EXAMPLE, tmp_path / "wf.yaml")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_check_and_compile(workdir: Path) -> None:
    assert runner.invoke(app, ["workflow", "check", "wf.yaml"]).exit_code == 0
    result = runner.invoke(app, ["workflow", "compile", "wf.yaml", "--json", "--out", "p.json"])
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    digest = (ROOT / "tests" / "golden" / "plans" / "model-ingest.digest").read_text().strip()
    assert doc["digest"] == digest == doc["plan"]["digest"]
    assert json.loads((workdir / "p.json").read_text())["digest"] == digest


def test_refused_definition_exits_1_with_located_diagnostics(workdir: Path) -> None:
    text = (workdir / "wf.yaml").read_text().replace("next: publish", "next: publsh")
    (workdir / "bad.yaml").write_text(text)
    result = runner.invoke(app, ["workflow", "check", "bad.yaml", "--json"])
    assert result.exit_code == 1
    (diag,) = json.loads(result.stdout)["diagnostics"]
    assert (diag["code"], diag["line"], diag["stage"]) == (
        "graph-unknown-target",
        17,
        "cache-route",
    )


def test_usage_errors_exit_2(workdir: Path) -> None:
    assert runner.invoke(app, ["workflow", "check", "missing.yaml"]).exit_code == 2
    assert (
        runner.invoke(app, ["workflow", "check", "wf.yaml", "--contracts", "nope"]).exit_code == 2
    )


def test_graph_prints_mermaid(workdir: Path) -> None:
    result = runner.invoke(app, ["workflow", "graph", "wf.yaml"])
    assert result.exit_code == 0 and result.stdout.startswith("flowchart TD")
    svg = runner.invoke(app, ["workflow", "graph", "wf.yaml", "--svg", "g.svg"])
    if shutil.which("dot"):
        assert svg.exit_code == 0 and (workdir / "g.svg").read_text().startswith("<?xml")
    else:
        assert svg.exit_code == 1 and not (workdir / "g.svg").exists()


def test_activate_versions_rollback_show(workdir: Path) -> None:
    store = ["--store", "sqlite:///state/accord.db"]
    first = json.loads(
        runner.invoke(app, ["workflow", "activate", "wf.yaml", "--json", *store]).stdout
    )
    text = (workdir / "wf.yaml").read_text().replace('"2.3.0"', '"2.3.1"')
    (workdir / "wf.yaml").write_text(text)
    second = runner.invoke(app, ["workflow", "activate", "wf.yaml", "--json", *store])
    assert second.exit_code == 0 and json.loads(second.stdout)["changed"] is True
    rows = json.loads(
        runner.invoke(app, ["workflow", "versions", "model-ingest", "--json", *store]).stdout
    )
    assert [r["version"] for r in rows] == ["2.3.0", "2.3.1"] and rows[-1]["active"]
    back = runner.invoke(app, ["workflow", "rollback", "model-ingest", "--json", *store])
    assert json.loads(back.stdout)["digest"] == first["digest"]
    shown = runner.invoke(app, ["workflow", "show", "model-ingest", "--json", *store])
    assert json.loads(shown.stdout)["plan"]["version"] == "2.3.0"
    bad = runner.invoke(app, ["workflow", "rollback", "model-ingest", "sha256:" + "1" * 64, *store])
    assert bad.exit_code == 1
