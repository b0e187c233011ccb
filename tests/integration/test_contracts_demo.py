"""`accord demo`, contract phase: lint, diff, publish and generate in a scratch repository copy."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from accord.cli import app

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "bindings" / "typescript"


@pytest.mark.node
def test_demo_runs_every_step_and_is_idempotent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(REPO / "schemas" / "contracts", tmp_path / "schemas" / "contracts")
    shutil.copytree(
        PACKAGE,
        tmp_path / "bindings" / "typescript",
        ignore=shutil.ignore_patterns("node_modules", "dist"),
    )
    (tmp_path / "bindings" / "typescript" / "node_modules").symlink_to(PACKAGE / "node_modules")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    monkeypatch.chdir(tmp_path)

    first = CliRunner().invoke(app, ["demo", "--contracts-only"], env={"COLUMNS": "200"})
    assert first.exit_code == 0, first.output
    sources = len(list((REPO / "schemas" / "contracts").glob("*.yaml")))
    assert f"{sources} new" in first.output and "accepted" in first.output
    assert (
        tmp_path / "schemas" / "published" / "thumbnail-generation-request" / "2.json"
    ).is_file()
    assert any((tmp_path / "src" / "accord" / "generated").glob("*.py"))

    second = CliRunner().invoke(app, ["demo", "--contracts-only"], env={"COLUMNS": "200"})
    assert second.exit_code == 0, second.output
    assert f"0 new, {sources} unchanged" in second.output and "0 written" in second.output


def test_demo_stops_with_exit_1_on_a_bad_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(REPO / "schemas" / "contracts", tmp_path / "schemas" / "contracts")
    (tmp_path / "schemas" / "contracts" / "broken.yaml").write_text("kind: message\nname: B\n")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["demo", "--contracts-only"])
    assert result.exit_code == 1
    assert not (tmp_path / "schemas" / "published").exists()
