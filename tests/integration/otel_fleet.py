"""The two Python workers of a model-ingest run, served by ``accord worker run`` in processes of
their own in the trace test: ``thumbnails`` (thumbnail.render@3) and ``semantics``
(semantic.analyse@4). Each answers with a valid result of its contract for the requested model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from accord.contracts.fixture_values import message_of
from accord.contracts.sources import load_catalog
from accord.worker import Context, Worker

ROOT = Path(__file__).resolve().parents[2]
_CATALOG = load_catalog(ROOT / "schemas" / "contracts")


def _worker(name: str, capability: str) -> Worker:
    cap = _CATALOG.capability(capability)
    assert cap is not None
    contract = _CATALOG.message(cap.result)
    assert contract is not None
    result = message_of(contract.payload, full=False)
    worker = Worker(name)

    def handle(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        return dict(result) | ({"modelId": payload["modelId"]} if "modelId" in result else {})

    worker.bind(capability, handle)
    return worker


thumbnails = _worker("otel-thumbnails", "thumbnail.render@3")
semantics = _worker("otel-semantics", "semantic.analyse@4")
