"""`accord contracts docs [--check] [--out]` in a scratch repository: regions regenerated, prose
kept, a stale region named with exit 1, a document that cannot be rendered refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from accord.cli import app

REPO = Path(__file__).resolve().parents[2]
PROSE = "# Protocol\n\nHand-written | prose, `kept`.\n\n"
DOC = (
    PROSE
    + "<!-- generated: progress@1 -->\nstale table\n<!-- end generated -->\n\nBetween.\n\n"
    + "<!-- generated: envelope@1 -->\n<!-- end generated -->\n\nAfter.\n"
)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(REPO / "schemas" / "contracts", tmp_path / "schemas" / "contracts")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "protocol.md").write_text(DOC, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(*args: str) -> Result:
    return CliRunner().invoke(app, ["contracts", "docs", *args])


def test_check_names_the_stale_regions_and_writes_nothing(repo: Path) -> None:
    result = run("--check")
    assert result.exit_code == 1, result.output
    assert "docs/protocol.md: region progress@1 is stale" in result.output
    assert "region envelope@1 is stale" in result.output
    assert (repo / "docs" / "protocol.md").read_text(encoding="utf-8") == DOC
    data = json.loads(run("--check", "--json").stdout)
    assert data["ok"] is False and data["stale"] == ["progress@1", "envelope@1"]


def test_regenerating_fills_the_regions_keeps_the_prose_and_is_then_fresh(repo: Path) -> None:
    result = run()
    assert result.exit_code == 0, result.output
    text = (repo / "docs" / "protocol.md").read_text(encoding="utf-8")
    assert text.startswith(PROSE + "<!-- generated: progress@1 -->\n**`progress@1`**")
    assert "stale table" not in text
    assert "| `percent` | number | yes | minimum 0; maximum 100; unit percent |" in text
    assert "| `payloadRef.digest` | string | yes |" in text
    assert "\n<!-- end generated -->\n\nBetween.\n\n" in text and text.endswith("\n\nAfter.\n")
    again = run("--check", "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout) == {
        "check": True,
        "ok": True,
        "path": str(repo / "docs" / "protocol.md"),
        "regions": ["progress@1", "envelope@1"],
        "stale": [],
    }


def test_a_changed_contract_makes_the_check_fail_naming_its_region(repo: Path) -> None:
    assert run().exit_code == 0
    source = repo / "schemas" / "contracts" / "progress.v1.yaml"
    source.write_text(source.read_text().replace("maxLength: 500", "maxLength: 400"))
    result = run("--check")
    assert result.exit_code == 1
    assert "region progress@1 is stale" in result.output and "envelope@1" not in result.output


def test_out_names_another_document(repo: Path) -> None:
    other = repo / "other.md"
    other.write_text("x\n<!-- generated: capabilities -->\n<!-- end generated -->\n")
    assert run("--out", str(other)).exit_code == 0
    assert "| `metadata.extract@2` | active | `metadata` |" in other.read_text()
    assert (repo / "docs" / "protocol.md").read_text(encoding="utf-8") == DOC


def test_a_region_naming_no_contract_is_refused_in_one_line(repo: Path) -> None:
    doc = repo / "docs" / "protocol.md"
    doc.write_text("<!-- generated: nothing@9 -->\n<!-- end generated -->\n")
    result = run("--check")
    assert result.exit_code == 1
    assert "region nothing@9: no message contract nothing@9" in result.output
    assert "Traceback" not in result.output
    data = json.loads(run("--json").stdout)
    assert data["ok"] is False and data["exit"] == 1 and "nothing@9" in data["error"]


def test_a_missing_document_is_a_usage_error(repo: Path) -> None:
    result = run("--check", "--out", "no/such.md", "--json")
    assert result.exit_code == 2
    assert "cannot read no/such.md" in json.loads(result.stdout)["error"]


def test_sources_that_do_not_lint_are_refused(repo: Path) -> None:
    source = repo / "schemas" / "contracts" / "progress.v1.yaml"
    source.write_text(source.read_text().replace("type: number", "type: numbr"))
    result = run("--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["error"] == "sources do not lint"
    assert any(d["code"] == "dsl-bad-field-type" for d in data["diagnostics"])
    assert (repo / "docs" / "protocol.md").read_text(encoding="utf-8") == DOC
