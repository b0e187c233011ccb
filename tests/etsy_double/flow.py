"""The marketplace workflow's inputs: the demo's models through model-ingest, then the context a
marketplace-publish run starts from (the ingest run's analysis, metadata and thumbnails)."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from accord.adapters import open_store
from accord.engine.machine.state import RunState

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "examples" / "models"
ACCORD = Path(sys.executable).with_name("accord")
GATE = "review-listing"  # the marketplace-publish approval gate


def demo_models() -> list[tuple[str, Path]]:
    """The demo's sample models, as ``accord demo`` names them (the file stem)."""
    exts = {".stl", ".obj", ".ply", ".glb", ".3mf"}
    return sorted((p.stem, p) for p in MODELS.iterdir() if p.suffix.lower() in exts)


def place_models(objects: Path, tenant: str) -> list[str]:
    """Copy the demo's models to ``<objects>/<tenant>/models/<modelId>.<ext>``."""
    target = objects / tenant / "models"
    target.mkdir(parents=True, exist_ok=True)
    ids = []
    for model_id, path in demo_models():
        shutil.copy(path, target / f"{model_id}{path.suffix.lower()}")
        ids.append(model_id)
    return ids


def publish_context(ingest: RunState, run_id: str) -> dict[str, Any]:
    """The marketplace-publish context of a completed model-ingest run."""
    analysis = dict(ingest.stages["semantic-analysis"].result or {})
    metadata = dict(ingest.stages["technical-metadata"].result or {})
    thumbs = dict(ingest.stages["render-thumbnail"].result or {})
    previews = [p["objectKey"] for p in thumbs.get("previews", []) if p["previewType"] == "gallery"]
    return {
        "modelId": metadata["modelId"],
        "ingestRunId": run_id,
        "format": metadata["format"],
        "descriptors": list(analysis["descriptors"]),
        "tags": [dict(t) for t in analysis["tags"]],
        "previewKeys": previews,
    }


async def decide_when_waiting(
    url: str, runs: Sequence[str], decision: str = "approve", *, timeout_s: float = 60
) -> list[dict[str, Any]]:
    """Once each run's listing review waits, decide it as an operator does: ``accord runs
    approve|reject RUN review-listing --store URL --json``, a process of its own. The documents
    it printed, in the order the gates were decided."""

    async def decide(run_id: str) -> dict[str, Any]:
        cli = await asyncio.create_subprocess_exec(
            str(ACCORD), "runs", decision, run_id, GATE, "--store", url, "--json",
            "--comment", f"{decision} from the marketplace tests",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await cli.communicate()
        assert cli.returncode == 0, (out.decode(), err.decode())
        doc: dict[str, Any] = json.loads(out)
        return doc

    store = open_store(url)
    pending, printed = list(runs), []
    deadline = time.monotonic() + timeout_s
    try:
        while pending:
            assert time.monotonic() < deadline, f"gates never waited: {pending}"
            waiting = []
            for run_id in pending:
                stored = await store.load(run_id)
                run = RunState.from_json(stored.state) if stored is not None else None
                if run is not None and run.stages[GATE].status == "waiting":
                    waiting.append(run_id)
                else:
                    assert run is None or not run.terminal, (run_id, run.status, run.error)
            printed += await asyncio.gather(*(decide(r) for r in waiting))  # the CLIs at once
            pending = [r for r in pending if r not in waiting]
            if pending:
                await asyncio.sleep(0.05)
    finally:
        await store.close()
    return printed
