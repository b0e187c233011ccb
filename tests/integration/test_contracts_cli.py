"""`accord contracts …` end to end in a scratch repository: exit codes and --json output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from accord.cli import app

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(REPO / "schemas" / "contracts", tmp_path / "schemas" / "contracts")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")  # the root is found by walking up
    return tmp_path


def run(*args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(app, ["contracts", *args], input=stdin)


def as_json(result: Result) -> dict:  # type: ignore[type-arg]
    data: dict = json.loads(result.stdout)  # type: ignore[type-arg]
    return data


def test_lint_ok_and_json(repo: Path) -> None:
    result = run("lint", "--json")
    assert result.exit_code == 0, result.output
    data = as_json(result)
    sources = len(list((REPO / "schemas" / "contracts").glob("*.yaml")))
    assert data["ok"] and len(data["contracts"]) == sources and data["diagnostics"] == []


def test_lint_refuses_bad_source_with_location(repo: Path) -> None:
    bad = repo / "schemas" / "contracts" / "progress.v1.yaml"
    bad.write_text(bad.read_text().replace("type: number", "type: numbr"))
    result = run("lint", "--json")
    assert result.exit_code == 1
    diagnostics = as_json(result)["diagnostics"]
    assert any(
        d["code"] == "dsl-bad-field-type"
        and d["file"].endswith("progress.v1.yaml")
        and d["line"] == 7
        and d["path"] == "payload.percent.type"
        for d in diagnostics
    )
    text = run("lint")
    assert text.exit_code == 1 and "progress.v1.yaml:7:" in text.output


def test_lint_missing_path_is_a_usage_error(repo: Path) -> None:
    assert run("lint", "no/such/dir").exit_code == 2


def test_diff_modes_and_exit_codes(repo: Path) -> None:
    backward = run(
        "diff", "thumbnail-generation-request@1", "thumbnail-generation-request@2", "--json"
    )
    assert backward.exit_code == 0, backward.output
    report = as_json(backward)["reports"][0]
    keys = {c["key"] for c in report["changes"]}
    assert "enum-value-added@payload.previewType" in keys
    full = run(
        "diff",
        "thumbnail-generation-request@1",
        "thumbnail-generation-request@2",
        "--mode",
        "full",
        "--json",
    )
    assert full.exit_code == 1
    assert {f["code"] for f in as_json(full)["failures"]} == {"compat-not-forward"}
    transitive = run(
        "diff",
        "thumbnail-generation-request@1",
        "thumbnail-generation-request@2",
        "--transitive",
        "--json",
    )
    assert transitive.exit_code == 0 and as_json(transitive)["transitive"] is True


def test_diff_accepts_files_and_rejects_bad_usage(repo: Path) -> None:
    sources = repo / "schemas" / "contracts"
    result = run(
        "diff",
        str(sources / "thumbnail-generation-request.v1.yaml"),
        str(sources / "thumbnail-generation-request.v2.yaml"),
    )
    assert result.exit_code == 0, result.output
    assert run("diff", "nope@1", "thumbnail-generation-request@2").exit_code == 2
    assert run("diff", "progress@1", "thumbnail.render@3").exit_code == 2
    assert run("diff", "progress@1", "progress@1", "--mode", "sideways").exit_code == 2


def test_publish_then_republish_then_conflict(repo: Path) -> None:
    dry = run("publish", "--dry-run", "--json")
    assert dry.exit_code == 0 and not (repo / "schemas" / "published").exists()
    first = run("publish", "--json")
    assert first.exit_code == 0, first.output
    assert {c["outcome"] for c in as_json(first)["contracts"]} == {"new"}
    second = run("publish", "--json")
    assert {c["outcome"] for c in as_json(second)["contracts"]} == {"unchanged"}
    source = repo / "schemas" / "contracts" / "progress.v1.yaml"
    source.write_text(source.read_text().replace("maxLength: 500", "maxLength: 400"))
    refused = run("publish", "--json")
    assert refused.exit_code == 1
    assert "progress@1 is already published" in as_json(refused)["error"]


def test_validate_a_message(repo: Path) -> None:
    good = repo / "good.json"
    good.write_text(json.dumps({"modelId": "m-1", "previewType": "inspection"}))
    ok = run("validate", "thumbnail-generation-request@2", str(good), "--json")
    assert ok.exit_code == 0, ok.output
    assert as_json(ok)["ok"] and as_json(ok)["contract"] == "thumbnail-generation-request@2"
    bad = '{"modelId": "m 1", "maxEdge": 9000, "colour": "red"}'
    refused = run("validate", "thumbnail-generation-request@2", "-", "--json", stdin=bad)
    assert refused.exit_code == 1
    paths = {v["path"] for v in as_json(refused)["violations"]}
    assert {"modelId", "maxEdge", "colour"} <= {p.rsplit(".", 1)[-1].strip("$") for p in paths}
    shadow = run("validate", "thumbnail-generation-request@2", "-", "--shadow", "--json", stdin=bad)
    assert shadow.exit_code == 0 and not as_json(shadow)["ok"] and as_json(shadow)["accepted"]
    assert run("validate", "thumbnail.render@3", str(good)).exit_code == 2
    assert run("validate", "progress@1", "missing.json").exit_code == 2


def test_show(repo: Path) -> None:
    result = run("show", "thumbnail-generation-request", "--json")
    assert result.exit_code == 0
    data = as_json(result)
    assert data["version"] == 2 and data["versions"] == [1, 2] and not data["published"]
    assert data["contract"]["payload"]["maxEdge"]["unit"] == "px"
    assert run("show", "nothing-here").exit_code == 2
    assert run("show", "thumbnail.render@3").exit_code == 0
