"""The remote worker: jobs arrive by signed ``POST /v1/jobs``, outcomes leave by signed callback.

- ``POST /v1/jobs`` takes one ``envelope@2`` job (docs/protocol.md §3), signed by the engine's
  dispatch adapter with one of ``job_secrets`` (Standard Webhooks; a replayed ``webhook-id`` is
  409). The job is read as the protocol says (poison: 422, never accepted); then the attempt is
  claimed in the acceptance record and the answer is ``202 {"acceptanceId", "workerId"}``. The
  acceptance id derives from run, stage, attempt and fence, so a job delivered again gets the
  same answer and runs nothing (a finished one has its recorded outcome sent again).
- The handler (``accord_worker_metadata_extract.handle``) runs in a thread; while it runs a
  ``heartbeat`` outcome is sent every ``heartbeat_ms``, and its progress reports are sent as
  ``progress`` outcomes. Its result is checked against ``technical-metadata@1`` (a result that
  breaks it is sent as a terminal ``invalid-result`` failure), recorded, then sent.
- Every outcome is an ``outcome@1`` document POSTed to ``callback_url``, signed with
  ``key_id``/``secret``; its ``webhook-id`` is the outcome's ``messageId``, so a retry after a
  lost answer is refused as replayed (409), which the worker counts as delivered. A 5xx or a
  connection failure is retried with backoff, up to ``callback_attempts``. A job's ``replyTo``
  (envelope@2) changes nothing here: callbacks go to the API, which queues them on the shared
  outcome queue, and the engines forward from there to the owner of the run's shard.
- ``POST /v1/cancel`` takes a signed cancellation request (protocol §7) and cancels the running
  attempt whose fence and stage it names.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from accord_worker_metadata_extract.handler import (  # type: ignore[import-untyped]
    CAPABILITY,
    handle,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from accord.adapters.ingress.webhooks import Rejected, WebhookVerifier, sign_headers
from accord.contracts.catalog import Catalog
from accord.engine.runtime.wire import outcome_message_id
from accord.errors import StageFailed
from accord.worker.acceptance import AcceptanceLog
from accord.worker.sandbox import Limits
from accord.worker.sdk import Context
from accord.worker.storage import StorageMap
from accord.worker.wire import (
    Job,
    Poison,
    Refused,
    check_result,
    failure,
    outcome,
    read_control,
    read_job,
)

__all__ = ["REQUEST", "RESULT", "RemoteWorker", "Settings"]

log = logging.getLogger("accord_worker_metadata_extract_http")

REQUEST, RESULT = "metadata-extraction-request@1", "technical-metadata@1"
MAX_JOB_BYTES = 1_048_576


@dataclass
class Settings:
    callback_url: str
    key_id: str  # signs the callbacks
    secret: str
    job_secrets: Mapping[str, str]  # key id -> secret: the engine's keys jobs must be signed with
    storage: StorageMap
    catalog: Catalog | None = None
    worker_id: str = "metadata-extract-http"
    heartbeat_ms: int = 5_000
    ca_file: Path | None = None  # trust for an https callback URL
    acceptance_path: Path | str = ":memory:"
    limits: Limits | None = None
    callback_attempts: int = 8
    callback_backoff_ms: int = 100
    tolerance_s: int = 300


@dataclass
class _Running:
    job: Job
    ctx: Context
    task: asyncio.Task[None] | None = None
    seq: dict[str, int] = field(default_factory=dict)


def _problem(status: int, code: str, detail: str) -> JSONResponse:
    body = {"type": f"about:blank#{code}", "status": status, "code": code, "detail": detail}
    return JSONResponse(body, status_code=status, media_type="application/problem+json")


class RemoteWorker:
    """The service; :attr:`app` is its Starlette application."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.acceptance = AcceptanceLog(settings.acceptance_path)
        self._verifier = WebhookVerifier(settings.job_secrets, tolerance_s=settings.tolerance_s)
        self._running: dict[str, _Running] = {}  # by fence
        self._tasks: set[asyncio.Task[Any]] = set()
        self._client: httpx.AsyncClient | None = None
        self.handled = 0  # handler runs started
        self.sent: list[str] = []  # outcome ids delivered, in order
        self.app = Starlette(
            routes=[
                Route("/v1/jobs", self.receive_job, methods=["POST"]),
                Route("/v1/cancel", self.receive_cancel, methods=["POST"]),
                Route("/healthz", self.health, methods=["GET"]),
            ],
            lifespan=self._lifespan,
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, _: Starlette) -> AsyncIterator[None]:
        verify: Any = True
        if self.settings.ca_file is not None:
            import ssl  # noqa: PLC0415

            verify = ssl.create_default_context(cafile=str(self.settings.ca_file))
        self._client = httpx.AsyncClient(verify=verify, timeout=10.0, trust_env=False)
        try:
            yield
        finally:
            for task in list(self._tasks):
                task.cancel()
            for task in list(self._tasks):
                with contextlib.suppress(BaseException):
                    await task
            await self._client.aclose()
            self.acceptance.close()

    async def health(self, _: Request) -> Response:
        return JSONResponse({"status": "ok", "running": len(self._running)})

    async def _signed_body(self, request: Request) -> bytes | Response:
        body = await request.body()
        if len(body) > MAX_JOB_BYTES:
            return _problem(413, "body-too-large", f"over {MAX_JOB_BYTES} bytes")
        try:
            verified = self._verifier.verify(body, request.headers)
            await self._verifier.claim(verified)
        except Rejected as exc:
            return _problem(exc.status, exc.code, exc.detail)
        return body

    async def receive_job(self, request: Request) -> Response:
        body = await self._signed_body(request)
        if isinstance(body, Response):
            return body
        refused: Refused | None = None
        payload: dict[str, Any] = {}
        try:
            job, payload = read_job(body, self.settings.catalog, REQUEST)
        except Poison as exc:
            return _problem(422, "poison-job", str(exc))
        except Refused as exc:
            job, refused = exc.job, exc
        s = self.settings
        prior = self.acceptance.claim(job.run_id, job.stage, job.attempt, job.fence)
        if prior is None:
            self._spawn(self._serve(job, payload, refused))
        elif prior.state == "finished" and prior.outcome is not None:
            self._spawn(self._send(outcome_message_id(prior.outcome), prior.outcome))
        key = AcceptanceLog.key(job.run_id, job.stage, job.attempt, job.fence)
        acceptance_id = "acc_" + hashlib.sha256(key.encode()).hexdigest()[:24]
        return JSONResponse({"acceptanceId": acceptance_id, "workerId": s.worker_id}, 202)

    async def receive_cancel(self, request: Request) -> Response:
        body = await self._signed_body(request)
        if isinstance(body, Response):
            return body
        try:
            fence, stage = read_control(body)
        except Poison as exc:
            return _problem(422, "poison-control", str(exc))
        running = self._running.get(fence)
        if running is not None and running.job.stage == stage:
            running.ctx.cancel()
            return JSONResponse({"cancelled": True}, 202)
        return JSONResponse({"cancelled": False}, 202)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- running a job ---------------------------------------------------------------------

    async def _serve(self, job: Job, payload: dict[str, Any], refused: Refused | None) -> None:
        s = self.settings
        if refused is not None:
            kind, result = failure(refused.code, refused.message, retryable=False)
        else:
            loop = asyncio.get_running_loop()
            running = _Running(job, self._context(job, loop))
            self._running[job.fence] = running
            beat = asyncio.create_task(self._heartbeats(running))
            self.handled += 1
            try:
                raw = await asyncio.to_thread(handle, payload, running.ctx)
                kind, result = check_result(s.catalog, RESULT, raw)
            except StageFailed as exc:
                kind, result = failure(exc.failure_code, exc.reason, retryable=exc.retryable)
            except Exception as exc:
                kind, result = failure("handler-crashed", repr(exc)[:2000], retryable=True)
            finally:
                beat.cancel()
                self._running.pop(job.fence, None)
        message_id, body = outcome(job, kind, result, worker_id=s.worker_id)
        self.acceptance.finish(job.run_id, job.stage, job.attempt, job.fence, body)
        await self._send(message_id, body)

    def _context(self, job: Job, loop: asyncio.AbstractEventLoop) -> Context:
        services: dict[str, Any] = {"storage": self.settings.storage}
        if self.settings.limits is not None:
            services["limits"] = self.settings.limits
        ctx = Context(
            job.run_id, job.stage, job.attempt, job.fence, str(job.envelope.get("tenant", "")),
            CAPABILITY, str(job.envelope.get("idempotencyKey", "")), job.envelope, services,
        )  # fmt: skip

        def progress(percent: float, message: str) -> None:  # called from the handler thread
            asyncio.run_coroutine_threadsafe(
                self._report(job, "progress", {"percent": percent, "message": message}), loop
            )

        ctx._emit = progress
        return ctx

    async def _report(self, job: Job, kind: str, payload: dict[str, Any]) -> None:
        running = self._running.get(job.fence)
        seq = 1
        if running is not None:
            seq = running.seq[kind] = running.seq.get(kind, 0) + 1
        message_id, body = outcome(job, kind, payload, seq=seq, worker_id=self.settings.worker_id)
        await self._send(message_id, body, attempts=1)

    async def _heartbeats(self, running: _Running) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_ms / 1000)
            await self._report(running.job, "heartbeat", {"at": time.time()})

    async def _send(self, message_id: str, body: bytes, attempts: int | None = None) -> bool:
        """POST one outcome to the callback URL, signed; whether it was taken (202, or 409: an
        earlier try was)."""
        s, client = self.settings, self._client
        assert client is not None
        delay = s.callback_backoff_ms / 1000
        for i in range(attempts or s.callback_attempts):
            headers = {
                **sign_headers(s.key_id, s.secret, message_id, body),
                "content-type": "application/json",
            }
            try:
                answer = await client.post(s.callback_url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                log.warning("callback %s: %s (try %d)", message_id, exc, i + 1)
            else:
                if answer.status_code in (200, 202, 409):
                    self.sent.append(message_id)
                    return True
                if answer.status_code < 500 and answer.status_code != 429:
                    log.error("callback %s refused: %s", message_id, answer.text[:500])
                    return False
                log.warning("callback %s: %s (try %d)", message_id, answer.status_code, i + 1)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
        return False
