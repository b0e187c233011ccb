"""Fixtures for the worker runtime tests: the real contract catalog, a real in-memory queue with a
log of everything published, and a builder of job envelopes as the engine writes them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from accord.adapters.transports._base import QueueOptions
from accord.adapters.transports.memory import MemoryTransport
from accord.contracts.catalog import Catalog
from accord.contracts.sources import load_catalog
from accord.engine.runtime.intake import OUTCOMES_QUEUE

ROOT = Path(__file__).resolve().parents[3]
_CATALOG: list[Catalog] = []


@pytest.fixture
def catalog() -> Catalog:
    if not _CATALOG:
        _CATALOG.append(load_catalog(ROOT / "schemas" / "contracts"))
    return _CATALOG[0]


class Recorder(MemoryTransport):
    """A real in-memory queue that also keeps, in order, what was published (each outcome, also
    when it went in a batch) and any marks."""

    def __init__(self, visibility_ms: int = 30_000) -> None:
        super().__init__(None, QueueOptions(visibility_ms=visibility_ms, poll_ms=5))
        self.log: list[tuple[str, dict[str, Any]]] = []

    async def publish(self, queue: str, message_id: str, body: bytes, delay_ms: int = 0) -> None:
        if queue == OUTCOMES_QUEUE:  # a batch's members are logged one by one, in order
            doc = json.loads(body)
            members = doc["outcomes"] if doc["messageType"] == "batch" else [doc]
            self.log.extend((queue, member) for member in members)
        await super().publish(queue, message_id, body, delay_ms)

    def mark(self, what: str) -> None:
        self.log.append(("mark", {"messageType": what}))

    def kinds(self) -> list[str]:
        return [doc["messageType"] for _, doc in self.log]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [doc for _, doc in self.log if doc["messageType"] == kind]

    async def wait_for(self, kind: str, count: int = 1, timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.of(kind)) < count:
                await asyncio.sleep(0.005)


@pytest.fixture
async def transport() -> AsyncIterator[Recorder]:
    t = Recorder()
    yield t
    await t.close()


JobMaker = Callable[..., dict[str, Any]]


@pytest.fixture
def job() -> JobMaker:
    def make(
        payload: dict[str, Any] | None = None,
        *,
        run_id: str = "run_1",
        stage: str = "render-thumbnail",
        attempt: int = 1,
        fence: str = "f1" * 16,
    ) -> dict[str, Any]:
        return {
            "messageId": f"msg_{run_id}_{stage}_{attempt}",
            "messageType": "thumbnail-generation-request",
            "contractVersion": 2,
            "correlationId": run_id,
            "causationId": None,
            "producer": "accord-engine",
            "tenant": "acme",
            "occurredAt": "2026-01-01T00:00:00.000Z",
            "runId": run_id,
            "stage": stage,
            "attempt": attempt,
            "fence": fence,
            "idempotencyKey": f"idem_{run_id}_{stage}",
            "payload": {"modelId": "m1"} if payload is None else payload,
        }

    return make
