"""Outcome intake: worker outcome envelopes from the transport become events.

An outcome envelope names the attempt it reports on and what happened::

    {"messageId": "...", "messageType": "accepted" | "heartbeat" | "progress" | "succeeded"
                                       | "failed",
     "runId": "...", "stage": "...", "attempt": 1, "fence": "...", "workerId": "...",
     "payload": {...}}

``succeeded`` carries the result as ``payload``; ``failed`` carries ``{code, message,
retryable}``; ``progress`` carries ``{percent, message}``. The machine, not intake, decides
whether the attempt still counts (fencing, I3). Intake acknowledges a delivery only after the
event is committed, so a crash in between redelivers it, and a redelivered outcome is a duplicate
the machine records without a second release (I2).

A delivery intake cannot read is never dropped silently: it is quarantined with its reason on
``<queue>.quarantine`` (and counted) and then acknowledged. Results are checked against their
contracts by the engine's result hooks (:mod:`accord.engine.checks`), where the plan is known.
``deliver(event, delivery)`` answers ``None`` when no run took the event (an outcome for a run
that does not exist is quarantined too), ``True`` when its commit also acknowledged the delivery
(the queue shares the store's database), else ``False`` and intake acknowledges it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from accord.canonical import canonical_json
from accord.engine.events import (
    Event,
    HeartbeatReceived,
    ProgressReported,
    StageAccepted,
    StageFailed,
    StageSucceeded,
)
from accord.engine.ports import Delivery, Transport

__all__ = ["OUTCOMES_QUEUE", "Intake", "MalformedOutcome", "parse_outcome"]

OUTCOMES_QUEUE = "accord.outcomes"
MAX_OUTCOME_BYTES = 1_048_576

log = logging.getLogger("accord.engine.intake")


class MalformedOutcome(ValueError):
    """The delivery is not an outcome envelope; ``str()`` is the reason recorded."""


def _field(doc: Mapping[str, Any], key: str, kind: type) -> Any:
    value = doc.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise MalformedOutcome(f"field {key!r} must be {kind.__name__}")
    return value


def parse_outcome(body: bytes) -> tuple[Event, dict[str, Any]]:
    """Parse one outcome delivery; raises :class:`MalformedOutcome` with the reason."""
    if len(body) > MAX_OUTCOME_BYTES:
        raise MalformedOutcome(f"outcome of {len(body)} bytes exceeds {MAX_OUTCOME_BYTES}")
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedOutcome(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise MalformedOutcome("outcome must be a JSON object")
    kind = _field(doc, "messageType", str)
    ident: dict[str, Any] = {
        "run_id": _field(doc, "runId", str),
        "stage": _field(doc, "stage", str),
        "attempt": _field(doc, "attempt", int),
        "message_id": _field(doc, "messageId", str),
    }
    fence = doc.get("fence")
    if not isinstance(fence, str | int) or isinstance(fence, bool):
        raise MalformedOutcome("field 'fence' must be str")
    ident["fence"] = str(fence)
    payload = doc.get("payload", {})
    if not isinstance(payload, dict):
        raise MalformedOutcome("field 'payload' must be object")
    event: Event
    if kind == "accepted":
        event = StageAccepted(**ident, worker_id=str(doc.get("workerId", "")))
    elif kind == "heartbeat":
        event = HeartbeatReceived(**ident)
    elif kind == "progress":
        percent = payload.get("percent", 0)
        if not isinstance(percent, int | float) or isinstance(percent, bool):
            raise MalformedOutcome("field 'payload.percent' must be number")
        note = str(payload.get("message", ""))
        event = ProgressReported(**ident, progress=float(percent) / 100.0, note=note)
    elif kind == "succeeded":
        event = StageSucceeded(**ident, result=payload)
    elif kind == "failed":
        retryable = payload.get("retryable", False)
        if not isinstance(retryable, bool):
            raise MalformedOutcome("field 'payload.retryable' must be bool")
        event = StageFailed(
            **ident,
            retryable=retryable,
            code=str(payload.get("code", "failed")),
            message=str(payload.get("message", "")),
        )
    else:
        raise MalformedOutcome(f"unknown messageType {kind!r}")
    return event, doc


class Intake:
    def __init__(
        self,
        transport: Transport,
        deliver: Callable[[Event, Delivery], Awaitable[bool | None]],
        *,
        queue: str = OUTCOMES_QUEUE,
    ) -> None:
        self._transport, self._deliver, self.queue = transport, deliver, queue
        self.quarantined: list[dict[str, Any]] = []
        self.processed = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._busy = 0

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def process(self, delivery: Delivery) -> Event | None:
        """Turn one delivery into a committed event, or quarantine it; then acknowledge it."""
        try:
            event, _ = parse_outcome(delivery.body)
        except MalformedOutcome as exc:
            await self._quarantine(delivery, str(exc))
            return None
        taken = await self._deliver(event, delivery)
        if taken is None:
            await self._quarantine(delivery, f"no run {event.run_id!r}")
            return None
        if not taken:  # not settled by the commit itself (see accord.engine.joint)
            await self._transport.ack(delivery)
        self.processed += 1
        return event

    async def _quarantine(self, delivery: Delivery, reason: str) -> None:
        record = {
            "queue": delivery.queue,
            "message_id": delivery.message_id,
            "reason": reason,
            "body": delivery.body.decode("utf-8", errors="replace")[:65_536],
        }
        log.warning("quarantined outcome %s: %s", delivery.message_id, reason)
        qid = f"quarantine:{delivery.message_id}"
        await self._transport.publish(f"{self.queue}.quarantine", qid, canonical_json(record))
        self.quarantined.append(record)
        await self._transport.ack(delivery)

    async def run(self, stop: Callable[[], bool], prefetch: int = 64) -> None:
        """Consume until ``stop()``. Up to ``prefetch`` outcomes are processed at once, so one
        outcome's commit overlaps the next one's decoding; the engine's per-run locks keep the
        outcomes of one run in arrival order."""
        slots = asyncio.Semaphore(prefetch)
        spawn = asyncio.get_running_loop().create_task
        async for delivery in self._transport.consume(self.queue, prefetch):
            await slots.acquire()
            self._busy += 1
            self._idle.clear()
            spawn(self._guarded(delivery, slots))
            if stop():
                break

    async def _guarded(self, delivery: Delivery, slots: asyncio.Semaphore) -> None:
        try:
            await self.process(delivery)
        except Exception:  # not acknowledged: the transport redelivers it
            log.exception("outcome %s not processed", delivery.message_id)
            with contextlib.suppress(Exception):
                await self._transport.nack(delivery, 100)
        finally:
            slots.release()
            self._busy -= 1
            if self._busy == 0:
                self._idle.set()
