"""Wire rules of the worker runtime: reading a job envelope and answering it with outcomes
(the outcome envelope and the quarantine record are defined in :mod:`accord.engine.runtime.wire`,
which intake reads them with).

A job is read in a fixed order, each step refusing rather than repairing:

1. size: bodies above the envelope contract's byte limit are refused before decoding;
2. identity: ``runId``, ``stage``, ``attempt`` and ``fence`` must be present and typed — without
   them no outcome can name the attempt, so the job is *poison* (quarantined, never answered);
3. envelope contract (``envelope@2``) and then the capability's request contract, which the
   job's ``messageType@contractVersion`` must name, defaults applied only where a field is
   missing. A failure here is answered as a terminal ``invalid-request``.
   Sealed fields (:mod:`accord.contracts.sealing`) are opened first, with the worker's keyring,
   so the contract checks, and the handler sees, the clear value; a result leaves with the
   fields its contract marks sensitive sealed again (:func:`check_result`), and every outcome
   answering the job is scrubbed of the values that arrived sealed (an error message quoting
   one says ``***``).

Every outcome of a job goes to its ``replyTo`` queue (:attr:`Job.reply_to`: the queue of the
engine that owns the run's shard), or to the platform's outcome queue when it has none.

Outcome ids derive from the job's message id, so a redelivered job yields the same ids and the
transport drops the copies; heartbeats and progress carry a sequence number. Capabilities are
announced through an :data:`Announcer` (``Engine.announce`` has that shape; :func:`store_announcer`
writes straight to a store).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError as ModelError

from accord.contracts.catalog import Catalog
from accord.contracts.model import MessageContract
from accord.contracts.redact import scrub, scrub_pattern
from accord.contracts.sealing import Keyring, SealingError, open_all, seal_fields, sealed_found
from accord.contracts.validate import DEFAULT_MAX_BYTES, Validator
from accord.engine.ports import Delivery
from accord.engine.runtime.wire import (
    UndecodableJson,
    decode_json,
    encode_outcome,
    outcome_id,
    quarantine_message,
    quarantine_queue,
    quarantine_record,
)
from accord.errors import FieldViolation, StageFailed
from accord.generated.cancellation_requested_v1 import CancellationRequestedV1
from accord.objects.claims import check_out
from accord.objects.ports import ObjectStore

__all__ = [
    "Announcer",
    "Job",
    "Poison",
    "Refused",
    "check_result",
    "failure",
    "outcome",
    "quarantine",
    "read_control",
    "read_job",
    "store_announcer",
    "violations_text",
]

Announcer = Callable[[str, Sequence[str], int], Awaitable[None]]  # (worker id, caps, ttl ms)


ENVELOPE = "envelope@2"  # the current envelope: every envelope@1 job is a valid envelope@2 job
# envelope@2's pattern for replyTo: a job whose replyTo breaks it is refused as invalid-envelope,
# and answered on the shared outcome queue (a queue name that breaks the contract is not used)
REPLY_TO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")


class Poison(ValueError):
    """The delivery cannot be answered at all; ``str()`` is the quarantine reason."""


@dataclass(frozen=True, slots=True)
class Job:
    envelope: dict[str, Any]
    run_id: str
    stage: str
    attempt: int
    fence: str
    # the queue this job's outcomes go to (envelope@2 replyTo); None: the worker's outcome queue
    reply_to: str | None = None
    # the values that arrived sealed, as a pattern: every outcome answering the job is scrubbed
    # of them, so a handler's error message cannot carry one back in clear
    opened: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    @property
    def message_id(self) -> str:
        return str(self.envelope.get("messageId") or f"{self.run_id}:{self.stage}:{self.attempt}")


class Refused(Exception):
    """The job names its attempt but breaks a contract; answered as a terminal failure."""

    def __init__(self, job: Job, code: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.job, self.code, self.message = job, code, message
        self.retryable = retryable  # only an object store that did not answer a claim check


def violations_text(violations: tuple[FieldViolation, ...]) -> str:
    return "; ".join(f"{v.path or '$'}: {v.message}" for v in violations)[:2000]


def read_job(
    body: bytes,
    catalog: Catalog | None,
    request_ref: str | Sequence[str] | None,
    keyring: Keyring | None = None,
    claims: ObjectStore | None = None,
) -> tuple[Job, dict[str, Any]]:
    """The job and its validated payload, sealed fields opened with ``keyring``, checked against
    the request contract ``request_ref`` (or, for several versions served on one queue, the one
    of ``request_ref`` the job names); raises
    :class:`Poison` or :class:`Refused` (``unsealable-request`` for a sealed field that cannot
    be opened: no key, a key the ring lacks, or an altered token).

    A ``payloadRef`` job is checked out of ``claims`` and verified
    (:func:`accord.objects.claims.check_out`): a mismatch is ``corrupt-payload``, a key that is
    not the tenant's claim ``storage-ref-denied``, both terminal; with no ``claims`` store it is
    ``payload-ref-unsupported``. Blocking object I/O: call this off the event loop then."""
    envelope_contract = catalog.message(ENVELOPE) if catalog else None
    limit = (envelope_contract.max_bytes if envelope_contract else None) or DEFAULT_MAX_BYTES
    if len(body) > limit:
        raise Poison(f"job of {len(body)} bytes exceeds the envelope limit of {limit}")
    try:
        doc = decode_json(body)
    except UndecodableJson as exc:
        raise Poison(str(exc)) from None
    if not isinstance(doc, dict):
        raise Poison("job envelope must be a JSON object")
    job = _identity(doc)
    if envelope_contract is not None:
        checked = Validator.for_contract(envelope_contract).validate(doc)
        if not checked.ok:
            raise Refused(job, "invalid-envelope", violations_text(checked.violations))
    if "payloadRef" in doc:
        if claims is None:
            raise Refused(
                job, "payload-ref-unsupported",
                "payloadRef: the payload was checked in to an object store and this worker has "
                "none for claims (--claims URL)",
            )  # fmt: skip
        if not isinstance(doc.get("tenant"), str):
            raise Refused(job, "invalid-envelope", "tenant: a payloadRef job must name its tenant")
        try:
            doc = check_out(doc, claims)
        except StageFailed as exc:
            raise Refused(
                job, exc.failure_code, f"payloadRef: {exc.reason}", retryable=exc.retryable
            ) from None
    payload = doc.get("payload")
    if not isinstance(payload, dict):
        raise Refused(job, "invalid-request", "payload: must be an object")
    opened: list[Any] = []
    try:
        payload = open_all(payload, keyring, opened)
    except SealingError as exc:
        where = ", ".join(f"payload.{p}" for p in sealed_found(payload)[:5])
        raise Refused(job, "unsealable-request", f"{where}: {exc}") from None
    if opened:
        job = dataclasses.replace(job, opened=scrub_pattern(opened))
    refs = [request_ref] if isinstance(request_ref, str) else list(request_ref or ())
    requests = [r for r in (catalog.message(ref) for ref in refs) if r] if catalog else []
    if not requests:
        return job, dict(payload)
    named = f"{doc.get('messageType')}@{doc.get('contractVersion')}"
    request = next((r for r in requests if str(r.ref) == named), None)
    if request is None:
        takes = " or ".join(str(r.ref) for r in requests)
        raise Refused(job, "invalid-request", f"the job names {named}; this worker takes {takes}")
    checked = Validator.for_contract(request).validate(payload)
    if not checked.ok:
        raise Refused(job, "invalid-request", violations_text(checked.violations))
    return job, dict(checked.value)


CONTROL_MAX_BYTES = 65_536  # cancellation-requested@1's limit


def read_control(body: bytes) -> tuple[str, str]:
    """``(fence, stage)`` of a ``cancellation-requested@1`` message, read through its generated
    binding (a request written before the contract, with ``job_id`` for ``jobId``, is read the
    same way); raises :class:`Poison` with the reason, whatever the body: too large, not JSON,
    nested too deeply, not a request."""
    try:
        doc = decode_json(body, max_bytes=CONTROL_MAX_BYTES)
    except UndecodableJson as exc:
        raise Poison(f"control message: {exc}") from None
    if isinstance(doc, dict) and "job_id" in doc and "jobId" not in doc:
        doc = {("jobId" if k == "job_id" else k): v for k, v in doc.items()}
    try:
        request = CancellationRequestedV1.model_validate(doc)
    except ModelError as exc:
        where = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '$'}: {e['msg']}" for e in exc.errors()[:3]
        )
        raise Poison(f"not a valid cancellation-requested@1 message: {where}") from None
    return request.fence, request.stage


def _identity(doc: Mapping[str, Any]) -> Job:
    run_id, stage, attempt, fence = (doc.get(k) for k in ("runId", "stage", "attempt", "fence"))
    if not isinstance(run_id, str) or not run_id or not isinstance(stage, str) or not stage:
        raise Poison("job envelope does not name its run and stage")
    if not isinstance(attempt, int) or isinstance(attempt, bool):
        raise Poison("job envelope has no integer attempt")
    if not isinstance(fence, str | int) or isinstance(fence, bool):
        raise Poison("job envelope has no fence")
    reply_to = doc.get("replyTo")
    if not isinstance(reply_to, str) or not REPLY_TO.fullmatch(reply_to):
        reply_to = None
    return Job(dict(doc), run_id, stage, attempt, str(fence), reply_to)


PROGRESS_NOTE_CHARS = 500  # progress@1's limit on a progress note


def _result_version(job: Job) -> int:
    """The result contract version the job asks for (``resultSchemaVersion``), 1 if unstated."""
    version = job.envelope.get("resultSchemaVersion")
    return (
        version if isinstance(version, int) and not isinstance(version, bool) and version > 0 else 1
    )


def _progress(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A progress report within progress@1: percent held to 0..100, the note cut to its limit."""
    percent = payload.get("percent", 0)
    if isinstance(percent, int | float) and not isinstance(percent, bool):
        percent = min(max(percent, 0), 100)
    out = {**payload, "percent": percent}
    if "message" in out:
        out["message"] = str(out["message"])[:PROGRESS_NOTE_CHARS]
    return out


def outcome(
    job: Job,
    kind: str,
    payload: Mapping[str, Any] | None = None,
    *,
    seq: int = 0,
    worker_id: str | None = None,
    producer: str | None = None,
) -> tuple[str, bytes]:
    """``(message id, body)`` of an ``outcome@1`` envelope answering ``job``: caused by the
    job's message, its payload within the contract ``kind`` selects (a ``succeeded`` payload at
    the job's ``resultSchemaVersion``)."""
    message_id = outcome_id(job.message_id, kind, seq)
    if job.opened is not None and payload is not None:
        payload = scrub(payload, job.opened)
    if kind == "progress" and payload is not None:
        payload = _progress(payload)
    body = encode_outcome(
        message_id, kind, run_id=job.run_id, stage=job.stage, attempt=job.attempt,
        fence=job.fence, tenant=job.envelope.get("tenant", ""), payload=payload,
        worker_id=worker_id, causation_id=job.message_id, producer=producer,
        contract_version=_result_version(job) if kind == "succeeded" else 1,
    )  # fmt: skip
    return message_id, body


FAILURE_CODE_CHARS, FAILURE_MESSAGE_CHARS = 512, 2000  # stage-failed@1's bounds


def failure(code: str, message: str, *, retryable: bool) -> tuple[str, dict[str, Any]]:
    """A ``failed`` outcome's kind and payload within ``stage-failed@1`` (a code held to its
    bounds, ``failed`` for none; the message cut to its limit)."""
    return "failed", {
        "code": code[:FAILURE_CODE_CHARS] or "failed",
        "message": message[:FAILURE_MESSAGE_CHARS],
        "retryable": retryable,
    }


def quarantine(
    delivery: Delivery, reason: str, contracts: Iterable[MessageContract] = ()
) -> tuple[str, str, bytes]:
    """``(queue, message id, body)`` of the quarantine record for a poison delivery, with the
    fields ``contracts`` mark sensitive masked."""
    record = quarantine_record(
        delivery.queue, delivery.message_id, reason, delivery.body, contracts
    )
    return (quarantine_queue(delivery.queue), *quarantine_message(record))


def store_announcer(store: Any, now_ms: Callable[[], int] | None = None) -> Announcer:
    """An :data:`Announcer` writing to a :class:`~accord.engine.ports.Store` (``announce`` with
    an absolute expiry)."""
    clock = now_ms or (lambda: int(time.time() * 1000))

    async def announce(worker_id: str, capabilities: Sequence[str], ttl_ms: int) -> None:
        await store.announce(worker_id, list(capabilities), clock() + ttl_ms)

    return announce


def check_result(
    catalog: Catalog | None, result_ref: str | None, result: Any, keyring: Keyring | None = None
) -> tuple[str, dict[str, Any]]:
    """``("succeeded", normalised result)``, or a terminal ``invalid-result`` failure. With a
    ``keyring``, the fields the result contract marks sensitive leave sealed."""
    if not isinstance(result, dict):
        return failure("invalid-result", "the handler returned no object", retryable=False)
    contract = catalog.message(result_ref) if catalog and result_ref else None
    if contract is None:
        return "succeeded", result
    checked = Validator.for_contract(contract).validate(result)
    if not checked.ok:
        return failure("invalid-result", violations_text(checked.violations), retryable=False)
    if keyring is not None:
        return "succeeded", dict(seal_fields(contract, checked.value, keyring))
    return "succeeded", dict(checked.value)
