"""Deterministic, explainable shape analysis (runs in the sandbox child).

Each measure is a classical descriptor with a stated formula, and each tag carries the number
and threshold that produced it, so a reader can check every claim:

- principal extents: the model's extents along the eigenvectors of the area-weighted covariance
  of its face centroids; ``elongation = e1/e2``, ``flatness = e2/e3``.
- mirror symmetry about each principal plane: reflect the (strided) vertices and measure the mean
  nearest-neighbour distance, ``score = max(0, 1 − d / (0.02·diagonal))``.
- solidity (convexity) = volume / convex-hull volume, for closed meshes.
- sphericity = π^(1/3)·(6V)^(2/3) / A (1 for a sphere).
- genus from the Euler characteristic of a closed orientable surface: g = C − χ/2.
- wall thickness: rays cast inward from evenly strided faces; the 10th percentile of the
  distance to the opposite wall, flagged under 1 mm (in the model's units; unknown taken as mm)
  or under 1 % of the size.

No randomness: samples are strided, ties broken by index.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import trimesh
from accord_worker_meshes.load import load_model
from scipy.spatial import cKDTree  # type: ignore[import-untyped]

from accord.worker.sandbox import Limits, failure

__all__ = ["analyse", "describe"]

ANALYSER_VERSION = "geometry-1"
_SAMPLES = 4000
_RAYS = 256
_ONE_MM = {"mm": 1.0, "cm": 0.1, "m": 0.001, "in": 1 / 25.4}  # 1 mm in each unit


def _strided(n: int, k: int) -> np.ndarray:
    return np.arange(n) if n <= k else np.linspace(0, n - 1, k).round().astype(np.int64)


def _principal(mesh: trimesh.Trimesh) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    centres, weights = np.asarray(mesh.triangles_center), np.asarray(mesh.area_faces)
    weights = (
        weights / weights.sum() if weights.sum() > 0 else np.full(len(weights), 1 / len(weights))
    )
    mean = weights @ centres
    cov = (centres - mean).T @ ((centres - mean) * weights[:, None])
    _, vectors = np.linalg.eigh(cov)
    axes = vectors[:, ::-1].T  # rows: largest spread first
    projected = np.asarray(mesh.vertices - mean) @ axes.T
    extents = projected.max(axis=0) - projected.min(axis=0)
    return mean, axes, extents


def _mirror_scores(mesh: trimesh.Trimesh, mean: np.ndarray, axes: np.ndarray) -> list[float]:
    points = np.asarray(mesh.vertices)[_strided(len(mesh.vertices), _SAMPLES)] - mean
    tree = cKDTree(points)
    scale = 0.02 * float(np.linalg.norm(mesh.extents)) or 1.0
    scores = []
    for axis in axes:
        mirrored = points - 2 * np.outer(points @ axis, axis)
        distance, _ = tree.query(mirrored)
        scores.append(max(0.0, 1.0 - float(distance.mean()) / scale))
    return scores


def _thickness(mesh: trimesh.Trimesh) -> float | None:
    index = _strided(len(mesh.faces), _RAYS)
    normals = np.asarray(mesh.face_normals)[index]
    eps = 1e-4 * float(np.linalg.norm(mesh.extents))
    origins = np.asarray(mesh.triangles_center)[index] - normals * eps
    hits, rays, _ = mesh.ray.intersects_location(origins, -normals, multiple_hits=False)
    if len(rays) == 0:
        return None
    distance = np.linalg.norm(hits - origins[rays], axis=1) + eps  # rays start eps inside
    return float(np.percentile(distance, 10))


def analyse(path: str, name: str, limits: Limits) -> dict[str, Any]:
    """The measures of the model at ``path``, as plain numbers (``None`` where undefined)."""
    model = load_model(path, name, limits)
    mesh = model.mesh
    if len(mesh.faces) == 0 or float(mesh.area) <= 0:
        raise failure("malformed-model", "the model has no surface to analyse")
    mean, axes, extents = _principal(mesh)
    closed = bool(mesh.is_watertight and mesh.is_winding_consistent)
    components = len(mesh.split(only_watertight=False)) if len(mesh.faces) < 200_000 else None
    volume = abs(float(mesh.volume)) if closed else None
    hull = float(mesh.convex_hull.volume) if closed else None
    euler = int(mesh.euler_number)
    return {
        "extents": sorted((float(e) for e in extents), reverse=True),
        "mirror": _mirror_scores(mesh, mean, axes),
        "closed": closed,
        "components": components,
        "solidity": volume / hull if volume and hull else None,
        "sphericity": (np.pi ** (1 / 3)) * (6 * volume) ** (2 / 3) / float(mesh.area)
        if volume
        else None,
        "genus": (components - euler // 2) if closed and components else None,
        "thickness": _thickness(mesh) if closed else None,
        "size": float(np.linalg.norm(mesh.extents)),
        "faces": len(mesh.faces),
        "units": model.units,
    }


def describe(m: dict[str, Any], max_tags: int) -> dict[str, Any]:
    """Tags with confidences and one reason each from :func:`analyse` output."""
    e1, e2, e3 = (max(e, 1e-12) for e in m["extents"])
    tags: list[tuple[str, float, str]] = []

    def tag(label: str, confidence: float, reason: str) -> None:
        tags.append((label, round(min(1.0, max(0.0, confidence)), 3), reason[:200]))

    elongation, flatness = e1 / e2, e2 / e3
    if elongation >= 2.5:
        tag(
            "elongated",
            0.5 + elongation / 10,
            f"longest/middle principal extent {elongation:.2f} ≥ 2.5",
        )
    if flatness >= 3.0:
        tag("flat", 0.5 + flatness / 12, f"middle/shortest principal extent {flatness:.2f} ≥ 3")
    if elongation < 1.3 and flatness < 1.3:
        tag(
            "compact",
            1.3 - max(elongation, flatness) + 0.7,
            f"principal extents within 30 % ({e1:.3g}, {e2:.3g}, {e3:.3g})",
        )
    best = max(range(3), key=lambda i: m["mirror"][i])
    if m["mirror"][best] >= 0.8:
        tag(
            "mirror-symmetric",
            m["mirror"][best],
            f"mirror score {m['mirror'][best]:.2f} ≥ 0.8 about principal plane {best + 1}",
        )
    if sum(s >= 0.8 for s in m["mirror"]) == 3:
        tag(
            "highly-symmetric",
            min(m["mirror"]),
            "mirror scores ≥ 0.8 about all three principal planes",
        )
    if m["solidity"] is not None and m["solidity"] >= 0.95:
        tag("convex", m["solidity"], f"volume / convex-hull volume {m['solidity']:.3f} ≥ 0.95")
    elif m["solidity"] is not None and m["solidity"] < 0.6:
        tag("concave", 1 - m["solidity"], f"volume / convex-hull volume {m['solidity']:.3f} < 0.6")
    if m["sphericity"] is not None and m["sphericity"] >= 0.9:
        tag("sphere-like", m["sphericity"], f"sphericity {m['sphericity']:.3f} ≥ 0.9")
    if m["genus"]:
        tag(
            "has-through-holes",
            0.95,
            f"genus {m['genus']} from Euler characteristic of a closed surface",
        )
    if m["components"] and m["components"] > 1:
        tag("multi-part", 0.95, f"{m['components']} separate connected parts")
    if not m["closed"]:
        tag(
            "open-surface",
            0.9,
            "not watertight or inconsistently wound: volume-based measures skipped",
        )
    thin, units = m["thickness"], m.get("units", "unknown")
    limit = _ONE_MM.get(units, 1.0)  # unknown units: assume millimetres, as printers do
    if thin is not None and (thin < limit or thin < 0.01 * m["size"]):
        shown = units if units in _ONE_MM else "units (taken as mm)"
        reason = f"10th-percentile wall thickness {thin:.3g} {shown} < 1 mm or 1 % of size"
        tag("thin-walls", 0.7, reason)
    tags.sort(key=lambda t: (-t[1], t[0]))
    kept = tags[:max_tags]
    facts = [f"principal extents {e1:.4g} × {e2:.4g} × {e3:.4g}", f"{m['faces']} faces"]
    confidence = (0.9 if m["closed"] else 0.6) * (1.0 if m["faces"] >= 12 else 0.8)
    return {
        "descriptors": (facts + [f"{label}: {why}" for label, _, why in kept])[:32],
        "tags": [{"label": label, "confidence": c, "reason": why} for label, c, why in kept],
        "confidence": round(confidence, 3),
        "analyserVersion": ANALYSER_VERSION,
    }
