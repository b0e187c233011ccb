"""What every route of the control plane reaches: the engine, the control file, the views.

:class:`Plane` is put on ``app.state.plane`` by :func:`~accord.adapters.ingress.app.create_app`;
routes take it with :func:`plane`. It holds no business rule of its own: starting, cancelling
and re-driving runs go through the :class:`~accord.engine.runtime.orchestrator.Engine`, and
activation through :mod:`accord.workflow.activation`, as the CLI does.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import Request

from accord.adapters.ingress.auth import JwtVerifier, Principal
from accord.adapters.ingress.contracts import ContractBook
from accord.adapters.ingress.control import ControlStore
from accord.adapters.ingress.limits import ApiLimits
from accord.adapters.ingress.problems import Problem
from accord.contracts.catalog import Catalog
from accord.contracts.redact import MASK
from accord.engine.machine.state import RunState
from accord.engine.ports import Store
from accord.engine.runtime.orchestrator import Delivered, Engine

__all__ = ["PLATFORM_TENANT", "Plane", "RunView", "masked_view", "plane", "request_id"]

PLATFORM_TENANT = "*"  # audit records of actions that belong to no tenant (workflows, keys)

# (store, run, its history as JSON) → (the run as JSON, the history as JSON, a scrub pattern):
# how a run is shown, sensitive values masked (``accord serve`` passes the CLI's redaction)
RunView = Callable[
    [Store, RunState, list[dict[str, Any]]],
    Awaitable[tuple[dict[str, Any], list[dict[str, Any]], re.Pattern[str] | None]],
]
_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


async def masked_view(
    store: Store, run: RunState, history: list[dict[str, Any]]
) -> tuple[dict[str, Any], list[dict[str, Any]], re.Pattern[str] | None]:
    """The view used when none is given: every context and result value masked whole."""

    def mask(value: Any) -> Any:
        return {k: MASK for k in value} if isinstance(value, dict) else MASK

    doc = run.to_json()
    doc["context"] = mask(doc["context"])
    for stage in doc["stages"].values():
        if stage.get("result") is not None:
            stage["result"] = mask(stage["result"])
    if doc.get("result") is not None:
        doc["result"] = mask(doc["result"])
    shown = []
    for entry in history:
        event = dict(entry.get("event") or {})
        for name in ("context", "result"):
            if name in event:
                event[name] = mask(event[name])
        shown.append({**entry, "event": event})
    return doc, shown, None


@dataclass
class Plane:
    engine: Engine
    control: ControlStore
    limits: ApiLimits
    # "engine": this process runs the engine and starts runs itself; "queue": runs are asked for
    # with run-requested@1 on the transport, for the engines started with `accord engine run`
    starts: Literal["engine", "queue"] = "engine"
    catalog: Catalog | None = None  # what workflows are compiled against
    contracts: ContractBook | None = None
    view: RunView = masked_view
    jwt: JwtVerifier | None = None
    _wakers: dict[str, set[asyncio.Event]] = field(default_factory=dict)

    @property
    def store(self) -> Store:
        return self.engine.store

    # -- runs ------------------------------------------------------------------------------

    async def visible_run(self, principal: Principal, run_id: str) -> RunState:
        """The run, when it exists and is of one of the principal's tenants; 404 otherwise (a
        run of another tenant is not said to exist)."""
        run = await self.engine.load(run_id) if _ID.fullmatch(run_id) else None
        if run is None or not principal.can_see(run.tenant):
            raise Problem(404, "run-not-found", f"no run {run_id!r}", run_id=run_id)
        return run

    async def shown(
        self, run: RunState
    ) -> tuple[dict[str, Any], list[dict[str, Any]], re.Pattern[str] | None]:
        history = await self.store.history(run.run_id)
        return await self.view(self.store, run, [dict(h) for h in history])

    # -- live history (SSE) ----------------------------------------------------------------

    def observe(self, done: Delivered) -> None:
        """An engine observer: wakes the event streams of the run a commit changed."""
        for event in self._wakers.get(done.run_id, ()):
            event.set()

    def waker(self, run_id: str) -> asyncio.Event:
        event = asyncio.Event()
        self._wakers.setdefault(run_id, set()).add(event)
        return event

    def drop_waker(self, run_id: str, event: asyncio.Event) -> None:
        found = self._wakers.get(run_id)
        if found is not None:
            found.discard(event)
            if not found:
                del self._wakers[run_id]

    # -- audit -----------------------------------------------------------------------------

    def audit(
        self,
        request: Request,
        principal: Principal,
        tenant: str,
        action: str,
        target: str,
        **detail: object,
    ) -> None:
        self.control.audit(
            principal.id, tenant, request_id(request), action=action, target=target, detail=detail
        )


def plane(request: Request) -> Plane:
    found: Plane = request.app.state.plane
    return found


def request_id(request: Request) -> str:
    """The request's id: its ``X-Request-ID`` when that is a safe token, else a fresh one (the
    response carries it back in the same header)."""
    known = getattr(request.state, "request_id", None)
    if isinstance(known, str):
        return known
    asked = request.headers.get("x-request-id", "")
    rid = asked if _ID.fullmatch(asked) else f"req_{secrets.token_hex(8)}"
    request.state.request_id = rid
    return rid
