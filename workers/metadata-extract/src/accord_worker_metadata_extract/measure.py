"""Geometry measures for ``technical-metadata@1``, computed in the sandbox child.

Every number comes from the merged, validated mesh of :func:`accord_worker_meshes.load.load_model`:
vertex count after merging coincident vertices (a binary STL repeats each corner per triangle),
faces, connected components of the face graph, axis-aligned bounds and extents, surface area,
and volume only when it is well defined — a closed surface (every edge shared by exactly two
faces) with consistent winding; otherwise ``null`` and the reason. Orientation does not matter:
an inside-out closed mesh still has a volume, reported as its absolute value.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from accord_worker_meshes.load import load_model
from scipy.sparse import coo_matrix  # type: ignore[import-untyped]
from scipy.sparse.csgraph import connected_components  # type: ignore[import-untyped]

from accord.worker.sandbox import Limits, failure

__all__ = ["component_count", "measure"]


def component_count(faces: np.ndarray, vertex_count: int) -> int:
    """Connected components of the triangles (sharing a vertex joins them)."""
    if len(faces) == 0:
        return 0
    a = faces.reshape(-1)
    b = np.roll(faces, 1, axis=1).reshape(-1)
    graph = coo_matrix((np.ones(len(a), dtype=np.int8), (a, b)), shape=(vertex_count,) * 2)
    _, labels = connected_components(graph, directed=False)
    return len(np.unique(labels[np.unique(faces)]))


def _xyz(values: np.ndarray) -> dict[str, float]:
    return {axis: float(v) for axis, v in zip("xyz", values, strict=True)}


def measure(path: str, name: str, limits: Limits, compute_volume: bool) -> dict[str, Any]:
    """The ``technical-metadata@1`` fields except ``modelId``."""
    model = load_model(path, name, limits)
    mesh = model.mesh
    faces = np.asarray(mesh.faces)
    has_faces = len(faces) > 0
    watertight = bool(has_faces and mesh.is_watertight)
    winding = bool(has_faces and mesh.is_winding_consistent)
    volume: float | None = None
    reason: str | None = None
    if not compute_volume:
        reason = "not-requested"
    elif not watertight:
        reason = "not-watertight"
    elif not winding:
        reason = "inconsistent-winding"
    else:
        volume = abs(float(mesh.volume))
    # a point cloud or polyline has vertices but no faces: its bounds are its points'
    points = np.asarray(mesh.vertices[np.unique(faces)] if has_faces else mesh.vertices)
    low, high = points.min(axis=0), points.max(axis=0)
    area = float(mesh.area) if has_faces else 0.0
    numbers = [*low, *high, area, volume or 0.0]
    if not all(math.isfinite(float(v)) for v in numbers):
        raise failure("malformed-model", "coordinates are too large to measure (overflow)")
    return {
        "format": model.fmt,
        "units": model.units,
        "vertexCount": len(mesh.vertices),
        "faceCount": len(faces),
        "components": component_count(faces, len(mesh.vertices)),
        "bounds": {"min": _xyz(low), "max": _xyz(high)},
        "extents": _xyz(high - low),
        "surfaceArea": area,
        "volume": volume,
        "volumeUnavailableReason": reason,
        "watertight": watertight,
        "windingConsistent": winding,
    }
