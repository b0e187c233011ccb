"""The outcome envelope on the wire: what a worker sends the engine, built and read in one place.

An outcome is an ``outcome@1`` message (``schemas/contracts/outcome.v1.yaml``): it names the
attempt it reports on and what happened::

    {"messageId": "...", "messageType": "accepted" | "heartbeat" | "progress" | "succeeded"
                                       | "failed",
     "contractVersion": 1, "correlationId": "<run id>", "causationId": "<job message id>",
     "producer": "<worker id>", "occurredAt": "2026-01-01T00:00:00.000Z",
     "runId": "...", "stage": "...", "attempt": 1, "fence": "...", "tenant": "...",
     "workerId": "...", "payload": {...}}

The payload's contract follows from ``messageType``: ``stage-accepted`` (empty; ``workerId``
names the worker), ``stage-heartbeat`` (``{at}``), ``progress`` (``{percent, message}``),
``stage-failed`` (``{code, message, retryable}``), and for ``succeeded`` the stage's result
contract, ``contractVersion`` being the job's ``resultSchemaVersion``. An outcome's id derives
from the id of the job it answers (:func:`outcome_id`), so a redelivered job yields the same ids.
Both sides go through the generated bindings (``accord.generated``), never a field list of their
own: the worker SDK builds envelopes with :func:`encode_outcome` (``OutcomeV1`` and the payload
model), and intake reads them with :func:`parse_delivery` / :func:`outcome_event` through the
same models, refusing (quarantining) an envelope or a payload that breaks its contract. Outcomes
written before the contract (no ``contractVersion``, ``correlationId``, ``causationId``,
``producer`` or ``occurredAt``) are put in the contract's shape first and read the same way, for
as long as such messages may still be queued.

**Batches.** Several outcomes may travel as one ``outcome-batch@1`` message (:func:`encode_batch`)::

    {"messageType": "batch", "outcomes": [<outcome envelope>, ...]}

**Quarantine records.** What a reader cannot take (a poison job at a worker, an unreadable
outcome at intake) is kept on ``<queue>.quarantine`` as ``{queue, message_id, reason, body}``
(:func:`quarantine_record`, the body cut to 4 KiB of text), under the id
``quarantine:<message_id>``: a record for operators, documented in the outcome contract's
comments rather than a contract (its member names predate the contract grammar). Workers before
this module wrote ``messageId`` there; :func:`read_quarantine` reads both.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from array import array
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import accumulate
from typing import Any

from pydantic import BaseModel
from pydantic import ValidationError as ModelError

from accord.canonical import canonical_json
from accord.contracts.model import MessageContract
from accord.contracts.redact import redact_quarantine_record
from accord.engine.machine.events import (
    Event,
    HeartbeatReceived,
    ProgressReported,
    StageAccepted,
    StageFailed,
    StageSucceeded,
)
from accord.engine.machine.ids import iso_ms
from accord.generated.outcome_v1 import OutcomeV1
from accord.generated.progress_v1 import ProgressV1
from accord.generated.stage_accepted_v1 import StageAcceptedV1
from accord.generated.stage_failed_v1 import StageFailedV1
from accord.generated.stage_heartbeat_v1 import StageHeartbeatV1

__all__ = [
    "ATTEMPT",
    "BATCH_TYPE",
    "CAUSATION_ID",
    "CONTRACT_VERSION",
    "CORRELATION_ID",
    "DEFAULT_PRODUCER",
    "FENCE",
    "MAX_JSON_DEPTH",
    "MAX_OUTCOME_BYTES",
    "MESSAGE_ID",
    "MESSAGE_TYPE",
    "OCCURRED_AT",
    "OUTCOMES",
    "PAYLOAD",
    "PAYLOAD_MODELS",
    "PRODUCER",
    "RUN_ID",
    "STAGE",
    "TENANT",
    "WORKER_ID",
    "InvalidOutcome",
    "MalformedOutcome",
    "UndecodableJson",
    "decode_json",
    "encode_batch",
    "encode_outcome",
    "job_id_of",
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
CONTRACT_VERSION = "contractVersion"
CORRELATION_ID = "correlationId"
CAUSATION_ID = "causationId"
PRODUCER = "producer"
OCCURRED_AT = "occurredAt"
DEFAULT_PRODUCER = "accord-worker"  # an outcome's producer when no worker id is given

BATCH_TYPE = "batch"
MAX_OUTCOME_BYTES = 1_048_576  # one outcome, and one batch of them
QUARANTINE_BODY_CHARS = 4_096  # a record says what came, it is no archive of payloads
_BATCH_HEAD = f'{{"{MESSAGE_TYPE}":"{BATCH_TYPE}","{OUTCOMES}":['.encode()


MAX_JSON_DEPTH = 256  # nesting a delivery's JSON may have: well below Python's recursion limit
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_NESTING = bytes(b for b in range(256) if b not in b"[]{}")
_NESTING_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 and -1 as signed bytes


class MalformedOutcome(ValueError):
    """The delivery is not an outcome envelope; ``str()`` is the reason recorded."""


class InvalidOutcome(ValueError):
    """An outcome a builder was asked for breaks its contract; ``str()`` names the field."""


def _deeper(raw: bytes, max_depth: int) -> bool:
    """Whether ``raw`` nests brackets deeper than ``max_depth`` outside its strings (the running
    sum of +1 per opening and -1 per closing bracket, all in C)."""
    steps = array("b", _JSON_STRING.sub(b"", raw).translate(_NESTING_STEP, _NOT_NESTING))
    return max(accumulate(steps), default=0) > max_depth


class UndecodableJson(ValueError):
    """A delivery's body is not JSON a reader can take: not UTF-8, not JSON, larger than its
    bound or nested deeper than :data:`MAX_JSON_DEPTH`. ``str()`` is the quarantine reason."""


def decode_json(
    body: bytes | str, *, max_bytes: int | None = None, max_depth: int = MAX_JSON_DEPTH
) -> Any:
    """The JSON value of a delivery's body, bounded in size and in nesting depth (checked before
    decoding, so no body makes the decoder recurse without end); raises
    :class:`UndecodableJson` with the reason. Every reader of a delivery decodes with this."""
    raw = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else bytes(body)
    if max_bytes is not None and len(raw) > max_bytes:
        raise UndecodableJson(f"{len(raw)} bytes exceed the limit of {max_bytes}")
    if raw.count(b"[") + raw.count(b"{") > max_depth and _deeper(raw, max_depth):
        raise UndecodableJson(f"not JSON: nested deeper than {max_depth} levels")
    try:
        return json.loads(raw)
    except RecursionError:  # not reached after the check above; never escapes as a crash
        raise UndecodableJson(f"not JSON: nested deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise UndecodableJson(f"not JSON: {exc}") from None


# -- building ---------------------------------------------------------------------------------


def outcome_id(job_message_id: str, kind: str, seq: int = 0) -> str:
    """The id of the ``kind`` outcome answering a job (``seq`` numbers heartbeats, progress)."""
    return f"{job_message_id}:{kind}" + (f":{seq}" if seq else "")


def job_id_of(message_id: str, kind: str) -> str:
    """The id of the job an outcome's id answers (the inverse of :func:`outcome_id`); the id
    itself when it does not follow the rule."""
    head, _, tail = message_id.rpartition(":")
    if tail.isdigit() and head.endswith(f":{kind}"):
        message_id = head
    suffix = f":{kind}"
    return message_id[: -len(suffix)] if message_id.endswith(suffix) else message_id


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
    contract_version: int = 1,
    causation_id: str | None = None,
    producer: str | None = None,
    occurred_at_ms: int | None = None,
) -> bytes:
    """The canonical body of one ``outcome@1`` envelope, built through the generated bindings
    (``OutcomeV1`` and the payload model ``kind`` selects), so that nothing the builder writes can
    break the contract intake reads it with; raises :class:`InvalidOutcome` naming the field
    otherwise.

    ``contract_version`` is the payload contract's version (for ``succeeded``, the job's
    ``resultSchemaVersion``: the stage's result contract, checked by the worker against the
    catalogue before it answers); ``causation_id`` defaults to the job id ``message_id``
    answers, ``producer`` to ``worker_id`` (else :data:`DEFAULT_PRODUCER`), the time to now."""
    at_ms = int(time.time() * 1000) if occurred_at_ms is None else occurred_at_ms
    doc: dict[str, Any] = {
        MESSAGE_ID: message_id,
        MESSAGE_TYPE: kind,
        CONTRACT_VERSION: contract_version,
        CORRELATION_ID: run_id,
        CAUSATION_ID: causation_id or job_id_of(message_id, kind),
        PRODUCER: producer or worker_id or DEFAULT_PRODUCER,
        OCCURRED_AT: iso_ms(at_ms),
        RUN_ID: run_id,
        STAGE: stage,
        ATTEMPT: attempt,
        FENCE: fence,
        TENANT: tenant,
        PAYLOAD: dict(payload or {}),
    }
    if worker_id is not None:
        doc[WORKER_ID] = worker_id
    ref = "outcome@1"
    try:  # the bindings check the document as it will be written, which is then written as is
        if kind != "succeeded":
            ref, model = _payload_model(kind, contract_version)
            model.model_validate(doc[PAYLOAD])
            ref = "outcome@1"
        OutcomeV1.model_validate(doc)
    except (ModelError, MalformedOutcome) as exc:
        reason = _model_reason(ref, exc) if isinstance(exc, ModelError) else str(exc)
        raise InvalidOutcome(f"cannot build a {kind!r} outcome: {reason}") from None
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


# -- validation: nothing that reaches the machine may fail to be stored ------------------------

MAX_ID_CHARS = 512  # message, run, stage, worker ids, fences and tenants
MAX_TEXT_CHARS = 16_384  # a failure's code and message, a progress note
MAX_ATTEMPT = 2**31 - 1
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _storable_text(value: str, where: str, limit: int) -> str:
    """``value`` if it can be stored: within ``limit`` characters and encodable as UTF-8 (a lone
    surrogate such as ``"\\ud800"``, which ``json.loads`` lets through, is not)."""
    if len(value) > limit:
        raise MalformedOutcome(f"field {where!r} is longer than {limit} characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise MalformedOutcome(f"field {where!r} is not valid UTF-8 (a lone surrogate)") from None
    return value


def _ident(value: str, where: str) -> str:
    """An id: storable text of at most :data:`MAX_ID_CHARS`, without control characters."""
    _storable_text(value, where, MAX_ID_CHARS)
    if _CONTROL.search(value):
        raise MalformedOutcome(f"field {where!r} holds a control character")
    return value


def check_storable(value: Any, where: str) -> None:
    """Raise :class:`MalformedOutcome` naming the first part of ``value`` that canonical JSON
    cannot store: NaN or an infinity, a string or key that is not valid UTF-8, a non-string key,
    a value JSON has no type for. Walks iteratively, so deep nesting cannot exhaust the stack."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, at = stack.pop()
        if item is None or isinstance(item, bool | int):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise MalformedOutcome(f"field {at!r} is {item!r}: numbers must be finite")
        elif isinstance(item, str):
            _storable_text(item, at, MAX_OUTCOME_BYTES)
        elif isinstance(item, dict):
            for key, sub in item.items():
                if not isinstance(key, str):
                    raise MalformedOutcome(f"field {at!r} has a key that is not a string")
                _storable_text(key, f"{at}.<key>", MAX_OUTCOME_BYTES)
                stack.append((sub, f"{at}.{key}"))
        elif isinstance(item, list | tuple):
            stack.extend((sub, f"{at}[{i}]") for i, sub in enumerate(item))
        else:
            raise MalformedOutcome(f"field {at!r} is not JSON ({type(item).__name__})")


def _decode(body: bytes) -> Any:
    if len(body) > MAX_OUTCOME_BYTES:
        raise MalformedOutcome(f"outcome of {len(body)} bytes exceeds {MAX_OUTCOME_BYTES}")
    try:
        return decode_json(body)
    except UndecodableJson as exc:
        raise MalformedOutcome(str(exc)) from None


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


# the payload contract each outcome kind selects, by contractVersion (succeeded: the stage's
# result contract, which the engine's result checks apply with the plan at hand)
PAYLOAD_MODELS: dict[tuple[str, int], tuple[str, type[BaseModel]]] = {
    ("accepted", 1): ("stage-accepted@1", StageAcceptedV1),
    ("heartbeat", 1): ("stage-heartbeat@1", StageHeartbeatV1),
    ("progress", 1): ("progress@1", ProgressV1),
    ("failed", 1): ("stage-failed@1", StageFailedV1),
}


def _payload_model(kind: str, version: int) -> tuple[str, type[BaseModel]]:
    found = PAYLOAD_MODELS.get((kind, version))
    if found is None:
        raise MalformedOutcome(f"no payload contract for a {kind!r} outcome at version {version}")
    return found


def _model_reason(ref: str, exc: ModelError, prefix: str = "", given: Collection[str] = ()) -> str:
    """The first failures of a binding's check: ``not a valid outcome@1 message: field 'a.b':
    ...``, paths spelled as the other refusals spell them; failures of the fields in ``given``
    (those the document carried) only, when there are any: a field filled in for an outcome of
    the old format is never blamed for it."""
    errors = exc.errors()
    theirs = [e for e in errors if e["loc"] and e["loc"][0] in given]
    said = []
    for err in (theirs or errors)[:3]:
        where = ".".join(str(p) for p in (*([prefix] if prefix else []), *err["loc"]))
        said.append(f"field {where!r}: {err['msg']}" if where else str(err["msg"]))
    return f"not a valid {ref} message: " + "; ".join(said)


def _legacy_payload(kind: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """A payload written before the payload contracts, as the reader of that time took it:
    accepted and heartbeat payloads were never read; a failure's ``code`` defaulted to
    ``failed`` and ``retryable`` to false; a progress report's ``percent`` was any number and its
    note any text. What that reader refused (a ``retryable`` that is not a boolean, a
    ``percent`` that is not a number) stays as it came, for the contract to refuse."""
    if kind in ("accepted", "heartbeat"):
        return {}
    if kind == "failed":
        code = payload.get("code", "failed")
        return {
            "code": (str(code) or "failed")[:MAX_ID_CHARS],
            "message": str(payload.get("message", ""))[:2000],
            "retryable": payload.get("retryable", False),
        }
    if kind == "progress":
        percent = payload.get("percent", 0)
        if isinstance(percent, int | float) and not isinstance(percent, bool):
            finite = math.isfinite(percent) if isinstance(percent, float) else abs(percent) <= 2**53
            percent = float(min(max(percent, 0), 100)) if finite else percent
        return {"percent": percent, "message": str(payload.get("message", ""))[:500]}
    return payload


def _as_contract(doc: dict[str, Any]) -> dict[str, Any]:
    """An outcome written before ``outcome@1`` (no ``contractVersion``) in the contract's shape,
    so that one reader takes both formats for as long as old messages may be queued (the
    retention window of ``schemas/contracts/outcome.v1.yaml``): the envelope fields it lacks are
    filled from its own (``correlationId`` the run id, ``causationId`` the job its id answers,
    ``producer`` its worker or :data:`DEFAULT_PRODUCER`, ``occurredAt`` the time it is read), an
    integer fence becomes text and the payload is read as its reader read it
    (:func:`_legacy_payload`). Everything else is left for the contract to judge."""
    kind, mid, worker = doc.get(MESSAGE_TYPE), doc.get(MESSAGE_ID), doc.get(WORKER_ID)
    fence, payload = doc.get(FENCE), doc.get(PAYLOAD, {})
    filled = {
        CONTRACT_VERSION: 1,
        CORRELATION_ID: doc.get(RUN_ID),
        CAUSATION_ID: job_id_of(mid, kind)
        if isinstance(mid, str) and isinstance(kind, str)
        else mid,
        PRODUCER: worker if isinstance(worker, str) and worker else DEFAULT_PRODUCER,
        OCCURRED_AT: iso_ms(int(time.time() * 1000)),
        TENANT: "",
    }
    out = filled | doc
    if isinstance(fence, int) and not isinstance(fence, bool):
        out[FENCE] = str(fence)
    if isinstance(payload, dict):
        out[PAYLOAD] = _legacy_payload(kind, payload)
    return out


def outcome_event(doc: Any) -> tuple[Event, dict[str, Any]]:
    """The event one decoded outcome envelope reports, read through the contracts: the envelope
    through ``outcome@1``'s binding and the payload through the binding its kind selects (for
    ``succeeded``, the stage's result contract, applied by the engine with the plan at hand).
    Raises :class:`MalformedOutcome` naming the failing fields.

    On top of the contracts, what canonical JSON cannot store is refused by name: a control
    character in an id, text that is not valid UTF-8 (a lone surrogate), a number that is not
    finite. An outcome written before the contract is first put in its shape
    (:func:`_as_contract`)."""
    if not isinstance(doc, dict):
        raise MalformedOutcome("outcome must be a JSON object")
    for key, value in doc.items():  # named plainly, before a model says it less clearly
        check_storable(value, key)
    given = doc.keys()
    if CONTRACT_VERSION not in doc:
        doc = _as_contract(doc)
    try:
        envelope = OutcomeV1.model_validate(doc)
    except ModelError as exc:
        raise MalformedOutcome(_model_reason("outcome@1", exc, given=given)) from None
    for name in (MESSAGE_ID, RUN_ID, STAGE, FENCE, TENANT):
        _ident(getattr(envelope, name), name)
    ident: dict[str, Any] = {
        "run_id": envelope.runId,
        "stage": envelope.stage,
        "attempt": envelope.attempt,
        "message_id": envelope.messageId,
        "fence": envelope.fence,
    }
    kind = envelope.messageType
    if kind == "succeeded":
        return StageSucceeded(**ident, result=envelope.payload), doc
    ref, model = _payload_model(kind, envelope.contractVersion)
    try:
        payload = model.model_validate(envelope.payload)
    except ModelError as exc:
        raise MalformedOutcome(_model_reason(ref, exc, PAYLOAD)) from None
    event: Event
    match payload:
        case StageAcceptedV1():
            event = StageAccepted(**ident, worker_id=_ident(envelope.workerId or "", WORKER_ID))
        case StageHeartbeatV1():
            event = HeartbeatReceived(**ident)
        case ProgressV1(percent=percent, message=note):
            note = _storable_text(note or "", "payload.message", MAX_TEXT_CHARS)
            event = ProgressReported(**ident, progress=percent / 100.0, note=note)
        case StageFailedV1(code=code, message=message, retryable=retryable):
            event = StageFailed(
                **ident,
                retryable=retryable,
                code=_ident(code, "payload.code"),
                message=_storable_text(message, "payload.message", MAX_TEXT_CHARS),
            )
        case _:  # pragma: no cover - PAYLOAD_MODELS holds only the four above
            raise MalformedOutcome(f"no reader for a {kind!r} outcome")
    return event, doc


# -- quarantine records -----------------------------------------------------------------------


def quarantine_queue(queue: str) -> str:
    """Where what cannot be read from ``queue`` is kept."""
    return f"{queue}.quarantine"


def quarantine_record(
    queue: str,
    message_id: str,
    reason: str,
    body: bytes,
    contracts: Iterable[MessageContract] = (),
) -> dict[str, Any]:
    """The record of a message that could not be taken from ``queue``, with its reason: the body
    with the fields ``contracts`` mark sensitive masked (named like one where it does not parse),
    cut to :data:`QUARANTINE_BODY_CHARS`
    (see :func:`accord.contracts.redact.redact_quarantine_record`)."""
    text = body.decode("utf-8", errors="replace")
    record = {"queue": queue, "message_id": message_id, "reason": reason, "body": text}
    return redact_quarantine_record(record, contracts, limit=QUARANTINE_BODY_CHARS)


def quarantine_message(record: Mapping[str, Any]) -> tuple[str, bytes]:
    """``(message id, body)`` of a quarantine record as published."""
    return f"quarantine:{record['message_id']}", canonical_json(dict(record))


def read_quarantine(body: bytes) -> dict[str, Any]:
    """A published quarantine record, ``message_id`` filled from a legacy ``messageId``."""
    record = dict(decode_json(body))
    if "message_id" not in record and MESSAGE_ID in record:
        record["message_id"] = record.pop(MESSAGE_ID)
    return record
