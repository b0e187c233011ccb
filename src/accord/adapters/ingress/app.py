"""The control-plane application: FastAPI over an engine, served by uvicorn (``accord serve``).

:func:`create_app` assembles it. Every ``/v1`` route but the signed callbacks declares the
bearer dependency it needs (:func:`~accord.adapters.ingress.auth.authorizer`) on its own, so
``POST /v1/callbacks`` (its own router, authenticated by signature) never meets it. OpenAPI 3.1
is served at ``/openapi.json``.

Every error is an RFC 9457 problem document (:mod:`~accord.adapters.ingress.problems`):
validation errors name each failing field (``body.context``, ``query.limit``), Accord's own
errors keep their codes, and a last-resort handler logs anything unexpected and answers a
``500 internal-error`` problem, never a traceback.
"""

from __future__ import annotations

import importlib
import logging
import secrets
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from accord.adapters.ingress import manage, runs
from accord.adapters.ingress.auth import JwtVerifier
from accord.adapters.ingress.contracts import ContractBook
from accord.adapters.ingress.control import ControlStore
from accord.adapters.ingress.limits import ApiLimits, BodyLimit, RateLimiter
from accord.adapters.ingress.plane import Plane, RunView, masked_view
from accord.adapters.ingress.problems import Problem, problem_response
from accord.contracts.catalog import Catalog
from accord.errors import (
    AccordError,
    ContractError,
    EngineError,
    PlanError,
    StoreError,
    TransportError,
    ValidationError,
)
from accord.workflow.activation import ActivationError

__all__ = ["API_VERSION", "create_app"]

log = logging.getLogger("accord.ingress")
API_VERSION = "1"
_STATUS_CODES = {
    400: "bad-request", 401: "unauthenticated", 403: "forbidden", 404: "not-found",
    405: "method-not-allowed", 406: "not-acceptable", 409: "conflict", 413: "body-too-large",
    415: "unsupported-media-type", 422: "invalid-request", 429: "rate-limited",
}  # fmt: skip


class RequestIds:
    """Gives every request an id (its ``X-Request-ID`` when that is a safe token) and answers
    with it in the same header; audit records carry it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        asked = next((v for k, v in scope.get("headers", ()) if k == b"x-request-id"), b"")
        text = asked.decode("latin-1")
        safe = 0 < len(text) <= 128 and all(c.isalnum() or c in "._:-" for c in text)
        rid = text if safe and text.isascii() else f"req_{secrets.token_hex(8)}"
        scope.setdefault("state", {})["request_id"] = rid

        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", rid.encode("ascii")))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, tagged)


def _where(loc: Any) -> str:
    return ".".join(str(p) for p in loc) or "(request)"


def _install_handlers(app: FastAPI) -> None:
    @app.exception_handler(Problem)
    async def on_problem(request: Request, exc: Problem) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {
                "where": _where(e.get("loc", ())),
                "message": str(e.get("msg", "")),
                "type": str(e.get("type", "")),
            }
            for e in exc.errors()[:32]
        ]
        said = "; ".join(f"{e['where']}: {e['message']}" for e in errors[:4])
        return problem_response(422, "invalid-request", said or "invalid request", errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _STATUS_CODES.get(exc.status_code, "http-error")
        headers = dict(exc.headers) if exc.headers else None
        return problem_response(exc.status_code, code, str(exc.detail), headers=headers)

    @app.exception_handler(AccordError)
    async def on_accord(request: Request, exc: AccordError) -> JSONResponse:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, ValidationError):
            violations = [{"path": v.path or "$", "message": v.message} for v in exc.violations]
            return problem_response(422, exc.code, detail, violations=violations)
        if isinstance(exc, ActivationError):
            status = 404 if exc.code == "activation-unknown-plan" else 409
            return problem_response(status, exc.code, detail)
        if isinstance(exc, PlanError | ContractError):
            found = [d.as_dict() for d in getattr(exc, "diagnostics", ())]
            return problem_response(422, exc.code, detail, diagnostics=found)
        if isinstance(exc, StoreError | TransportError):
            log.warning("%s: %s", type(exc).__name__, detail)
            code = "store-unavailable" if isinstance(exc, StoreError) else "transport-unavailable"
            return problem_response(503, code, detail, headers={"Retry-After": "1"})
        if isinstance(exc, EngineError):
            return problem_response(409, exc.code, detail)
        return problem_response(400, exc.code, detail)

    @app.exception_handler(Exception)
    async def on_anything(request: Request, exc: Exception) -> JSONResponse:
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        return problem_response(500, "internal-error", f"internal error: {type(exc).__name__}")


def create_app(
    engine: Any,
    control: ControlStore,
    *,
    starts: Literal["engine", "queue"] = "engine",
    catalog: Catalog | None = None,
    root: Path | None = None,
    view: RunView | None = None,
    jwt: JwtVerifier | None = None,
    limits: ApiLimits | None = None,
    callbacks: object | None = None,
) -> FastAPI:
    """The application over ``engine`` (an :class:`~accord.engine.runtime.orchestrator.Engine`).

    ``starts`` says how runs are started: ``"engine"`` by this process's engine (whose loops the
    caller runs), ``"queue"`` by publishing ``run-requested@1`` for other engine processes.
    ``catalog`` is what workflows compile against, ``root`` the repository whose contracts
    ``/v1/contracts`` shows, ``view`` how runs are shown (default: values masked whole).
    ``callbacks``, when given, is put on ``app.state.callbacks`` and the signed-callback router
    (:mod:`accord.adapters.ingress.callbacks`) is mounted."""
    chosen = limits or ApiLimits()
    app = FastAPI(
        title="Accord control plane",
        version=API_VERSION,
        description="Start, follow and steer runs; manage workflows, contracts and keys.",
        openapi_url="/openapi.json",
        docs_url=None,
        redoc_url=None,
    )
    plane = Plane(
        engine=engine,
        control=control,
        limits=chosen,
        starts=starts,
        catalog=catalog,
        contracts=ContractBook(root) if root is not None else None,
        view=view or masked_view,
        jwt=jwt,
    )
    app.state.plane = plane
    app.state.control = control
    app.state.jwt = jwt
    app.state.limiter = RateLimiter(chosen.rate_per_s, chosen.burst)
    if plane.observe not in engine.observers:
        engine.observers.append(plane.observe)
    _install_handlers(app)
    app.include_router(runs.router)
    app.include_router(manage.router)
    app.include_router(importlib.import_module("accord.adapters.ingress.triggers").router)
    app.include_router(importlib.import_module("accord.adapters.ingress.approvals").router)
    importlib.import_module("accord.adapters.ingress.observe").install(app)  # /readyz, /metrics
    app.include_router(importlib.import_module("accord.adapters.ingress.search").router)
    app.include_router(importlib.import_module("accord.adapters.ingress.migration").router)
    ui = importlib.import_module("accord.adapters.ingress.ui")  # /ui/ and the reads it needs
    app.include_router(ui.api)
    app.include_router(ui.pages)

    @app.get("/healthz", tags=["health"], summary="Liveness (no authentication)")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "starts": starts}

    if callbacks is not None:
        # imported here so the application works before the callbacks module is there
        callbacks_module = importlib.import_module("accord.adapters.ingress.callbacks")
        app.state.callbacks = callbacks
        app.include_router(callbacks_module.router)
    app.add_middleware(BodyLimit, max_bytes=chosen.max_body_bytes)
    app.add_middleware(RequestIds)
    return app
