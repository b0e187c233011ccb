"""The Worker SDK surface: a :class:`Worker` holds handlers bound to capabilities.

A handler is bound to one capability ``name@version`` and is called with the validated request
payload (defaults applied) and a :class:`Context`::

    worker = Worker("thumbnailer")

    @worker.handler("thumbnail.render@3")
    def render(payload: dict, ctx: Context) -> dict:
        ctx.progress(10, "loading")
        if ctx.cancelled:
            raise TerminalError("cancelled", "cancelled")
        return {...}                       # validated against the result contract

Sync handlers run in a thread, async ones on the loop. Failures are classified by type:
:class:`RetryableError` and :class:`TerminalError` (both :class:`~accord.errors.StageFailed`)
say what they are; any other exception is a retryable ``handler-crashed`` failure, up to a bounded
count per stage, then terminal. Everything about the wire — acceptance, heartbeats, validation,
outcomes — lives in :mod:`accord.worker.runtime`; this module holds no I/O.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from accord.errors import StageFailed

__all__ = [
    "Binding",
    "Cancelled",
    "Context",
    "Handler",
    "RetryableError",
    "TerminalError",
    "Worker",
    "split_ref",
]


@dataclass(eq=False)
class RetryableError(StageFailed):
    """A failure a later attempt may not repeat (``RetryableError("busy", "storage-down")``)."""

    failure_code: str = "retryable"
    retryable: bool = True


@dataclass(eq=False)
class TerminalError(StageFailed):
    """A failure no retry will fix (bad input, unsupported format)."""

    failure_code: str = "terminal"
    retryable: bool = False


@dataclass(eq=False)
class Cancelled(TerminalError):
    """Raised by :meth:`Context.raise_if_cancelled` once the engine asked the attempt to stop."""

    failure_code: str = "cancelled"


Progress = Callable[[float, str], None]


@dataclass(slots=True)
class Context:
    """What a handler knows about the attempt it serves. Thread-safe: sync handlers may call
    :meth:`progress` and read :attr:`cancelled` from their worker thread."""

    run_id: str
    stage: str
    attempt: int
    fence: str
    tenant: str
    capability: str
    idempotency_key: str
    envelope: Mapping[str, Any] = field(repr=False)
    services: Mapping[str, Any] = field(default_factory=dict, repr=False)
    _emit: Progress | None = field(default=None, repr=False)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def cancel(self) -> None:
        self._cancel.set()

    def raise_if_cancelled(self) -> None:
        if self._cancel.is_set():
            raise Cancelled("the engine requested cancellation of this attempt")

    def progress(self, percent: float, message: str = "") -> None:
        """Report progress (0–100); out-of-range values are clamped, never an error."""
        if self._emit is not None:
            self._emit(min(100.0, max(0.0, float(percent))), message[:500])


Handler = Callable[[dict[str, Any], Context], dict[str, Any] | Awaitable[dict[str, Any]]]


def split_ref(capability: str) -> tuple[str, int]:
    """``"thumbnail.render@3"`` → ``("thumbnail.render", 3)``; a clear ``ValueError`` otherwise."""
    name, sep, version = capability.rpartition("@")
    if not sep or not name or not version.isdigit() or int(version) < 1:
        raise ValueError(f"capability {capability!r} must be name@version (version ≥ 1)")
    return name, int(version)


@dataclass(frozen=True, slots=True)
class Binding:
    capability: str
    handler: Handler
    queue: str | None  # None: the capability contract's queue, else the capability name
    is_async: bool


class Worker:
    """A named set of handlers; serve it with :class:`accord.worker.runtime.Runtime`."""

    def __init__(self, name: str, *, services: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self.services: dict[str, Any] = dict(services or {})
        self.bindings: dict[str, Binding] = {}

    def handler(self, capability: str, *, queue: str | None = None) -> Callable[[Handler], Handler]:
        """Decorator binding a sync or async handler to ``capability``."""

        def bind(fn: Handler) -> Handler:
            self.bind(capability, fn, queue=queue)
            return fn

        return bind

    def bind(self, capability: str, fn: Handler, *, queue: str | None = None) -> None:
        split_ref(capability)
        if capability in self.bindings:
            raise ValueError(f"{self.name}: {capability} already has a handler")
        is_async = asyncio.iscoroutinefunction(fn)
        self.bindings[capability] = Binding(capability, fn, queue, is_async)

    @property
    def capabilities(self) -> list[str]:
        return sorted(self.bindings)
