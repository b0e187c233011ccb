"""The marketplace workflow's inputs: the demo's models through model-ingest, then the context a
marketplace-publish run starts from (the ingest run's analysis, metadata and thumbnails)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from accord.engine.machine.state import RunState

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "examples" / "models"


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
