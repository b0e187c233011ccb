"""``thumbnail.render@3``: render previews in the sandbox, store them, list keys and digests.

The child (:func:`~accord_worker_thumbnail_render.render.render`) parses and draws, returning PNG
bytes; the parent writes each image atomically to the tenant's object store and reports the key,
size and ``sha256`` digest of exactly what it wrote. Keys are deterministic per model, preview
type and size (``thumbnails/<modelId>/<type>-<maxEdge>.png``; turntable views
``…/<type>-<maxEdge>-view-<angle>.png``), so a redelivered job overwrites with identical bytes.
"""

from __future__ import annotations

import time
from typing import Any

from accord_worker_meshes.check import FORMATS

from accord.worker.sandbox import Limits, check_input_size, register_preload, run_limited
from accord.worker.sdk import Context, Worker
from accord.worker.storage import model_in_store

__all__ = ["CAPABILITY", "LIMITS", "TURNTABLE_VIEWS", "handle", "worker"]

CAPABILITY = "thumbnail.render@3"
# the capability contract's limits (timeMs 300000, memoryBytes 2 GiB, inputBytes 512 MiB)
LIMITS = Limits.from_contract(
    {"timeMs": 300_000, "memoryBytes": 2 << 30, "inputBytes": 512 << 20}, cpu_seconds=240
)
TURNTABLE_VIEWS = 8
_RENDER = "accord_worker_thumbnail_render.render:render"

register_preload("accord_worker_thumbnail_render.render")
worker = Worker("thumbnail-render")


@worker.handler(CAPABILITY)
def handle(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Render and store previews; the result is a ``thumbnail-generated@1`` payload."""
    limits: Limits = ctx.services.get("limits") or LIMITS
    storage, key, path = model_in_store(payload, ctx, FORMATS)
    check_input_size(path, limits)
    model_id = str(payload["modelId"])
    preview_type = str(payload.get("previewType", "gallery"))
    edge = int(payload.get("maxEdge", 512))
    views = TURNTABLE_VIEWS if payload.get("generate360Views", True) else 0
    ctx.raise_if_cancelled()
    ctx.progress(5, "rendering")
    started = time.perf_counter()
    options = {"previewType": preview_type, "views": views, "maxEdge": edge}
    drawn = run_limited(_RENDER, (str(path), key, limits, options), limits)
    render_ms = int((time.perf_counter() - started) * 1000)
    ctx.raise_if_cancelled()
    ctx.progress(90, "storing")
    base = f"thumbnails/{model_id}/{preview_type}-{edge}"
    stored_key, size, digest = storage.put_bytes(f"{base}.png", drawn["preview"])
    previews = [
        {
            "previewType": preview_type,
            "objectKey": stored_key,
            "contentType": "image/png",
            "width": edge,
            "height": edge,
            "sizeBytes": size,
            "digest": digest,
        }
    ]
    result_views = []
    for angle, png in drawn["views"]:
        view_key, _, view_digest = storage.put_bytes(f"{base}-view-{round(angle):03d}.png", png)
        result_views.append({"angle": float(angle), "objectKey": view_key, "digest": view_digest})
    ctx.progress(100, "stored")
    return {"modelId": model_id, "previews": previews, "views": result_views, "renderMs": render_ms}
