"""``semantic.analyse@4``: geometry analysis in the sandbox, tags and reasons in the parent.

``semantic-analysis-request@1`` carries no ``objectKey``, so the model is found by the store's
``models/<modelId>.<ext>`` convention under the run's tenant. The child computes the measures
(:func:`~accord_worker_semantic_analyse.analysis.analyse`); turning them into tags is pure and
cheap (:func:`~accord_worker_semantic_analyse.analysis.describe`).
"""

from __future__ import annotations

from typing import Any

from accord_worker_meshes.check import FORMATS

from accord.worker.sandbox import Limits, check_input_size, register_preload, run_limited
from accord.worker.sdk import Context, Worker
from accord.worker.storage import model_in_store
from accord_worker_semantic_analyse.analysis import describe

__all__ = ["CAPABILITY", "LIMITS", "handle", "worker"]

CAPABILITY = "semantic.analyse@4"
# the capability contract's limits (timeMs 180000, memoryBytes 4 GiB, inputBytes 512 MiB)
LIMITS = Limits.from_contract(
    {"timeMs": 180_000, "memoryBytes": 4 << 30, "inputBytes": 512 << 20}, cpu_seconds=150
)
_ANALYSE = "accord_worker_semantic_analyse.analysis:analyse"

register_preload("accord_worker_semantic_analyse.analysis")
worker = Worker("semantic-analyse")


@worker.handler(CAPABILITY)
def handle(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Analyse the model; the result is a ``semantic-analysis@1`` payload."""
    limits: Limits = ctx.services.get("limits") or LIMITS
    _, key, path = model_in_store(payload, ctx, FORMATS)
    check_input_size(path, limits)
    ctx.raise_if_cancelled()
    ctx.progress(10, "analysing")
    measures = run_limited(_ANALYSE, (str(path), key, limits), limits)
    ctx.progress(100, "analysed")
    return {"modelId": payload["modelId"], **describe(measures, int(payload.get("maxTags", 20)))}
