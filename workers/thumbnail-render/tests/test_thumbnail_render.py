"""thumbnail.render@3: PNGs of the requested size, stored with digests of their exact bytes."""

from __future__ import annotations

import hashlib
import io
import shutil
from pathlib import Path

import numpy as np
import pytest
from accord_worker_thumbnail_render import handle
from PIL import Image

from accord.errors import StageFailed
from accord.worker.sandbox import Limits
from accord.worker.sdk import Context
from accord.worker.storage import StorageMap

SAMPLES = Path(__file__).resolve().parents[3] / "examples" / "models"
LIMITS = Limits(cpu_seconds=30, wall_seconds=60)


def _ctx(root: Path) -> Context:
    services = {"storage": StorageMap.local(root), "limits": LIMITS}
    return Context(
        "run-1", "render-thumbnail", 1, "f1", "acme", "thumbnail.render@3", "k1", {}, services
    )


def _stage(root: Path, name: str) -> None:
    (root / "acme" / "models").mkdir(parents=True, exist_ok=True)
    shutil.copy(SAMPLES / name, root / "acme" / "models" / name)


def _check_stored(root: Path, key: str, digest: str) -> bytes:
    data = (root / "acme" / key).read_bytes()
    assert digest == "sha256:" + hashlib.sha256(data).hexdigest()
    return data


def test_gallery_preview_with_turntable(tmp_path: Path) -> None:
    _stage(tmp_path, "bracket.glb")
    got = handle({"modelId": "bracket", "previewType": "gallery", "maxEdge": 320}, _ctx(tmp_path))
    (preview,) = got["previews"]
    data = _check_stored(tmp_path, preview["objectKey"], preview["digest"])
    assert preview["sizeBytes"] == len(data) and preview["contentType"] == "image/png"
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG" and image.size == (320, 320) == (
        preview["width"],
        preview["height"],
    )
    pixels = np.asarray(image.convert("RGB"), dtype=float)
    model = pixels[(pixels < 245).any(axis=2)]  # not background
    assert len(model) > 0.03 * 320 * 320  # the model fills a real part of the frame
    assert model.std(axis=0).mean() > 5  # shaded: several tones, not a flat silhouette
    assert [v["angle"] for v in got["views"]] == [i * 45.0 for i in range(8)]
    digests = {v["digest"] for v in got["views"]}
    assert len(digests) == 8  # the camera really moves around an asymmetric part
    for view in got["views"]:
        _check_stored(tmp_path, view["objectKey"], view["digest"])


def test_inspection_preview_without_views_is_deterministic(tmp_path: Path) -> None:
    _stage(tmp_path, "plate-with-hole.stl")
    payload = {
        "modelId": "plate",
        "objectKey": "models/plate-with-hole.stl",
        "previewType": "inspection",
        "generate360Views": False,
        "maxEdge": 256,
    }
    first = handle(payload, _ctx(tmp_path))
    second = handle(payload, _ctx(tmp_path))
    assert first["views"] == [] and first["previews"][0]["previewType"] == "inspection"
    assert first["previews"] == second["previews"]  # same bytes, same key: redelivery is harmless
    assert first["previews"][0]["objectKey"] == "thumbnails/plate/inspection-256.png"


@pytest.mark.parametrize("name", ["icosphere.ply", "bracket.glb", "cube.3mf"])
def test_every_sample_format_renders(tmp_path: Path, name: str) -> None:
    _stage(tmp_path, name)
    got = handle(
        {"modelId": "m", "objectKey": f"models/{name}", "generate360Views": False, "maxEdge": 128},
        _ctx(tmp_path),
    )
    data = _check_stored(tmp_path, got["previews"][0]["objectKey"], got["previews"][0]["digest"])
    assert Image.open(io.BytesIO(data)).size == (128, 128)


def test_a_point_cloud_is_a_classified_failure(tmp_path: Path) -> None:
    (tmp_path / "acme" / "models").mkdir(parents=True)
    (tmp_path / "acme" / "models" / "cloud.obj").write_bytes(b"v 0 0 0\nv 1 0 0\nv 0 1 0\n")
    with pytest.raises(StageFailed) as caught:
        handle({"modelId": "cloud", "objectKey": "models/cloud.obj"}, _ctx(tmp_path))
    assert caught.value.failure_code == "malformed-model"
