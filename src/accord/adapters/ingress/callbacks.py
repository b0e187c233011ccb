"""``POST /v1/callbacks``: signed outcomes from remote HTTP workers, onto the outcome queue.

The body is one ``outcome@1`` document or an ``outcome-batch@1`` of them (docs/protocol.md §4),
signed as :mod:`.webhooks` says. :class:`CallbackIntake` checks, in order: the signature, key and
timestamp (401), the body's size (413), that it is JSON (400) and an outcome the engine's own
reader takes, declaring its contract (422), that its ``webhook-id`` is new (409); then it
publishes the body unchanged on ``accord.outcomes`` through the
:class:`~accord.engine.ports.Transport` port, under the outcome's ``messageId`` (a batch under
``batch-`` + its digest), and answers 202. Always that shared queue, even for a job that named
a ``replyTo`` (envelope@2): an outcome does not carry its job's ``replyTo``, and the engines
forward what reaches the shared queue to the owner of the run's shard.

Nothing here decides about the run: the engine's intake applies the callback exactly as it
applies an outcome from a queue. A validly signed outcome for an earlier attempt or a fenced one
is recorded as ``stale``, one after the run's terminal intent as ``late``, and a ``succeeded``
whose result breaks the stage's result contract ends the attempt as ``invalid-result``. The
signature says who sent it; the fence, which only the attempt's job carried, says what it may
speak for.

A publish that fails answers 503 and forgets the ``webhook-id``, so the sender's retry is taken.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from accord.adapters.ingress.problems import problem_response
from accord.adapters.ingress.remote import RemoteConfig
from accord.adapters.ingress.webhooks import (
    Rejected,
    ReplayStore,
    Verified,
    WebhookVerifier,
)
from accord.engine.ports import Transport
from accord.engine.runtime.intake import OUTCOMES_QUEUE
from accord.engine.runtime.wire import (
    CONTRACT_VERSION,
    MESSAGE_ID,
    MESSAGE_TYPE,
    OUTCOMES,
    MalformedOutcome,
    UndecodableJson,
    decode_json,
    parse_delivery,
)

__all__ = ["CALLBACKS_PATH", "Accepted", "CallbackIntake", "router"]

CALLBACKS_PATH = "/v1/callbacks"


@dataclass(frozen=True, slots=True)
class Accepted:
    message_id: str  # the transport message id it was published under
    outcomes: tuple[str, ...]  # the outcomes' messageIds, in order
    webhook_id: str
    key_id: str


class CallbackIntake:
    """Verifier + transport + outcome queue: what ``POST /v1/callbacks`` needs."""

    def __init__(
        self,
        verifier: WebhookVerifier,
        transport: Transport,
        *,
        outcome_queue: str = OUTCOMES_QUEUE,
        max_body_bytes: int = 1_048_576,
    ) -> None:
        self.verifier, self.transport = verifier, transport
        self.outcome_queue, self.max_body_bytes = outcome_queue, max_body_bytes

    @classmethod
    def from_config(
        cls, config: RemoteConfig, transport: Transport, replay: ReplayStore | None = None
    ) -> CallbackIntake:
        """Every remote's secrets active, the file's tolerance and body limit."""
        keys = {k: s for remote in config.remotes.values() for k, s in remote.secrets.items()}
        verifier = WebhookVerifier(keys, tolerance_s=config.callbacks.tolerance_s, replay=replay)
        return cls(verifier, transport, max_body_bytes=config.callbacks.max_body_bytes)

    async def take(self, body: bytes, headers: Mapping[str, str]) -> Accepted:
        """Check and publish one callback; raises :class:`~.webhooks.Rejected`."""
        if len(body) > self.max_body_bytes:
            raise Rejected(413, "body-too-large", f"the body is over {self.max_body_bytes} bytes")
        verified = self.verifier.verify(body, headers)
        message_id, ids = _read(body)
        await self.verifier.claim(verified)
        try:
            await self.transport.publish(self.outcome_queue, message_id, body)
        except Exception as exc:
            await self._forget(verified)
            raise Rejected(
                503, "outcome-queue-unavailable", f"the outcome could not be queued: {exc}"
            ) from None
        return Accepted(message_id, ids, verified.webhook_id, verified.key_id)

    async def _forget(self, verified: Verified) -> None:
        # should the id stay known, the sender's retry is answered 409
        with contextlib.suppress(Exception):
            await self.verifier.release(verified)


def _read(body: bytes) -> tuple[str, tuple[str, ...]]:
    """The message id to publish under and the outcomes' ids; raises :class:`Rejected`."""
    try:
        doc = decode_json(body)
    except UndecodableJson as exc:
        raise Rejected(400, "malformed-body", str(exc)) from None
    if not isinstance(doc, dict):
        raise Rejected(400, "malformed-body", "the body must be a JSON object")
    try:
        batch, parsed = parse_delivery(body)
    except MalformedOutcome as exc:
        raise Rejected(422, "invalid-outcome", str(exc)) from None
    members: list[Any] = doc[OUTCOMES] if batch else [doc]
    for i, ((member, event), raw) in enumerate(zip(parsed, members, strict=True)):
        where = f"outcomes[{i}]: " if batch else ""
        if isinstance(event, MalformedOutcome):
            raise Rejected(422, "invalid-outcome", str(event))
        if not isinstance(raw, dict) or CONTRACT_VERSION not in member:
            raise Rejected(
                422, "invalid-outcome",
                f"{where}a callback carries outcome@1 documents: {CONTRACT_VERSION!r} is missing",
            )  # fmt: skip
    ids = tuple(str(m[MESSAGE_ID]) for m, _ in parsed)
    if not batch:
        return ids[0], ids
    digest = hashlib.sha256("\n".join(ids).encode()).hexdigest()[:32]
    return f"batch-{digest}", ids


router = APIRouter(tags=["callbacks"])

_RESPONSES: dict[int | str, dict[str, Any]] = {
    202: {"description": "Verified and queued for the engine"},
    400: {"description": "The body is not JSON"},
    401: {"description": "Unsigned, unknown key, bad signature or timestamp out of tolerance"},
    409: {"description": "The webhook-id was already received"},
    413: {"description": "The body is too large"},
    422: {"description": "Not an outcome@1 or outcome-batch@1 document"},
    503: {"description": "Callbacks are not configured, or the outcome queue is unavailable"},
}


async def _body(request: Request, limit: int) -> bytes | None:
    """The request body, or ``None`` once it passes ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


@router.post(
    CALLBACKS_PATH,
    status_code=202,
    responses=_RESPONSES,
    summary="Receive a signed outcome from a remote worker",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "description": "An outcome@1 or outcome-batch@1 document.",
                        "properties": {
                            MESSAGE_TYPE: {"type": "string"},
                            MESSAGE_ID: {"type": "string"},
                        },
                    }
                }
            },
        },
        "parameters": [
            {"name": n, "in": "header", "required": True, "schema": {"type": "string"}}
            for n in ("webhook-id", "webhook-timestamp", "webhook-signature", "accord-key-id")
        ],
    },
)
async def receive_callback(request: Request) -> Response:
    intake = getattr(request.app.state, "callbacks", None)
    if not isinstance(intake, CallbackIntake):
        return problem_response(
            503, "callbacks-not-configured", "this server has no remote-worker configuration"
        )
    body = await _body(request, intake.max_body_bytes)
    if body is None:
        return problem_response(
            413, "body-too-large", f"the body is over {intake.max_body_bytes} bytes"
        )
    try:
        accepted = await intake.take(body, request.headers)
    except Rejected as exc:
        return problem_response(exc.status, exc.code, exc.detail)
    return JSONResponse(
        {
            "status": "accepted",
            "messageId": accepted.message_id,
            "outcomes": list(accepted.outcomes),
            "webhookId": accepted.webhook_id,
        },
        status_code=202,
    )
