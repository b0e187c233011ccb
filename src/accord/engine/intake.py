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

**Batches.** A worker with several outcomes ready at once may send them as one message (fewer
broker messages, confirms and acknowledgements per run; see :mod:`accord.worker.batching`)::

    {"messageType": "batch", "outcomes": [<outcome envelope>, ...]}

Each member is taken exactly as if it had come alone, in order (members for one run are applied
in the order listed). The batch is acknowledged once every member is committed or quarantined; a
member that cannot be committed leaves the whole batch unacknowledged, and its redelivery makes
the members already committed duplicates, which the machine records without a second release.
A malformed member is quarantined on its own (its id, or the batch's with ``#<index>``) and the
others go on. The batch's id is derived from its members' ids (:func:`encode_batch`).

**The store unavailable.** A delivery whose commit meets a retryable
:class:`~accord.errors.StoreError` is held and processed again in place for up to 10 s
(:mod:`accord.engine.holding`) before it is nacked. Nacking at once would spend the delivery's
budget in a second or so of outage, and past the queue's delivery limit a good outcome would be
dead-lettered. While deliveries are held their prefetch slots stay taken, so intake takes nothing
new until the store answers again. A pass whose commit landed but whose answer was lost is a
duplicate on the next pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
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
from accord.engine.holding import Hold
from accord.engine.ports import Delivery, Transport

__all__ = [
    "BATCH_TYPE",
    "MAX_OUTCOME_BYTES",
    "OUTCOMES_QUEUE",
    "Intake",
    "MalformedOutcome",
    "encode_batch",
    "parse_outcome",
]

OUTCOMES_QUEUE = "accord.outcomes"
MAX_OUTCOME_BYTES = 1_048_576  # one outcome, and one batch of them
BATCH_TYPE = "batch"
_BATCH_HEAD = b'{"messageType":"batch","outcomes":['

log = logging.getLogger("accord.engine.intake")


class MalformedOutcome(ValueError):
    """The delivery is not an outcome envelope; ``str()`` is the reason recorded."""


def _field(doc: Mapping[str, Any], key: str, kind: type) -> Any:
    value = doc.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise MalformedOutcome(f"field {key!r} must be {kind.__name__}")
    return value


def encode_batch(members: Sequence[tuple[str, bytes]]) -> tuple[str, bytes]:
    """The message id and body of one batch of outcome envelopes (``(message_id, body)`` pairs,
    each body a JSON object). The id is a digest of the members' ids: a batch sent again is the
    same message, and it is a valid job id on every transport (no ``:``, not integer-like)."""
    ids = hashlib.sha256("\n".join(mid for mid, _ in members).encode()).hexdigest()[:32]
    return f"batch-{ids}", b"".join((_BATCH_HEAD, b",".join(b for _, b in members), b"]}"))


def _decode(body: bytes) -> Any:
    if len(body) > MAX_OUTCOME_BYTES:
        raise MalformedOutcome(f"outcome of {len(body)} bytes exceeds {MAX_OUTCOME_BYTES}")
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedOutcome(f"not JSON: {exc}") from None


def parse_outcome(body: bytes) -> tuple[Event, dict[str, Any]]:
    """Parse one outcome delivery; raises :class:`MalformedOutcome` with the reason."""
    return outcome_event(_decode(body))


def parse_delivery(body: bytes) -> tuple[bool, list[tuple[Any, Event | MalformedOutcome]]]:
    """Whether ``body`` is a batch, and the outcomes it carries in order: each decoded envelope
    with its event, or, for a batch's member, why it is not an outcome. Raises
    :class:`MalformedOutcome` when the delivery as a whole cannot be read (a single outcome that
    is not one, or a batch without members)."""
    doc = _decode(body)
    if not isinstance(doc, dict) or doc.get("messageType") != BATCH_TYPE:
        return False, [(doc, outcome_event(doc)[0])]
    members = doc.get("outcomes")
    if not isinstance(members, list) or not members:
        raise MalformedOutcome("field 'outcomes' of a batch must be a non-empty array")
    parsed: list[tuple[Any, Event | MalformedOutcome]] = []
    for i, member in enumerate(members):
        try:
            if isinstance(member, dict) and member.get("messageType") == BATCH_TYPE:
                raise MalformedOutcome("a batch inside a batch")
            parsed.append((member, outcome_event(member)[0]))
        except MalformedOutcome as exc:
            parsed.append((member, MalformedOutcome(f"batch member {i}: {exc}")))
    return True, parsed


def outcome_event(doc: Any) -> tuple[Event, dict[str, Any]]:
    """The event one decoded outcome envelope reports; raises :class:`MalformedOutcome`."""
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


def _text(doc: Any) -> bytes:
    """A batch member as quarantined: any decoded JSON (``canonical_json`` refuses NaN, which
    ``json.loads`` lets through, and a record must never fail to be written)."""
    return json.dumps(doc, ensure_ascii=False).encode()


class Intake:
    def __init__(
        self,
        transport: Transport,
        deliver: Callable[[Event, Delivery | None], Awaitable[bool | None]],
        *,
        queue: str = OUTCOMES_QUEUE,
        hold: Hold | None = None,
    ) -> None:
        self._transport, self._deliver, self.queue = transport, deliver, queue
        self._hold = hold or Hold()
        self.quarantined: list[dict[str, Any]] = []
        self.processed = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._busy = 0

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def process(self, delivery: Delivery) -> list[Event | None]:
        """Turn one delivery into committed events (one, or a batch's members in order) or
        quarantine what cannot be; then acknowledge it. One entry per outcome: its event, or
        ``None`` where it was quarantined."""
        try:
            batch, members = parse_delivery(delivery.body)
        except MalformedOutcome as exc:
            await self._quarantine(delivery, str(exc))
            return [None]
        if batch:
            # each member starts in order, so a run's members reach the engine in order
            events = await asyncio.gather(
                *(self._member(delivery, i, doc, got) for i, (doc, got) in enumerate(members))
            )
            await self._transport.ack(delivery)
            return list(events)
        event = members[0][1]
        assert not isinstance(event, MalformedOutcome)  # a lone outcome that is not one raises
        taken = await self._deliver(event, delivery)
        if taken is None:
            await self._quarantine(delivery, f"no run {event.run_id!r}")
            return [None]
        if not taken:  # not settled by the commit itself (see accord.engine.joint)
            await self._transport.ack(delivery)
        self.processed += 1
        return [event]

    async def _member(
        self, delivery: Delivery, index: int, doc: Any, got: Event | MalformedOutcome
    ) -> Event | None:
        """One member of a batch: committed (never settled by its commit: the batch is
        acknowledged as a whole), or quarantined on its own."""
        if isinstance(got, MalformedOutcome):
            ident = doc.get("messageId") if isinstance(doc, dict) else None
            name = ident if isinstance(ident, str) and ident else f"{delivery.message_id}#{index}"
            await self._record(delivery, name, str(got), _text(doc))
            return None
        if await self._deliver(got, None) is None:
            why = f"no run {got.run_id!r}"
            await self._record(delivery, str(doc["messageId"]), why, _text(doc))
            return None
        self.processed += 1
        return got

    async def _quarantine(self, delivery: Delivery, reason: str) -> None:
        await self._record(delivery, delivery.message_id, reason, delivery.body)
        await self._transport.ack(delivery)

    async def _record(self, delivery: Delivery, message_id: str, reason: str, body: bytes) -> None:
        """Keep what intake could not take on ``<queue>.quarantine``, with its reason."""
        record = {
            "queue": delivery.queue,
            "message_id": message_id,
            "reason": reason,
            "body": body.decode("utf-8", errors="replace")[:65_536],
        }
        log.warning("quarantined outcome %s: %s", message_id, reason)
        qid = f"quarantine:{message_id}"
        await self._transport.publish(f"{self.queue}.quarantine", qid, canonical_json(record))
        self.quarantined.append(record)

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
            await self._hold.run(lambda: self.process(delivery), "outcome %s", delivery.message_id)
        except Exception:  # not acknowledged: the transport redelivers it
            log.exception("outcome %s not processed", delivery.message_id)
            with contextlib.suppress(Exception):
                await self._transport.nack(delivery, 100)
        finally:
            slots.release()
            self._busy -= 1
            if self._busy == 0:
                self._idle.set()
