"""The affected set of a change, after source 003's table and the contract graph, and the
generated CI files' path filters read the way GitHub reads them: both must agree on every row."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from accord.cli import app
from accord.dev import ContractGraph, Layout, affected, ci_files, inputs_of, sparse_set
from accord.dev.repo import read_graph, read_layout

ROOT = Path(__file__).resolve().parents[2]
PYTHON = {
    "marketplace-etsy",
    "metadata-extract",
    "metadata-extract-http",
    "semantic-analyse",
    "thumbnail-render",
}
TYPESCRIPT = {"metadata-extract-ts"}
EVERY = PYTHON | TYPESCRIPT
SANDBOXED = {"metadata-extract", "metadata-extract-http", "semantic-analyse", "thumbnail-render"}

# source 003's table of example changes, on Accord's layout, then the contract-graph rows
ROWS: list[tuple[str, list[str], set[str]]] = [
    (
        "a worker's own source",
        ["workers/thumbnail-render/src/accord_worker_thumbnail_render/handler.py"],
        {"thumbnail-render"},
    ),
    ("the Python SDK (commons-python)", ["src/accord/worker/sdk.py"], PYTHON),
    ("the platform package's manifest", ["pyproject.toml"], PYTHON),
    (
        "the envelope schema: every worker in every language",
        ["schemas/contracts/envelope.v1.yaml"],
        EVERY,
    ),
    (
        "another worker's own source",
        ["workers/semantic-analyse/src/accord_worker_semantic_analyse/handler.py"],
        {"semantic-analyse"},
    ),
    (
        "two workers in one change",
        [
            "workers/semantic-analyse/README.md",
            "workers/marketplace-etsy/src/accord_worker_marketplace_etsy/wire.py",
        ],
        {"semantic-analyse", "marketplace-etsy"},
    ),
    ("README.md only", ["README.md"], set()),
    ("docs only", ["docs/architecture.md", "CONTRIBUTING.md"], set()),
    ("the TypeScript bindings", ["bindings/typescript/src/index.ts"], TYPESCRIPT),
    (
        "a shared library reaches the workers installing it",
        ["workers/meshes/src/accord_worker_meshes/load.py"],
        SANDBOXED,
    ),
    (
        "a worker another worker installs",
        ["workers/metadata-extract/src/accord_worker_metadata_extract/measure.py"],
        {"metadata-extract", "metadata-extract-http"},
    ),
    (
        "test data the 3D workers read",
        ["examples/models/cube.stl"],
        SANDBOXED - {"metadata-extract-http"},
    ),
    (
        "a result contract one worker uses",
        ["schemas/contracts/semantic-analysis.v1.yaml"],
        {"semantic-analyse"},
    ),
    (
        "a result contract several workers use",
        ["schemas/contracts/technical-metadata.v1.yaml"],
        {"metadata-extract", "metadata-extract-http", "metadata-extract-ts"},
    ),
    (
        "a capability's published artefact",
        ["schemas/published/thumbnail.render/3.json"],
        {"thumbnail-render"},
    ),
    (
        "a contract a connector's own source validates",
        ["schemas/contracts/etsy-create-listing-request.v1.yaml"],
        {"marketplace-etsy"},
    ),
    ("the outcome contract: every worker", ["schemas/contracts/outcome.v1.yaml"], EVERY),
    (
        "an outcome kind's payload contract: every worker",
        ["schemas/contracts/stage-failed.v1.yaml"],
        EVERY,
    ),
    (
        "the error outcomes every request lists",
        ["schemas/fixtures/retryable-error/1/valid.json"],
        EVERY,
    ),
    ("a contract no worker uses", ["schemas/contracts/audit-record.v1.yaml"], set()),
    ("the published index: schema-wide", ["schemas/published/index.json"], EVERY),
    ("a worker's own CI file", [".github/workflows/ci-metadata-extract-ts.yaml"], TYPESCRIPT),
    ("the platform's tests only", ["tests/unit/test_canonical.py"], set()),
]


@cache
def repo() -> tuple[Layout, ContractGraph]:
    return read_layout(ROOT), read_graph(ROOT)


def _glob(pattern: str) -> re.Pattern[str]:
    """A GitHub Actions path filter: ``**`` any characters, ``*`` and ``?`` none of ``/``."""
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def triggered(filters: list[str], path: str) -> bool:
    """GitHub's rule: the last pattern matching ``path`` decides (``!`` excludes)."""
    verdict = False
    for pattern in filters:
        negated = pattern.startswith("!")
        if _glob(pattern.removeprefix("!")).match(path):
            verdict = not negated
    return verdict


def workflows_run(changed: list[str]) -> set[str]:
    """The workflows GitHub would start for ``changed``, from the files in the repository."""
    started = set()
    for path in sorted((ROOT / ".github" / "workflows").glob("ci-*.yaml")):
        doc = YAML(typ="safe").load(path.read_text(encoding="utf-8"))
        on = doc["on"]
        assert on["push"]["paths"] == on["pull_request"]["paths"], path
        if any(triggered(on["pull_request"]["paths"], p) for p in changed):
            started.add(path.stem.removeprefix("ci-"))
    return started


@pytest.mark.parametrize(("row", "changed", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_affected_and_the_ci_path_filters_agree_with_the_table(
    row: str, changed: list[str], expected: set[str]
) -> None:
    layout, graph = repo()
    found = affected(changed, layout, graph)
    assert set(found.workers) == expected, row
    assert workflows_run(changed) == expected, row


def test_the_platform_suite_runs_for_platform_changes_only() -> None:
    layout, graph = repo()
    assert not affected(["workers/thumbnail-render/README.md"], layout, graph).platform
    assert not affected(["README.md", "docs/monorepo.md"], layout, graph).platform
    assert affected(["src/accord/engine/machine.py"], layout, graph).platform
    assert affected(["schemas/contracts/audit-record.v1.yaml"], layout, graph).platform
    parts = affected(["src/accord/worker/sdk.py", "README.md"], layout, graph).parts
    assert parts == ("python-sdk", "docs")


def test_every_path_any_ci_file_lists_is_reached_by_affected() -> None:
    """The other direction: each literal path in a worker's filters reaches that worker."""
    layout, graph = repo()
    for path, text in ci_files(layout, graph).items():
        worker = path.rsplit("/ci-", 1)[1].removesuffix(".yaml")
        filters = YAML(typ="safe").load(text)["on"]["push"]["paths"]
        for pattern in filters:
            if pattern.startswith("!"):
                continue
            sample = pattern.replace("**", "x/y.txt").replace("*", "x")
            assert triggered(filters, sample) == (
                worker in affected([sample], layout, graph).workers
            ), (worker, sample)


def test_the_capabilities_read_from_the_sources_are_those_the_workers_bind() -> None:
    layout, _ = repo()
    assert layout.packages["thumbnail-render"].capabilities == ("thumbnail.render@3",)
    assert layout.packages["marketplace-etsy"].capabilities == (
        "marketplace.etsy.prepare-listing@1",
        "marketplace.etsy.publish-listing@2",
        "marketplace.etsy.publish-listing@1",
    )
    assert layout.packages["metadata-extract-ts"].capabilities == ("metadata.extract@2",)
    from accord_worker_marketplace_etsy.handler import worker as etsy  # type: ignore[import-untyped]
    from accord_worker_semantic_analyse.handler import worker as semantic  # type: ignore[import-untyped]

    assert tuple(etsy.bindings) == layout.packages["marketplace-etsy"].capabilities
    assert tuple(semantic.bindings) == layout.packages["semantic-analyse"].capabilities


def test_a_sparse_checkout_holds_everything_that_reaches_its_worker() -> None:
    """Working on one worker never needs a folder its sparse set leaves out: every input the
    rules say reaches it, and every repository folder its tests read, is inside the set (root
    files are always there in cone mode)."""
    layout, graph = repo()
    for worker in layout.workers:
        cone = sparse_set(layout, graph, worker.name)
        inputs = inputs_of(layout, graph, worker.name)
        inside = [*inputs.folders, *inputs.files]
        for path in inside:
            assert "/" not in path or any(path == c or path.startswith(c + "/") for c in cone), (
                worker.name,
                path,
            )
        tests = (ROOT / worker.path).glob("test*/**/*")
        for test in tests:
            if test.suffix in {".py", ".ts"}:
                for first, second in re.findall(
                    r"parents\[\d\]\s*/\s*\"([\w.-]+)\"(?:\s*/\s*\"([\w-]+)\")?", test.read_text()
                ):
                    needed = f"{first}/{second}" if second else first
                    assert any(needed == c or needed.startswith(c + "/") for c in cone), (
                        worker.name,
                        needed,
                    )
    assert sparse_set(layout, graph, "metadata-extract-ts") == (
        "workers/metadata-extract-ts",
        "bindings/typescript",
        "schemas",
        ".github",
    )


def test_the_makefile_sparse_targets_are_the_sparse_sets() -> None:
    layout, graph = repo()
    makefile = (ROOT / "Makefile").read_text()
    for worker in layout.workers:
        line = f"git sparse-checkout set --cone {' '.join(sparse_set(layout, graph, worker.name))}"
        assert f"sparse-{worker.name}:\n\t{line}\n" in makefile, worker.name


def test_the_cli_prints_one_json_document_in_every_outcome() -> None:
    runner = CliRunner()
    done = runner.invoke(
        app, ["dev", "affected", "schemas/contracts/semantic-analysis.v1.yaml", "--json"]
    )
    assert done.exit_code == 0, done.output
    doc = json.loads(done.stdout)
    assert doc["workers"] == ["semantic-analyse"] and doc["platform"] is True
    bad = runner.invoke(app, ["dev", "affected", "../outside.py", "--json"])
    assert bad.exit_code == 2
    assert json.loads(bad.stdout)["error"].startswith("changed path '../outside.py'")
    unknown = runner.invoke(app, ["dev", "affected", "--base", "no-such-ref-xyz", "--json"])
    assert unknown.exit_code == 1
    assert "no-such-ref-xyz" in json.loads(unknown.stdout)["error"]


def test_the_generated_ci_files_and_k8s_bases_pass_check() -> None:
    done = CliRunner().invoke(app, ["dev", "ci", "--check", "--json"])
    assert done.exit_code == 0, done.output
    files = json.loads(done.stdout)["files"]
    assert len([f for f in files if f.startswith(".github/workflows/ci-")]) == 6
    assert len([f for f in files if "/k8s/" in f]) == 5 * 3  # five deployed workers
