"""``accord dev new-worker``: a scaffolded Python and TypeScript worker pass their own tests.

Each is written into a scratch repository (``tmp_path``) holding this repository's ``schemas``
(and, for TypeScript, its built bindings and their ``node_modules``, linked), then its own suite
runs there: pytest for Python (with ruff over the package), ``npm run build && npm test`` for
TypeScript. The scaffold's CI file and Kustomize base are the ones the rules render for it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from accord.cli import app
from accord.dev import Layout, render_ci
from accord.dev.repo import read_graph, read_layout

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _scratch(tmp_path: Path, *, typescript: bool = False) -> Path:
    (tmp_path / "schemas").symlink_to(ROOT / "schemas")
    if typescript:
        (tmp_path / "bindings").mkdir()
        (tmp_path / "bindings" / "typescript").symlink_to(ROOT / "bindings" / "typescript")
    return tmp_path


def _new(tmp_path: Path, name: str, capability: str, language: str) -> dict[str, object]:
    done = CliRunner().invoke(
        app,
        [
            "dev",
            "new-worker",
            name,
            "--capability",
            capability,
            "--language",
            language,
            "--into",
            str(tmp_path),
            "--json",
        ],
    )
    assert done.exit_code == 0, done.output
    doc: dict[str, object] = json.loads(done.stdout)
    return doc


def _agrees_with_the_rules(tmp_path: Path, name: str, capability: str) -> None:
    layout = read_layout(tmp_path)
    package = layout.packages[name]
    assert package.capabilities == (capability,) and package.has_suite and package.containerfile
    ci = (tmp_path / ".github" / "workflows" / f"ci-{name}.yaml").read_text()
    assert ci == render_ci(Layout({name: package}), read_graph(ROOT), name)
    workflow = YAML(typ="safe").load(ci)
    assert f"workers/{name}/**" in workflow["on"]["pull_request"]["paths"]
    configmap = YAML(typ="safe").load(
        (tmp_path / package.path / "k8s" / "configmap.yaml").read_text()
    )
    index = json.loads((ROOT / "schemas" / "published" / "index.json").read_text())
    name_, _, version = capability.partition("@")
    published = next(
        c for c in index["contracts"] if (c["name"], c["version"]) == (name_, int(version))
    )
    assert json.loads(configmap["data"]["contracts.json"])[capability] == published["digest"]


def test_a_python_scaffold_passes_its_own_tests_and_lint(tmp_path: Path) -> None:
    root = _scratch(tmp_path)
    doc = _new(root, "mesh-preview", "thumbnail.render@3", "python")
    assert ".github/workflows/ci-mesh-preview.yaml" in doc["files"]  # type: ignore[operator]
    folder = root / "workers" / "mesh-preview"
    config = str(ROOT / "pyproject.toml")
    # from the repository root, so its settings (first-party `accord`, line length) apply
    for argv in (
        ["ruff", "check", "--config", config, str(folder)],
        ["ruff", "format", "--check", "--config", config, str(folder)],
    ):
        lint = subprocess.run(
            [str(BIN / argv[0]), *argv[1:]],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert lint.returncode == 0, lint.stdout + lint.stderr
    env = {**os.environ, "PYTHONPATH": str(folder / "src")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests",
            "-p",
            "no:cacheprovider",
            "-c",
            config,
            "--rootdir",
            str(folder),
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout
    _agrees_with_the_rules(root, "mesh-preview", "thumbnail.render@3")


@pytest.mark.node
def test_a_typescript_scaffold_builds_and_passes_its_own_tests(tmp_path: Path) -> None:
    modules = ROOT / "workers" / "metadata-extract-ts" / "node_modules"
    if (
        shutil.which("npm") is None
        or not (ROOT / "bindings/typescript/dist").is_dir()
        or not modules.is_dir()
    ):
        pytest.fail("the TypeScript bindings are not built: run `make node`")
    root = _scratch(tmp_path, typescript=True)
    _new(root, "extract-lite", "metadata.extract@2", "typescript")
    folder = root / "workers" / "extract-lite"
    # the same compiler, types and bindings the TypeScript worker builds with
    (folder / "node_modules").symlink_to(modules)
    done = subprocess.run(
        ["sh", "-c", "npm run --silent build && npm test --silent"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "# pass 3" in done.stdout and "# fail 0" in done.stdout
    one = subprocess.run(
        ["node", "dist/src/main.js"],
        cwd=folder,
        input='{"modelId": "m-1"}',
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout)["modelId"] == "m-1"
    _agrees_with_the_rules(root, "extract-lite", "metadata.extract@2")


def test_new_worker_refuses_what_it_cannot_scaffold(tmp_path: Path) -> None:
    runner = CliRunner()
    cases = [
        (
            ["Bad_Name", "--capability", "thumbnail.render@3", "--language", "python"],
            1,
            "worker name",
        ),
        (
            ["x-y", "--capability", "thumbnail.render@9", "--language", "python"],
            1,
            "no such capability",
        ),
        (["x-y", "--capability", "cache.lookup@1", "--language", "python"], 1, "is an action"),
        (["x-y", "--capability", "thumbnail.render@3", "--language", "cobol"], 2, "--language"),
    ]
    for args, code, message in cases:
        done = runner.invoke(app, ["dev", "new-worker", *args, "--into", str(tmp_path), "--json"])
        assert done.exit_code == code, (args, done.output)
        assert message in json.loads(done.stdout)["error"], args
    assert not (tmp_path / "workers").exists()


def test_ci_check_fails_on_drift_and_ci_repairs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _scratch(tmp_path)
    _new(root, "mesh-preview", "thumbnail.render@3", "python")
    monkeypatch.chdir(root)
    runner = CliRunner()
    assert runner.invoke(app, ["dev", "ci", "--check", "--json"]).exit_code == 0
    ci = root / ".github" / "workflows" / "ci-mesh-preview.yaml"
    ci.write_text(ci.read_text().replace("'src/**'", "'lib/**'"))
    stale = ci.with_name("ci-gone.yaml")
    stale.write_text(ci.read_text())
    done = runner.invoke(app, ["dev", "ci", "--check", "--json"])
    assert done.exit_code == 1
    error = json.loads(done.stdout)["error"]
    assert "ci-mesh-preview.yaml differs" in error and "ci-gone.yaml is stale" in error
    fixed = runner.invoke(app, ["dev", "ci", "--json"])
    assert json.loads(fixed.stdout)["removed"] == [".github/workflows/ci-gone.yaml"]
    assert runner.invoke(app, ["dev", "ci", "--check"]).exit_code == 0
    assert not stale.exists()


def test_affected_run_fails_when_a_suite_it_reaches_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _scratch(tmp_path)
    _new(root, "mesh-preview", "thumbnail.render@3", "python")
    monkeypatch.chdir(root)
    monkeypatch.setenv("PYTHONPATH", str(root / "workers" / "mesh-preview" / "src"))
    runner = CliRunner()
    args = ["dev", "affected", "workers/mesh-preview/README.md", "--run", "--json"]
    # the scaffold passes (test_a_python_scaffold_…); broken, the suite it reaches fails
    handler = (
        root / "workers" / "mesh-preview" / "src" / "accord_worker_mesh_preview" / "handler.py"
    )
    handler.write_text(handler.read_text().replace('**RESULT, "modelId"', '**RESULT, "unknown"'))
    failed = runner.invoke(app, args)
    assert failed.exit_code == 1
    assert json.loads(failed.stdout)["error"] == (
        "suite failed: pytest workers/mesh-preview/tests -p no:cacheprovider"
    )
