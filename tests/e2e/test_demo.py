"""`accord demo` end to end, twice, in a scratch copy of the repository: the first run sends each
model through the real reference workers; the second finds them in the cache, and the durable
run history shows the decision took the cache-hit branch to publish with no worker dispatched."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from accord.adapters import open_store
from accord.cli import app
from accord.engine.machine.state import HistoryEntry, RunState

REPO = Path(__file__).resolve().parents[2]
MODELS = ("cube.3mf", "plate-with-hole.stl")


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for part in ("schemas/contracts", "workflows"):
        shutil.copytree(REPO / part, tmp_path / part)
    shutil.copytree(
        REPO / "bindings" / "typescript",
        tmp_path / "bindings" / "typescript",
        ignore=shutil.ignore_patterns("node_modules", "dist"),
    )
    modules = REPO / "bindings" / "typescript" / "node_modules"
    (tmp_path / "bindings" / "typescript" / "node_modules").symlink_to(modules)
    (tmp_path / "models").mkdir()
    for name in MODELS:
        shutil.copy(REPO / "examples" / "models" / name, tmp_path / "models" / name)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def demo(scratch: Path) -> list[dict[str, Any]]:
    args = [
        "demo",
        "--models",
        str(scratch / "models"),
        "--state",
        str(scratch / "state"),
        "--json",
    ]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output[result.output.index("[") :])
    assert isinstance(rows, list)
    return rows


async def recorded(db: Path, run_id: str) -> tuple[RunState, list[HistoryEntry]]:
    store = open_store(f"sqlite:///{db}")
    try:
        stored = await store.load(run_id)
        assert stored is not None
        history = [HistoryEntry.from_json(h) for h in await store.history(run_id)]
        return RunState.from_json(stored.state), history
    finally:
        await store.close()


@pytest.mark.node  # the contract phase generates the TypeScript bindings too
def test_demo_twice_second_run_comes_from_the_cache(scratch: Path) -> None:
    first = demo(scratch)
    assert sorted(r["modelId"] for r in first) == ["cube", "plate-with-hole"]
    for row in first:
        assert row["status"] == "completed" and row["route"] == "workers", row
        assert row["cacheOutcome"] == "miss"
        assert row["format"] in ("3mf", "stl") and row["faces"] > 0
        thumb = Path(row["thumbnails"][0])
        assert thumb.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    second = demo(scratch)
    for before, after in zip(first, second, strict=True):
        assert after["status"] == "completed" and after["route"] == "cache hit", after
        assert after["runId"] != before["runId"]
        # the report of a cached run is the same measurement, read back from the cache
        assert (after["format"], after["faces"], after["tags"]) == (
            before["format"], before["faces"], before["tags"],
        )  # fmt: skip
        run, history = asyncio.run(recorded(scratch / "state" / "accord.db", after["runId"]))
        assert "cache-route->publish" in run.released
        assert "cache-route->render-thumbnail" not in run.released
        lookup = run.stages["cache-lookup"].result
        assert lookup is not None and lookup["hit"] is True and len(lookup["results"]) == 3
        worked = {h.event.get("stage") for h in history if h.event.get("kind") == "stage-accepted"}
        assert worked.isdisjoint({"render-thumbnail", "semantic-analysis", "technical-metadata"})
        assert run.stages["publish"].status == "completed" and run.finalisers == ("completed",)


def test_demo_refuses_a_folder_without_models_before_writing_anything(scratch: Path) -> None:
    empty = scratch / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a model")
    result = CliRunner().invoke(app, ["demo", "--models", str(empty), "--state", "st"])
    assert result.exit_code == 2
    assert "no model files" in result.output
    assert not (scratch / "schemas" / "published").exists() and not (scratch / "st").exists()
