"""Headless shaded rendering of a triangle mesh to PNG bytes (runs in the sandbox child).

No display and no GPU: matplotlib's Agg backend draws the triangles as a depth-sorted
``Poly3DCollection``. Shading is computed here, per face, with a light fixed relative to the
camera (a key light above and to the left of the eye), Lambertian with an ambient floor and
two-sided, so models with inverted or inconsistent winding still read as solid shapes.

- ``gallery``: perspective, no axes, white background, soft blue-grey material.
- ``inspection``: orthographic, face edges drawn, axes with ticks in the model's units.
- turntable views: the gallery look, camera azimuth stepped around the model.

glTF/GLB models are turned from their specified Y-up frame to the camera's Z-up one.

Very dense meshes are drawn from their largest faces (at most ``FACE_BUDGET``, chosen
deterministically): smaller ones are below a pixel at thumbnail sizes. Output is deterministic
(no timestamps or version strings in the PNG), so identical input gives identical digests.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import trimesh
from accord_worker_meshes.load import load_model
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from mpl_toolkits.mplot3d.art3d import Poly3DCollection  # type: ignore[import-untyped]

from accord.worker.sandbox import Limits, failure

__all__ = ["FACE_BUDGET", "VIEW_EDGE", "render", "render_png"]

FACE_BUDGET = 30_000
VIEW_EDGE = 256  # turntable views are small: a strip of them, not a hero image
_BASE = np.array([0.56, 0.66, 0.80])
_ELEVATION = 25.0
_AZIMUTH = -60.0


def _eye(elev: float, azim: float) -> np.ndarray:
    e, a = np.radians(elev), np.radians(azim)
    return np.array([np.cos(e) * np.cos(a), np.cos(e) * np.sin(a), np.sin(e)])


def render_png(
    triangles: np.ndarray,
    normals: np.ndarray,
    *,
    edge: int,
    azim: float,
    inspection: bool,
    units: str,
) -> bytes:
    """One ``edge``×``edge`` PNG of ``triangles`` (n×3×3) seen from azimuth ``azim``."""
    eye = _eye(_ELEVATION, azim)
    light = eye + 0.6 * _eye(_ELEVATION + 50.0, azim + 60.0)
    light /= np.linalg.norm(light)
    lambert = np.abs(normals @ light)  # two-sided: winding is not trusted
    shade = 0.28 + 0.72 * lambert
    colours = np.clip(_BASE[None, :] * shade[:, None] + 0.08 * lambert[:, None] ** 8, 0, 1)

    fig = Figure(figsize=(edge / 100, edge / 100), dpi=100, facecolor="white")
    FigureCanvasAgg(fig)
    ax: Any = fig.add_axes((0.0, 0.0, 1.0, 1.0), projection="3d")
    ax.set_proj_type(
        "ortho" if inspection else "persp", **({} if inspection else {"focal_length": 1.6})
    )
    low, high = triangles.reshape(-1, 3).min(axis=0), triangles.reshape(-1, 3).max(axis=0)
    centre, half = (low + high) / 2, max(float((high - low).max()) / 2, 1e-9)
    for setter, c in zip((ax.set_xlim, ax.set_ylim, ax.set_zlim), centre, strict=True):
        setter(c - half, c + half)
    ax.set_box_aspect((1, 1, 1), zoom=1.0 if inspection else 1.15)
    ax.view_init(elev=_ELEVATION, azim=azim)
    edges = {"edgecolors": (0.1, 0.12, 0.18, 0.5), "linewidths": 0.25} if inspection else {}
    ax.add_collection3d(Poly3DCollection(triangles, facecolors=colours, shade=False, **edges))
    if inspection:
        for label, setter in (("x", ax.set_xlabel), ("y", ax.set_ylabel), ("z", ax.set_zlabel)):
            setter(f"{label} ({units})" if units != "unknown" else label, fontsize=7)
        ax.tick_params(labelsize=6)
    else:
        ax.set_axis_off()
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=100, facecolor="white", metadata={"Software": None})
    return out.getvalue()


def render(path: str, name: str, limits: Limits, options: dict[str, Any]) -> dict[str, Any]:
    """Parse and render: ``{"preview": bytes, "views": [(angle, bytes), …], "faces": n}``.

    ``options``: ``previewType`` (gallery | inspection), ``views`` (turntable count, 0 for
    none) and ``maxEdge`` (pixels).
    """
    preview_type, views, max_edge = options["previewType"], options["views"], options["maxEdge"]
    model = load_model(path, name, limits)
    mesh = model.mesh
    if len(mesh.faces) == 0:
        raise failure("malformed-model", "the model has no faces to render")
    triangles, normals = _drawable(mesh)
    if model.fmt in ("gltf", "glb"):  # glTF is Y-up by specification; the camera is Z-up
        triangles, normals = _y_up(triangles), _y_up(normals)
    inspection = preview_type == "inspection"
    preview = render_png(
        triangles, normals, edge=max_edge, azim=_AZIMUTH, inspection=inspection, units=model.units
    )
    step = 360.0 / views if views else 0.0
    view_edge = min(max_edge, VIEW_EDGE)
    turntable = [
        (
            i * step,
            render_png(
                triangles,
                normals,
                edge=view_edge,
                azim=_AZIMUTH + i * step,
                inspection=False,
                units=model.units,
            ),
        )
        for i in range(views)
    ]
    return {"preview": preview, "views": turntable, "faces": len(triangles), "edge": max_edge}


def _y_up(values: np.ndarray) -> np.ndarray:
    """(x, y, z) in a Y-up frame → (x, −z, y) in the Z-up frame the camera uses."""
    return np.stack([values[..., 0], -values[..., 2], values[..., 1]], axis=-1)


def _drawable(mesh: trimesh.Trimesh) -> tuple[np.ndarray, np.ndarray]:
    """Triangles to draw and their normals. Large faces are split first: the painter's sort
    works per face, and one long sliver sorted wrongly would cut through the picture."""
    normals = np.nan_to_num(np.asarray(mesh.face_normals))
    if len(mesh.faces) < FACE_BUDGET // 8:
        diagonal = float(np.linalg.norm(mesh.extents)) or 1.0
        vertices, faces, index = trimesh.remesh.subdivide_to_size(  # type: ignore[no-untyped-call]
            mesh.vertices, mesh.faces, max_edge=diagonal / 16, max_iter=5, return_index=True
        )
        if len(faces) <= FACE_BUDGET:
            return np.asarray(vertices)[np.asarray(faces)], normals[np.asarray(index)]
    order = np.argsort(-np.asarray(mesh.area_faces), kind="stable")[:FACE_BUDGET]
    keep = np.sort(order)
    return np.asarray(mesh.triangles)[keep], normals[keep]
