"""Health and metrics routes of the control plane (docs/observability.md).

``GET /readyz``   whether this process can serve: the store, the transport and (when one is
                  attached as ``app.state.projection``) the search projection each answer within
                  :data:`CHECK_S`; 200 with every check ``ok``, else 503 naming what failed. No
                  authentication, like ``/healthz`` (liveness, in ``ingress/app.py``).
``GET /v1/alerts`` the alerts of ``app.state.alerts`` (an
                  :class:`~accord.adapters.telemetry.alerts.AlertBook`; none attached: an empty
                  list with ``evaluating`` false); a ``viewer`` key or better.
``GET /metrics``  the process's metrics in the Prometheus text exposition format
                  (:mod:`accord.adapters.telemetry.metrics`); labels never carry a tenant, a run id
                  or a payload value, so the route needs no authentication either.

Neither route says anything about a run: health is separate from outcomes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from accord.adapters import reach_transport
from accord.adapters.ingress.auth import authorizer
from accord.adapters.ingress.problems import Problem
from accord.adapters.telemetry.metrics import metrics, prometheus_text

__all__ = ["CHECK_S", "router"]

CHECK_S = 2.0
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"

router = APIRouter(tags=["health"])


async def _check(probe: Any) -> str:
    try:
        await asyncio.wait_for(probe, CHECK_S)
    except TimeoutError:
        return f"no answer within {CHECK_S:g}s"
    except Exception as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        return f"{type(exc).__name__}: {first}"[:300]
    return "ok"


@router.get("/readyz", summary="Readiness: store, transport and projection reachable")
async def readyz(request: Request) -> JSONResponse:
    engine = request.app.state.plane.engine
    checks = {
        "store": await _check(engine.store.live_capabilities(0)),
        "transport": await _check(reach_transport(engine.transport)),
    }
    projection = getattr(request.app.state, "projection", None)
    if projection is not None:  # one cheap read of the search projection
        checks["projection"] = await _check(projection.get("readyz"))
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse(
        {"status": "ready" if ready else "not-ready", "checks": checks},
        status_code=200 if ready else 503,
    )


@router.get("/v1/alerts", summary="Alerts raised by the engine's rules, newest first",
            dependencies=[Depends(authorizer("viewer"))])  # fmt: skip
async def alerts(request: Request, state: str | None = None) -> JSONResponse:
    if state not in (None, "open", "resolved"):
        raise Problem(422, "invalid-request", "state must be open or resolved",
                      errors=[{"field": "query.state", "message": "open or resolved"}])  # fmt: skip
    book = getattr(request.app.state, "alerts", None)
    found = [] if book is None else await asyncio.to_thread(book.list, state)
    return JSONResponse({"alerts": [a.to_json() for a in found], "evaluating": book is not None})


@router.get("/metrics", summary="Metrics, Prometheus text format", response_class=Response)
async def prometheus() -> Response:
    return Response(prometheus_text(metrics()), media_type=PROMETHEUS_TEXT)


def install(app: Any) -> None:
    """Mount the routes on ``app`` and record its engine's transitions into the process's
    metrics (one observer per engine)."""
    from accord.adapters.telemetry.metrics import EngineMetrics  # noqa: PLC0415

    app.include_router(router)
    engine = app.state.plane.engine
    if not any(isinstance(o, EngineMetrics) for o in engine.observers):
        EngineMetrics.attach(engine)
