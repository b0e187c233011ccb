"""``metadata.extract@2``: resolve the model in the tenant's store, measure it in the sandbox.

The handler itself does no parsing: it resolves ``storageConnectionRef`` + ``objectKey`` (or the
``models/<modelId>.<ext>`` convention) under the run's tenant, refuses oversized input before
reading it, and runs :func:`~accord_worker_metadata_extract.measure.measure` in a limited child.
OFF files parse, but ``technical-metadata@1`` has no ``off`` format value, so they are refused as
``unsupported-format`` before any work.
"""

from __future__ import annotations

from typing import Any

from accord_worker_meshes.check import FORMATS, detect_format

from accord.worker.sandbox import Limits, check_input_size, failure, register_preload, run_limited
from accord.worker.sdk import Context, Worker
from accord.worker.storage import model_in_store

__all__ = ["CAPABILITY", "LIMITS", "handle", "worker"]

CAPABILITY = "metadata.extract@2"
# the capability contract's limits (timeMs 120000, memoryBytes 1 GiB, inputBytes 512 MiB)
LIMITS = Limits.from_contract(
    {"timeMs": 120_000, "memoryBytes": 1 << 30, "inputBytes": 512 << 20}, cpu_seconds=60
)
_RESULT_FORMATS = ("stl", "obj", "ply", "gltf", "glb", "3mf")
_MEASURE = "accord_worker_metadata_extract.measure:measure"

register_preload("accord_worker_metadata_extract.measure")
worker = Worker("metadata-extract")


@worker.handler(CAPABILITY)
def handle(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Measure the model; the result is a ``technical-metadata@1`` payload."""
    limits: Limits = ctx.services.get("limits") or LIMITS
    _, key, path = model_in_store(payload, ctx, FORMATS)
    fmt, _ = detect_format(key)
    if fmt not in _RESULT_FORMATS:
        raise failure("unsupported-format", f"technical-metadata@1 has no format value {fmt!r}")
    check_input_size(path, limits)
    ctx.raise_if_cancelled()
    ctx.progress(10, "measuring")
    compute_volume = bool(payload.get("computeVolume", True))
    measured = run_limited(_MEASURE, (str(path), key, limits, compute_volume), limits)
    ctx.progress(100, "measured")
    return {"modelId": payload["modelId"], **measured}
