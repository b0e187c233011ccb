"""Load an untrusted model into one validated triangle mesh (runs inside the sandbox child).

The order is the defence: name → format (``unsupported-format``), optional gzip inflated with a
cap, structural prechecks on headers (:mod:`accord_worker_meshes.check`), then trimesh parses with
``process=False`` so nothing is silently repaired, and the result is checked before any geometry
is computed on it: finite coordinates, face indices inside the vertex array, at least one vertex.
Only then is a processed mesh built (coincident vertices merged), which is what every measure
uses. A scene's geometries are flattened with their transforms applied.

Units are reported only where the file states them: 3MF's ``unit`` attribute (millimetre when
absent, as the 3MF specification says), glTF (metres by specification), and a ``units``
comment in PLY/OBJ/OFF headers; otherwise ``unknown``.
"""

from __future__ import annotations

import logging
import re
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import trimesh

from accord.worker.sandbox import Limits, failure
from accord_worker_meshes.check import detect_format, inflate_gzip, precheck

__all__ = ["LoadedModel", "load_model"]

logging.getLogger("trimesh").setLevel(logging.ERROR)  # parser chatter is not an outcome

_UNIT_WORDS = {
    "millimeter": "mm", "millimetre": "mm", "mm": "mm", "centimeter": "cm", "centimetre": "cm",
    "cm": "cm", "meter": "m", "metre": "m", "m": "m", "inch": "in", "inches": "in", "in": "in",
}  # fmt: skip
_UNIT_COMMENT = re.compile(rb"(?im)^\s*(?:#|comment)\s*units?\s*[:=]?\s*([a-z]+)\s*$")


@dataclass(frozen=True, slots=True)
class LoadedModel:
    fmt: str
    units: str
    mesh: trimesh.Trimesh  # merged, validated triangles (may have no faces: a point cloud)
    gzipped: bool


def load_model(path: str, name: str, limits: Limits) -> LoadedModel:
    """Parse ``path`` (its format known from ``name``, the object key) under ``limits``."""
    fmt, gzipped = detect_format(name)
    with tempfile.TemporaryDirectory(prefix="accord-model-") as tmp:
        source = Path(path)
        if gzipped:
            inflated = Path(tmp) / f"model.{fmt}"
            inflate_gzip(source, inflated, limits.decompressed_bytes)
            source = inflated
        precheck(source, fmt, limits)
        units = _units(source, fmt)
        scene = trimesh.load_scene(str(source), file_type=fmt, process=False)
        mesh = _flatten(scene)
    return LoadedModel(fmt=fmt, units=units, mesh=mesh, gzipped=gzipped)


def _flatten(scene: trimesh.Scene) -> trimesh.Trimesh:
    vertices: list[np.ndarray] = []
    faces: list[np.ndarray] = []
    offset = 0
    for node in scene.graph.nodes_geometry:
        transform, geometry_name = scene.graph[node]
        geometry = scene.geometry[geometry_name]
        points = np.asarray(getattr(geometry, "vertices", np.zeros((0, 3))), dtype=np.float64)
        if points.ndim != 2 or points.shape[1] != 3:
            raise failure("malformed-model", f"geometry {geometry_name!r} has no 3D vertices")
        tri = np.asarray(getattr(geometry, "faces", np.zeros((0, 3))))
        tri = tri.reshape(-1, 3) if tri.size else np.zeros((0, 3), dtype=np.int64)
        _check(points, tri, str(geometry_name))
        moved = trimesh.transformations.transform_points(points, np.asarray(transform))
        vertices.append(moved)
        faces.append(tri.astype(np.int64) + offset)
        offset += len(points)
    if offset == 0:
        raise failure("malformed-model", "the file holds no geometry")
    all_vertices = np.concatenate(vertices)
    if not np.isfinite(all_vertices).all():
        raise failure("malformed-model", "a transform makes vertex coordinates non-finite")
    return trimesh.Trimesh(all_vertices, np.concatenate(faces), process=True, validate=False)


def _check(points: np.ndarray, tri: np.ndarray, name: str) -> None:
    if not np.isfinite(points).all():
        bad = int((~np.isfinite(points)).any(axis=1).sum())
        raise failure("malformed-model", f"{bad} vertices of {name!r} are NaN or infinite")
    if tri.size and (not np.issubdtype(tri.dtype, np.integer)):
        raise failure("malformed-model", f"face indices of {name!r} are not integers")
    if tri.size and (int(tri.min()) < 0 or int(tri.max()) >= len(points)):
        raise failure(
            "malformed-model",
            f"face index out of range in {name!r}: indices span {int(tri.min())}..{int(tri.max())}"
            f" over {len(points)} vertices",
        )


def _units(path: Path, fmt: str) -> str:
    if fmt in ("gltf", "glb"):
        return "m"
    if fmt == "3mf":
        try:
            with zipfile.ZipFile(path) as archive:
                names = [n for n in archive.namelist() if n.lower().endswith(".model")]
                head = archive.open(names[0]).read(4096) if names else b""
        except (zipfile.BadZipFile, OSError):
            return "unknown"
        found = re.search(rb"<model[^>]*\sunit\s*=\s*[\"']([a-z]+)[\"']", head)
        return _UNIT_WORDS.get(found.group(1).decode(), "unknown") if found else "mm"
    with path.open("rb") as f:
        head = f.read(4096)
    found = _UNIT_COMMENT.search(head)
    return _UNIT_WORDS.get(found.group(1).decode().lower(), "unknown") if found else "unknown"
