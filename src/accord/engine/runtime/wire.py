"""The outcome envelope on the wire: what a worker sends the engine, built and read in one place.

An outcome envelope names the attempt it reports on and what happened::

    {"messageId": "...", "messageType": "accepted" | "heartbeat" | "progress" | "succeeded"
                                       | "failed",
     "runId": "...", "stage": "...", "attempt": 1, "fence": "...", "tenant": "...",
     "workerId": "...", "payload": {...}}

``succeeded`` carries the result as ``payload``; ``failed`` carries ``{code, message,
retryable}``; ``progress`` carries ``{percent, message}``; ``accepted`` names the worker
(``workerId``). An outcome's id derives from the id of the job it answers
(:func:`outcome_id`), so a redelivered job yields the same ids. The worker SDK builds envelopes
with :func:`encode_outcome`; intake reads them with :func:`parse_delivery` / :func:`outcome_event`.

**Batches.** Several outcomes may travel as one message (:func:`encode_batch`)::

    {"messageType": "batch", "outcomes": [<outcome envelope>, ...]}

**Quarantine records.** What a reader cannot take (a poison job at a worker, an unreadable
outcome at intake) is kept on ``<queue>.quarantine`` as ``{queue, message_id, reason, body}``
(:func:`quarantine_record`, the body cut to 64 KiB of text), under the id
``quarantine:<message_id>``. Workers before this module wrote ``messageId`` there;
:func:`read_quarantine` reads both.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from accord.canonical import canonical_json
from accord.engine.machine.events import (
    Event,
    HeartbeatReceived,
    ProgressReported,
    StageAccepted,
    StageFailed,
    StageSucceeded,
)

__all__ = [
    "ATTEMPT",
    "BATCH_TYPE",
    "FENCE",
    "MAX_OUTCOME_BYTES",
    "MESSAGE_ID",
    "MESSAGE_TYPE",
    "OUTCOMES",
    "PAYLOAD",
    "RUN_ID",
    "STAGE",
    "TENANT",
    "WORKER_ID",
    "MalformedOutcome",
    "encode_batch",
    "encode_outcome",
    "outcome_event",
    "outcome_id",
    "outcome_message_id",
    "parse_delivery",
    "parse_outcome",
    "quarantine_message",
    "quarantine_queue",
    "quarantine_record",
    "read_quarantine",
]

# the envelope's field names
MESSAGE_ID = "messageId"
MESSAGE_TYPE = "messageType"
RUN_ID = "runId"
STAGE = "stage"
ATTEMPT = "attempt"
FENCE = "fence"
TENANT = "tenant"
WORKER_ID = "workerId"
PAYLOAD = "payload"
OUTCOMES = "outcomes"  # a batch's members

BATCH_TYPE = "batch"
MAX_OUTCOME_BYTES = 1_048_576  # one outcome, and one batch of them
QUARANTINE_BODY_CHARS = 65_536
_BATCH_HEAD = f'{{"{MESSAGE_TYPE}":"{BATCH_TYPE}","{OUTCOMES}":['.encode()


class MalformedOutcome(ValueError):
    """The delivery is not an outcome envelope; ``str()`` is the reason recorded."""


# -- building ---------------------------------------------------------------------------------


def outcome_id(job_message_id: str, kind: str, seq: int = 0) -> str:
    """The id of the ``kind`` outcome answering a job (``seq`` numbers heartbeats, progress)."""
    return f"{job_message_id}:{kind}" + (f":{seq}" if seq else "")


def encode_outcome(
    message_id: str,
    kind: str,
    *,
    run_id: str,
    stage: str,
    attempt: int,
    fence: str,
    tenant: str = "",
    payload: Mapping[str, Any] | None = None,
    worker_id: str | None = None,
    **extra: Any,
) -> bytes:
    """The canonical body of one outcome envelope (``extra``: further top-level fields)."""
    doc: dict[str, Any] = {
        MESSAGE_ID: message_id,
        MESSAGE_TYPE: kind,
        RUN_ID: run_id,
        STAGE: stage,
        ATTEMPT: attempt,
        FENCE: fence,
        TENANT: tenant,
        PAYLOAD: dict(payload or {}),
    }
    if worker_id is not None:
        doc[WORKER_ID] = worker_id
    doc.update(extra)
    return canonical_json(doc)


def outcome_message_id(body: bytes) -> str:
    """The id of an outcome envelope already built (a recorded answer sent again)."""
    return str(json.loads(body)[MESSAGE_ID])


def encode_batch(members: Sequence[tuple[str, bytes]]) -> tuple[str, bytes]:
    """The message id and body of one batch of outcome envelopes (``(message_id, body)`` pairs,
    each body a JSON object). The id is a digest of the members' ids: a batch sent again is the
    same message, and it is a valid job id on every transport (no ``:``, not integer-like)."""
    ids = hashlib.sha256("\n".join(mid for mid, _ in members).encode()).hexdigest()[:32]
    return f"batch-{ids}", b"".join((_BATCH_HEAD, b",".join(b for _, b in members), b"]}"))


# -- reading ----------------------------------------------------------------------------------


def _field(doc: Mapping[str, Any], key: str, kind: type) -> Any:
    value = doc.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise MalformedOutcome(f"field {key!r} must be {kind.__name__}")
    return value


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
    if not isinstance(doc, dict) or doc.get(MESSAGE_TYPE) != BATCH_TYPE:
        return False, [(doc, outcome_event(doc)[0])]
    members = doc.get(OUTCOMES)
    if not isinstance(members, list) or not members:
        raise MalformedOutcome(f"field {OUTCOMES!r} of a batch must be a non-empty array")
    parsed: list[tuple[Any, Event | MalformedOutcome]] = []
    for i, member in enumerate(members):
        try:
            if isinstance(member, dict) and member.get(MESSAGE_TYPE) == BATCH_TYPE:
                raise MalformedOutcome("a batch inside a batch")
            parsed.append((member, outcome_event(member)[0]))
        except MalformedOutcome as exc:
            parsed.append((member, MalformedOutcome(f"batch member {i}: {exc}")))
    return True, parsed


def outcome_event(doc: Any) -> tuple[Event, dict[str, Any]]:
    """The event one decoded outcome envelope reports; raises :class:`MalformedOutcome`."""
    if not isinstance(doc, dict):
        raise MalformedOutcome("outcome must be a JSON object")
    kind = _field(doc, MESSAGE_TYPE, str)
    ident: dict[str, Any] = {
        "run_id": _field(doc, RUN_ID, str),
        "stage": _field(doc, STAGE, str),
        "attempt": _field(doc, ATTEMPT, int),
        "message_id": _field(doc, MESSAGE_ID, str),
    }
    fence = doc.get(FENCE)
    if not isinstance(fence, str | int) or isinstance(fence, bool):
        raise MalformedOutcome(f"field {FENCE!r} must be str")
    ident["fence"] = str(fence)
    payload = doc.get(PAYLOAD, {})
    if not isinstance(payload, dict):
        raise MalformedOutcome(f"field {PAYLOAD!r} must be object")
    event: Event
    if kind == "accepted":
        event = StageAccepted(**ident, worker_id=str(doc.get(WORKER_ID, "")))
    elif kind == "heartbeat":
        event = HeartbeatReceived(**ident)
    elif kind == "progress":
        percent = payload.get("percent", 0)
        if not isinstance(percent, int | float) or isinstance(percent, bool):
            raise MalformedOutcome(f"field '{PAYLOAD}.percent' must be number")
        note = str(payload.get("message", ""))
        event = ProgressReported(**ident, progress=float(percent) / 100.0, note=note)
    elif kind == "succeeded":
        event = StageSucceeded(**ident, result=payload)
    elif kind == "failed":
        retryable = payload.get("retryable", False)
        if not isinstance(retryable, bool):
            raise MalformedOutcome(f"field '{PAYLOAD}.retryable' must be bool")
        event = StageFailed(
            **ident,
            retryable=retryable,
            code=str(payload.get("code", "failed")),
            message=str(payload.get("message", "")),
        )
    else:
        raise MalformedOutcome(f"unknown {MESSAGE_TYPE} {kind!r}")
    return event, doc


# -- quarantine records -----------------------------------------------------------------------


def quarantine_queue(queue: str) -> str:
    """Where what cannot be read from ``queue`` is kept."""
    return f"{queue}.quarantine"


def quarantine_record(queue: str, message_id: str, reason: str, body: bytes) -> dict[str, Any]:
    """The record of a message that could not be taken from ``queue``, with its reason."""
    text = body.decode("utf-8", errors="replace")[:QUARANTINE_BODY_CHARS]
    return {"queue": queue, "message_id": message_id, "reason": reason, "body": text}


def quarantine_message(record: Mapping[str, Any]) -> tuple[str, bytes]:
    """``(message id, body)`` of a quarantine record as published."""
    return f"quarantine:{record['message_id']}", canonical_json(dict(record))


def read_quarantine(body: bytes) -> dict[str, Any]:
    """A published quarantine record, ``message_id`` filled from a legacy ``messageId``."""
    record = dict(json.loads(body))
    if "message_id" not in record and MESSAGE_ID in record:
        record["message_id"] = record.pop(MESSAGE_ID)
    return record
