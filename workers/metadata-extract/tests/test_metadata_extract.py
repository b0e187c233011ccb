"""metadata.extract@2 on the sample models (analytic values) and on hostile files."""

from __future__ import annotations

import math
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from accord_worker_metadata_extract import handle

from accord.contracts.dsl import load_file
from accord.contracts.validate import validate
from accord.errors import StageFailed
from accord.worker.sandbox import Limits
from accord.worker.sdk import Context
from accord.worker.storage import StorageMap

SAMPLES = Path(__file__).resolve().parents[3] / "examples" / "models"
LIMITS = Limits(cpu_seconds=20, wall_seconds=40)


def _ctx(root: Path, limits: Limits = LIMITS) -> Context:
    services = {"storage": StorageMap.local(root), "limits": limits}
    return Context(
        "run-1", "technical-metadata", 1, "f1", "acme", "metadata.extract@2", "k1", {}, services
    )


def _extract(root: Path, name: str, data: bytes | None = None, **extra: Any) -> dict[str, Any]:
    target = root / "acme" / "models" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if data is None:
        shutil.copy(SAMPLES / name, target)
    else:
        target.write_bytes(data)
    return handle({"modelId": "m1", "objectKey": f"models/{name}", **extra}, _ctx(root))


def test_plate_with_hole_matches_its_analytic_shape(tmp_path: Path) -> None:
    got = _extract(tmp_path, "plate-with-hole.stl")
    assert (got["format"], got["vertexCount"], got["faceCount"]) == ("stl", 16, 32)
    assert got["volume"] == pytest.approx((40**2 - 20**2) * 5, rel=1e-9)
    assert got["surfaceArea"] == pytest.approx(2 * (40**2 - 20**2) + 4 * 40 * 5 + 4 * 20 * 5)
    assert got["extents"] == {"x": 40.0, "y": 40.0, "z": 5.0}
    assert got["bounds"]["min"] == {"x": -20.0, "y": -20.0, "z": 0.0}
    assert got["watertight"] and got["windingConsistent"] and got["components"] == 1
    assert got["volumeUnavailableReason"] is None and got["units"] == "unknown"


def test_icosphere_and_torus_volumes_approach_the_analytic_ones(tmp_path: Path) -> None:
    sphere = _extract(tmp_path, "icosphere.ply")
    assert (sphere["vertexCount"], sphere["faceCount"]) == (162, 320)
    assert sphere["volume"] == pytest.approx(4 / 3 * math.pi * 10**3, rel=0.04)
    assert sphere["volume"] < 4 / 3 * math.pi * 10**3  # inscribed polyhedron
    torus = _extract(tmp_path, "torus.obj")
    assert (torus["vertexCount"], torus["faceCount"]) == (24 * 12, 2 * 24 * 12)
    assert torus["volume"] == pytest.approx(2 * math.pi**2 * 20 * 5**2, rel=0.06)


def test_multi_part_glb_and_3mf_units(tmp_path: Path) -> None:
    bracket = _extract(tmp_path, "bracket.glb")
    assert bracket["components"] == 2 and bracket["units"] == "m" and bracket["format"] == "glb"
    mm3 = 1e-9  # glTF is in metres
    assert bracket["volume"] == pytest.approx((30 * 10 * 4 + math.pi * 9 * 12) * mm3, rel=0.02)
    assert bracket["extents"]["y"] == pytest.approx(0.012)  # Y-up: the pin's axis is y
    cube = _extract(tmp_path, "cube.3mf")
    assert cube["units"] == "mm" and cube["volume"] == pytest.approx(1000.0)
    assert _extract(tmp_path, "cube.3mf", computeVolume=False)["volumeUnavailableReason"] == (
        "not-requested"
    )


def test_an_open_mesh_has_no_volume_and_says_why(tmp_path: Path) -> None:
    got = _extract(tmp_path, "open.obj", b"v 0 0 0\nv 1 0 0\nv 0 1 0\nv 0 0 1\nf 1 2 3\nf 1 2 4\n")
    assert got["volume"] is None and got["volumeUnavailableReason"] == "not-watertight"
    assert got["faceCount"] == 2 and not got["watertight"]


def test_a_point_cloud_has_counts_and_bounds_but_no_surface(tmp_path: Path) -> None:
    got = _extract(tmp_path, "cloud.obj", b"v 0 0 0\nv 2 0 0\nv 0 3 0\nv 0 0 -1\n")
    assert (got["vertexCount"], got["faceCount"], got["components"]) == (4, 0, 0)
    assert got["extents"] == {"x": 2.0, "y": 3.0, "z": 1.0} and got["surfaceArea"] == 0.0
    assert got["volume"] is None and not got["watertight"]


@pytest.mark.parametrize("name", [p.name for p in sorted(SAMPLES.iterdir()) if p.suffix != ".py"])
def test_sample_results_satisfy_technical_metadata_v1(tmp_path: Path, name: str) -> None:
    contract = load_file(
        SAMPLES.parents[1] / "schemas" / "contracts" / "technical-metadata.v1.yaml"
    )
    checked = validate(contract, _extract(tmp_path, name))
    assert checked.ok, checked.violations


def _binary_stl(triangles: np.ndarray, declared: int | None = None) -> bytes:
    count = len(triangles) if declared is None else declared
    body = b"".join(struct.pack("<12fH", 0, 0, 0, *t.reshape(-1), 0) for t in triangles)
    return b"\0" * 80 + struct.pack("<I", count) + body


TRI = np.array([[[0, 0, 0], [1, 0, 0], [0, 1, 0]], [[0, 0, 0], [0, 1, 0], [0, 0, 1]]], float)

HOSTILE: list[tuple[str, bytes, str]] = [
    ("truncated.stl", _binary_stl(TRI)[:-30], "malformed-model"),
    ("overcount.stl", _binary_stl(TRI, declared=1_000_000_000), "malformed-model"),
    ("undercount.stl", _binary_stl(np.repeat(TRI, 200, axis=0), declared=1), "malformed-model"),
    ("nan.stl", _binary_stl(np.where(TRI == 1, np.nan, TRI)), "malformed-model"),
    ("nan.obj", b"v 0 0 0\nv nan 0 0\nv 0 1 0\nf 1 2 3\n", "malformed-model"),
    ("range.obj", b"v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 99\n", "malformed-model"),
    (
        "range.ply",
        b"ply\nformat ascii 1.0\nelement vertex 3\nproperty float x\nproperty float y\n"
        b"property float z\nelement face 1\nproperty list uchar int vertex_indices\nend_header\n"
        b"0 0 0\n1 0 0\n0 1 0\n3 0 1 7\n",
        "malformed-model",
    ),
    (
        "overcount.ply",
        b"ply\nformat binary_little_endian 1.0\nelement vertex 500000000\nproperty float x\n"
        b"property float y\nproperty float z\nend_header\n" + b"\0" * 36,
        "malformed-model",
    ),
    ("overcount.off", b"OFF\n90000000 1 0\n0 0 0\n", "unsupported-format"),
    ("empty.obj", b"# nothing here\n", "malformed-model"),
    ("garbage.3mf", b"PK\x03\x04 not really a zip", "malformed-model"),
    ("garbage.glb", b"glTF\x02\0\0\0\xff\xff\xff\x7f", "malformed-model"),
    (
        "escape.gltf",
        b'{"asset":{"version":"2.0"},"buffers":[{"uri":"../../../etc/passwd","byteLength":4}]}',
        "malformed-model",
    ),
    ("model.xyz", b"1 2 3\n", "unsupported-format"),
    (
        "draco.gltf",
        b'{"asset":{"version":"2.0"},"extensionsUsed":["KHR_draco_mesh_compression"]}',
        "unsupported-format",
    ),
]


@pytest.mark.parametrize(("name", "data", "code"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_files_end_as_classified_failures(
    tmp_path: Path, name: str, data: bytes, code: str
) -> None:
    with pytest.raises(StageFailed) as caught:
        _extract(tmp_path, name, data)
    assert caught.value.failure_code == code, caught.value.reason
    assert caught.value.retryable is False


def test_an_oversized_model_is_refused(tmp_path: Path) -> None:
    (tmp_path / "acme" / "models").mkdir(parents=True)
    shutil.copy(SAMPLES / "torus.obj", tmp_path / "acme" / "models" / "torus.obj")
    with pytest.raises(StageFailed) as caught:
        handle(
            {"modelId": "m1", "objectKey": "models/torus.obj"},
            _ctx(tmp_path, Limits(input_bytes=1000)),
        )
    assert caught.value.failure_code == "input-too-large"


def test_traversal_in_the_payload_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StageFailed) as caught:
        handle({"modelId": "m1", "objectKey": "models/%2e%2e/%2e%2e/etc/passwd"}, _ctx(tmp_path))
    assert caught.value.failure_code == "invalid-object-key"
