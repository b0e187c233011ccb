"""What the scale-out soak runs in its child processes: no-op actions and workers, and faults.

The engine processes register the platform actions of model-ingest (``cache.lookup`` answering a
miss, ``catalogue.publish``, ``audit.run-terminal``) as in-process no-ops; the worker processes
serve the three worker capabilities with no-op handlers through the real Worker SDK runtime.

Faults are seeded per job: :func:`fault_for` hashes ``seed:message id``, so about ``rate`` of the
jobs draw one of :data:`FAULTS` (a fifth of them a kill), the same on every run of the test.
:class:`FaultyTransport` wraps a worker's transport and carries the fault out the first time the
job is seen anywhere (a ``SET NX`` mark in Redis makes it one-shot across processes and restarts):

- ``kill-before-accept`` — the worker process ``SIGKILL``s itself on taking the job;
- ``kill-after-accept`` — it publishes ``accepted``, then ``SIGKILL``s itself;
- ``duplicate-job`` — the job is published again, under its own id and under an alias id, so the
  fleet receives it twice (BullMQ drops the same-id copy, RabbitMQ delivers it);
- ``duplicate-outcome`` — the final outcome is published twice (same id and an alias id).

A killed worker's jobs come back by the transport's own means (a lapsed BullMQ lock, a closed
AMQP channel); the supervisor in the test restarts the process.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

from redis import asyncio as aioredis

from accord.engine.ports import Delivery, Transport
from accord.engine.runtime.actions import ActionContext, ActionHandler
from accord.worker.sdk import Context, Worker

__all__ = [
    "AGAIN",
    "FAULTS",
    "QUEUES",
    "FaultyTransport",
    "fault_for",
    "noop_actions",
    "noop_worker",
]

FAULTS = ("kill-before-accept", "kill-after-accept", "duplicate-job", "duplicate-outcome")
# a kill costs a process start (about a second of CPU here), a duplicate almost nothing: one job
# in five of those hit is a kill, so the soak stays within its time on two cores
_DRAW = (
    "kill-before-accept",
    "kill-after-accept",
    *("duplicate-job",) * 4,
    *("duplicate-outcome",) * 4,
)
CAPABILITIES = {
    "thumbnail.render@3": "rendering",
    "semantic.analyse@4": "analysis",
    "metadata.extract@2": "metadata",
}
QUEUES = tuple(CAPABILITIES.values())
AGAIN = "~again"  # suffix of an alias message id: a second copy the transport cannot dedup
_FINAL = (":succeeded", ":failed")


def fault_for(seed: int, message_id: str, rate: float = 0.10) -> str | None:
    """The fault seeded for the job ``message_id``, or ``None`` (about ``1 - rate`` of jobs)."""
    if AGAIN in message_id:
        return None
    digest = hashlib.sha256(f"{seed}:{message_id}".encode()).digest()
    if int.from_bytes(digest[:4], "big") / 2**32 >= rate:
        return None
    return _DRAW[digest[4] % len(_DRAW)]


async def _noop_action(payload: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
    return {}


async def _miss(payload: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
    return {"hit": False, "outcome": "miss", "modelId": payload.get("modelId")}


def noop_actions() -> dict[str, ActionHandler]:
    return {
        "cache.lookup@1": _miss,
        "catalogue.publish@2": _noop_action,
        "audit.run-terminal@1": _noop_action,
    }


async def _noop_handler(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    return {}


def noop_worker() -> Worker:
    worker = Worker("soak")
    for capability, queue in CAPABILITIES.items():
        worker.bind(capability, _noop_handler, queue=queue)
    return worker


class FaultyTransport:
    """A worker's transport with the seeded faults of this module's docstring."""

    def __init__(self, inner: Transport, redis_url: str, marks: str, seed: int) -> None:
        self.inner, self.seed, self.marks = inner, seed, marks
        self.redis = aioredis.Redis.from_url(redis_url)
        self.armed: dict[str, str] = {}  # envelope message id -> fault this process carries out

    async def _arm(self, delivery: Delivery) -> str | None:
        fault = fault_for(self.seed, delivery.message_id)
        if fault is None or delivery.queue not in QUEUES:
            return None
        if not await self.redis.set(f"{self.marks}:{delivery.message_id}", fault, nx=True):
            return None  # carried out already (perhaps by a process that died of it)
        with contextlib.suppress(ValueError, AttributeError):  # outcomes carry the envelope's id
            self.armed[str(json.loads(delivery.body).get("messageId"))] = fault
        return fault

    async def publish(self, queue: str, message_id: str, body: bytes, delay_ms: int = 0) -> None:
        job_id = message_id.split(":", 1)[0]
        fault = self.armed.get(job_id)
        await self.inner.publish(queue, message_id, body, delay_ms)
        if fault == "kill-after-accept" and message_id.endswith(":accepted"):
            os.kill(os.getpid(), signal.SIGKILL)
        if fault == "duplicate-outcome" and message_id.endswith(_FINAL):
            await self.inner.publish(queue, message_id, body)
            await self.inner.publish(queue, message_id + AGAIN, body)

    async def _consume(self, queue: str, prefetch: int) -> AsyncIterator[Delivery]:
        async for delivery in self.inner.consume(queue, prefetch):
            fault = await self._arm(delivery)
            if fault == "kill-before-accept":
                os.kill(os.getpid(), signal.SIGKILL)
            if fault == "duplicate-job":
                await self.inner.publish(queue, delivery.message_id, delivery.body)
                await self.inner.publish(queue, delivery.message_id + AGAIN, delivery.body)
            yield delivery

    def consume(self, queue: str, prefetch: int = 1) -> AsyncIterator[Delivery]:
        return self._consume(queue, prefetch)

    async def ack(self, delivery: Delivery) -> None:
        await self.inner.ack(delivery)

    async def nack(self, delivery: Delivery, delay_ms: int = 0) -> None:
        await self.inner.nack(delivery, delay_ms)

    async def dead_letters(self, queue: str) -> list[Delivery]:
        return await self.inner.dead_letters(queue)

    async def close(self) -> None:
        await self.inner.close()
        await self.redis.aclose()
