"""Outcome intake: worker outcome envelopes from the transport become events.

An outcome envelope names the attempt it reports on and what happened; its fields, and how one is
built and read, are defined once in :mod:`accord.engine.runtime.wire`, which the worker SDK
builds them with too. The machine, not intake, decides whether the attempt still counts (fencing,
I3). Intake acknowledges a delivery only after the event is committed, so a crash in between
redelivers it, and a redelivered outcome is a duplicate the machine records without a second
release (I2).

A delivery intake cannot read is never dropped silently: it is quarantined with its reason on
``<queue>.quarantine`` (and counted) and then acknowledged (the record:
:func:`~accord.engine.runtime.wire.quarantine_record`). Results are checked against their
contracts by the engine's result hooks (:mod:`accord.engine.runtime.checks`), where the plan is
known. ``deliver(event, delivery)`` answers ``None`` when no run took the event (an outcome for a
run that does not exist is quarantined too), ``True`` when its commit also acknowledged the delivery
(the queue shares the store's database), else ``False`` and intake acknowledges it.

**Batches.** A worker with several outcomes ready at once may send them as one message (fewer
broker messages, confirms and acknowledgements per run; see :mod:`accord.worker.batching`)::

    {"messageType": "batch", "outcomes": [<outcome envelope>, ...]}

Each member is taken exactly as if it had come alone, in order (members for one run are applied
in the order listed). The batch is acknowledged once every member is committed or quarantined; a
member that cannot be committed leaves the whole batch unacknowledged, and its redelivery makes
the members already committed duplicates, which the machine records without a second release.
A malformed member is quarantined on its own (its id, or the batch's with ``#<index>``) and the
others go on; so is a member the engine refuses (:class:`RefusedOutcome`). A member's record names
the delivery it came in and its index, and its id carries a digest of both (and the receipt), so
two deliveries whose bad members share a ``messageId`` are two records. The batch's id is derived
from its members' ids (:func:`encode_batch`).

**Refused outcomes.** ``deliver`` raises :class:`RefusedOutcome` for an outcome the engine will not
take: one naming another tenant than its run's (whatever its fence), one that cannot be stored,
one refused past the per-attempt bound of recorded refusals. It is quarantined alone, never
nacked: what can never commit must not spend its delivery budget and be dead-lettered, and must
not take the outcomes that shared its commit with it. The envelope's fields are checked before any
of this (:func:`~accord.engine.runtime.wire.outcome_event`: ids, finite numbers, text encodable as
UTF-8, sizes).

**Claim-checked results.** A ``succeeded`` outcome whose result was above the claim threshold
carries ``{"payloadRef": {digest, objectKey, sizeBytes}}`` (the worker checked it in,
:func:`accord.objects.claims.check_in_result`). Intake reads it back from :attr:`Intake.claims`
(the engine's claim store, ``Engine(claims=…)``), off the event loop, before the engine sees the
event, so result hooks, history and the run record hold the result itself. A reference that fails
its check — altered, truncated or missing bytes, another tenant's key — becomes the attempt's
terminal failure (``corrupt-payload``, ``storage-ref-denied``), recorded in the run's history like
any other; with no claim store it is the terminal ``payload-ref-unsupported``. A store that does
not answer leaves the delivery unacknowledged (its redelivery reads it again).

**The store unavailable.** A delivery whose commit meets a retryable
:class:`~accord.errors.StoreError` is held and processed again in place for up to 10 s
(:mod:`accord.engine.runtime.holding`) before it is nacked. Nacking at once would spend the
delivery's budget in a second or so of outage, and past the queue's delivery limit a good outcome
would be dead-lettered. While deliveries are held their prefetch slots stay taken, so intake takes
nothing new until the store answers again. A pass whose commit landed but whose answer was lost is a
duplicate on the next pass.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from accord.engine.machine.events import Event, StageFailed, StageSucceeded
from accord.engine.ports import Delivery, Transport
from accord.engine.runtime.consumer import GiveBack, QueueConsumer
from accord.engine.runtime.holding import Hold
from accord.engine.runtime.wire import (
    BATCH_TYPE,
    MAX_OUTCOME_BYTES,
    MESSAGE_ID,
    TENANT,
    MalformedOutcome,
    encode_batch,
    outcome_event,
    parse_delivery,
    parse_outcome,
    quarantine_message,
    quarantine_queue,
    quarantine_record,
)
from accord.errors import StageFailed as Refusal
from accord.objects.claims import check_out_result
from accord.objects.ports import ObjectStore

__all__ = [
    "BATCH_TYPE",
    "MAX_OUTCOME_BYTES",
    "OUTCOMES_QUEUE",
    "Intake",
    "MalformedOutcome",
    "RefusedOutcome",
    "encode_batch",
    "outcome_event",
    "parse_delivery",
    "parse_outcome",
]  # the envelope's names are re-exported from accord.engine.runtime.wire

OUTCOMES_QUEUE = "accord.outcomes"

log = logging.getLogger("accord.engine.runtime.intake")


class RefusedOutcome(Exception):
    """The engine will not take this outcome (it names another tenant than its run, or it cannot
    be stored); ``str()`` is the reason it is quarantined with. Raised by ``deliver``."""


def _tenant(doc: Any) -> str:
    """The tenant an outcome names (``""``: none, as from workers that do not send one)."""
    tenant = doc.get(TENANT, "") if isinstance(doc, dict) else ""
    return tenant if isinstance(tenant, str) else ""


def _text(doc: Any) -> bytes:
    """A batch member as quarantined: any decoded JSON (``canonical_json`` refuses NaN, which
    ``json.loads`` lets through, and a record must never fail to be written)."""
    return json.dumps(doc, ensure_ascii=False).encode("utf-8", "backslashreplace")


def _safe(text: str, limit: int = 512) -> str:
    """Text a record can always hold: a lone surrogate written as its escape, cut to ``limit``."""
    return text[:limit].encode("utf-8", "backslashreplace").decode("utf-8")


class Intake(QueueConsumer):
    what = "outcome"

    def __init__(
        self,
        transport: Transport,
        deliver: Callable[[Event, Delivery | None, str], Awaitable[bool | None]],
        *,
        queue: str = OUTCOMES_QUEUE,
        hold: Hold | None = None,
    ) -> None:
        super().__init__(transport, queue, hold)
        self._deliver = deliver
        self.processed = 0
        self.forwarded = 0  # outcomes passed on to their shard's owner (see route)
        # run id -> the queue of the engine that owns its shard, or None: taken here
        self.route: Callable[[str], str | None] | None = None
        # where claim-checked results are read back: the engine's claim store (Engine(claims=…))
        self.claims: ObjectStore | None = None

    async def _checked_out(self, event: Event, tenant: str) -> Event:
        """A succeeded event whose result is ``{"payloadRef": …}`` with the verified result in
        its place, or the attempt's terminal failure when the reference does not check out."""
        if not isinstance(event, StageSucceeded) or set(event.result) != {"payloadRef"}:
            return event

        def refused(code: str, message: str) -> StageFailed:
            return StageFailed(
                run_id=event.run_id, stage=event.stage, attempt=event.attempt, fence=event.fence,
                message_id=event.message_id, retryable=False, code=code, message=message[:2000],
            )  # fmt: skip

        store = self.claims
        if store is None:
            return refused(
                "payload-ref-unsupported",
                "result.payloadRef: the result was checked in to an object store and this "
                "engine has none for claims (--claims URL)",
            )
        try:
            result = await asyncio.to_thread(check_out_result, event.result, store, tenant)
        except Refusal as exc:
            if exc.retryable:  # the store did not answer: redelivered, read again
                raise
            log.warning("result of %s/%s refused: %s", event.run_id, event.stage, exc.reason)
            return refused(exc.failure_code, f"result.payloadRef: {exc.reason}")
        return dataclasses.replace(event, result=result)

    async def process(self, delivery: Delivery) -> list[Event | None]:
        """Turn one delivery into committed events (one, or a batch's members in order) or
        quarantine what cannot be; then acknowledge it. One entry per outcome: its event, or
        ``None`` where it was quarantined."""
        try:
            batch, members = parse_delivery(delivery.body)
        except MalformedOutcome as exc:
            await self._quarantine(delivery, str(exc))
            return [None]
        if self.route is not None and await self._forwarded(delivery, batch, members):
            return []
        if batch:
            # each member starts in order, so a run's members reach the engine in order
            events = await asyncio.gather(
                *(self._member(delivery, i, doc, got) for i, (doc, got) in enumerate(members))
            )
            await self._transport.ack(delivery)
            return list(events)
        doc, event = members[0]
        assert not isinstance(event, MalformedOutcome)  # a lone outcome that is not one raises
        event = await self._checked_out(event, _tenant(doc))
        try:
            taken = await self._deliver(event, delivery, _tenant(doc))
        except RefusedOutcome as exc:
            await self._quarantine(delivery, str(exc))
            return [None]
        if taken is None:
            await self._quarantine(delivery, f"no run {event.run_id!r}")
            return [None]
        if not taken:  # not settled by the commit itself (see accord.engine.runtime.joint)
            await self._transport.ack(delivery)
        self.processed += 1
        return [event]

    async def _forwarded(
        self, delivery: Delivery, batch: bool, members: list[tuple[Any, Event | MalformedOutcome]]
    ) -> bool:
        """Pass what belongs to another shard owner on to its queue (same message id, so a
        forward made twice is one message where the broker deduplicates, a duplicate refused by
        the owner where it does not); True when nothing is left to take here. A batch's members
        are forwarded one by one, as single outcomes; the rest of the batch is taken here. What
        names this very queue is given back (:class:`GiveBack`): its owner changed, and the
        broker hands it to the consumer that reads the queue now."""
        route = self.route
        assert route is not None
        targets = [
            None if isinstance(got, MalformedOutcome) else route(got.run_id) for _, got in members
        ]
        if all(t is None for t in targets):
            return False
        if any(t == delivery.queue for t in targets):
            raise GiveBack(f"an outcome on {delivery.queue} whose shard this engine gave up")
        if not batch:
            target = targets[0]
            assert target is not None
            await self._transport.publish(target, delivery.message_id, delivery.body)
            await self._transport.ack(delivery)
            self.forwarded += 1
            return True
        kept: list[tuple[Any, Event | MalformedOutcome]] = []
        for (doc, got), target in zip(members, targets, strict=True):
            if target is None:
                kept.append((doc, got))
                continue
            await self._transport.publish(target, str(doc[MESSAGE_ID]), _text(doc))
            self.forwarded += 1
        members[:] = kept  # what stays, in order
        if not members:
            await self._transport.ack(delivery)
            return True
        return False

    async def _member(
        self, delivery: Delivery, index: int, doc: Any, got: Event | MalformedOutcome
    ) -> Event | None:
        """One member of a batch: committed (never settled by its commit: the batch is
        acknowledged as a whole), or quarantined on its own."""
        if isinstance(got, MalformedOutcome):
            ident = doc.get(MESSAGE_ID) if isinstance(doc, dict) else None
            name = ident if isinstance(ident, str) and ident else f"{delivery.message_id}#{index}"
            await self._record(delivery, name, str(got), _text(doc), index)
            return None
        got = await self._checked_out(got, _tenant(doc))
        try:
            taken = await self._deliver(got, None, _tenant(doc))
        except RefusedOutcome as exc:  # judged on its own: the other members go on
            await self._record(delivery, str(doc[MESSAGE_ID]), str(exc), _text(doc), index)
            return None
        if taken is None:
            why = f"no run {got.run_id!r}"
            await self._record(delivery, str(doc[MESSAGE_ID]), why, _text(doc), index)
            return None
        self.processed += 1
        return got

    async def _quarantine(self, delivery: Delivery, reason: str) -> None:
        await self._record(delivery, delivery.message_id, reason, delivery.body)
        await self._transport.ack(delivery)

    async def _record(
        self, delivery: Delivery, message_id: str, reason: str, body: bytes, index: int = -1
    ) -> None:
        """Keep what intake could not take on ``<queue>.quarantine``, with its reason.

        A batch member's record names the delivery it came in and its place there, and so does
        its id (a digest of the delivery's id, receipt and the member's index): two deliveries
        whose bad members share a ``messageId`` are two records, never one deduplicated away by
        the queue. A whole delivery's record is ``quarantine:<its message id>``."""
        message_id, reason = _safe(message_id), _safe(reason, 4096)
        record = quarantine_record(delivery.queue, message_id, reason, body, self.contracts)
        qid, text = quarantine_message(record)
        if index >= 0:
            record["delivery"], record["member"] = _safe(delivery.message_id), index
            seen = "\0".join((delivery.queue, delivery.message_id, delivery.receipt, str(index)))
            where = hashlib.sha256(seen.encode("utf-8", "backslashreplace")).hexdigest()[:16]
            qid, text = f"{qid}@{where}", quarantine_message(record)[1]
        log.warning("quarantined outcome %s: %s", message_id, reason)
        await self._transport.publish(quarantine_queue(self.queue), qid, text)
        self.quarantined.append(record)
