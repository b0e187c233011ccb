"""In-process actions: capabilities the engine runs itself (``action`` stages, finalisers and
compensations), with the same callback protocol as remote workers.

An action handler is ``async handler(payload, ctx) -> result dict``. It raises
:class:`~accord.errors.StageFailed` for a classified failure; any other exception is reported as a
retryable ``action-crashed`` failure (the handler's fault is not the run's verdict). The executor
never touches the store: it turns the handler's outcome into a ``StageSucceeded`` or
``StageFailed`` event for the attempt named in the envelope and hands it to ``deliver``; the
machine decides, by run, stage, attempt and fence, whether it still counts. Running an action
twice (a republished outbox entry) therefore yields one effective completion (I2); handlers get
the envelope's idempotency key for their own side effects. Sensitive inputs arrive sealed
(:mod:`accord.contracts.sealing`) and are opened here, with the engine's keyring, just before the
handler runs (an input that cannot be opened fails the attempt as ``unsealable-input``); the
handler's result is sealed again where the engine commits it. An outcome whose commit meets a
retryable store error is committed again in place for a while
(:mod:`accord.engine.runtime.holding`), so a short store outage does not make the outbox sweep run
the action, and its side effects, again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from accord.contracts.sealing import Keyring, SealingError, open_all
from accord.engine.machine.events import Event, StageFailed, StageSucceeded
from accord.engine.runtime.holding import Hold
from accord.errors import StageFailed as HandlerFailed

__all__ = ["ActionContext", "ActionExecutor", "ActionHandler", "ActionRegistry", "attempt_of"]


@dataclass(frozen=True, slots=True)
class ActionContext:
    run_id: str
    stage: str
    attempt: int
    fence: str
    capability: str
    idempotency_key: str
    tenant: str
    envelope: Mapping[str, Any] = field(repr=False)


ActionHandler = Callable[[dict[str, Any], ActionContext], Awaitable[dict[str, Any]]]


class ActionRegistry:
    """Capabilities this engine process can run, by ``name@version``."""

    def __init__(self, handlers: Mapping[str, ActionHandler] | None = None) -> None:
        self._handlers: dict[str, ActionHandler] = dict(handlers or {})

    def register(self, capability: str, handler: ActionHandler) -> None:
        self._handlers[capability] = handler

    def get(self, capability: str) -> ActionHandler | None:
        return self._handlers.get(capability)

    def capabilities(self) -> list[str]:
        return sorted(self._handlers)


def attempt_of(envelope: Mapping[str, Any], run_id: str) -> tuple[str, str, int, str]:
    """``(run, stage, attempt, fence)`` named by a job envelope (camelCase wire keys)."""
    run = str(envelope.get("runId") or envelope.get("run_id") or run_id)
    return run, str(envelope.get("stage", "")), int(envelope.get("attempt", 0)), _fence(envelope)


def _fence(envelope: Mapping[str, Any]) -> str:
    fence = envelope.get("fence", "")
    return fence if isinstance(fence, str) else str(fence)


Deliver = Callable[[Event], Awaitable[object]]
log = logging.getLogger("accord.engine.runtime.actions")


class ActionExecutor:
    """Runs action handlers as tasks; ``on_done`` is told which outbox entry finished."""

    def __init__(
        self,
        registry: ActionRegistry,
        deliver: Deliver,
        on_done: Callable[[str], None],
        hold: Hold | None = None,
    ) -> None:
        self._registry = registry
        self._deliver = deliver
        self.hold = hold or Hold()
        self._on_done = on_done
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.keyring: Keyring | None = None  # opens the sealed inputs (the engine sets it)

    def submit(self, entry_id: str, run_id: str, payload: Mapping[str, Any]) -> None:
        if entry_id in self._tasks:  # already running here; a republish changes nothing
            return
        task = asyncio.get_running_loop().create_task(self._run(entry_id, run_id, payload))
        self._tasks[entry_id] = task
        task.add_done_callback(lambda _t: self._tasks.pop(entry_id, None))

    def in_flight(self) -> set[str]:
        return set(self._tasks)

    async def abandon(self) -> None:
        """Cancel every running action, as a process death would (tests and scenarios)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def wait_idle(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    async def _run(self, entry_id: str, run_id: str, payload: Mapping[str, Any]) -> None:
        envelope: Mapping[str, Any] = payload.get("envelope", {})
        capability = str(payload.get("capability", ""))
        run, stage, attempt, fence = attempt_of(envelope, run_id)
        ctx = ActionContext(
            run_id=run,
            stage=stage,
            attempt=attempt,
            fence=fence,
            capability=capability,
            idempotency_key=str(envelope.get("idempotencyKey", entry_id)),
            tenant=str(envelope.get("tenant", "")),
            envelope=envelope,
        )
        ident: dict[str, Any] = {"run_id": run, "stage": stage, "attempt": attempt, "fence": fence}
        handler = self._registry.get(capability)
        event: Event
        if handler is None:
            event = StageFailed(
                **ident,
                retryable=False,
                code="capability-not-registered",
                message=f"no handler registered for {capability}",
                message_id=f"{entry_id}:failed",
            )
        else:
            try:
                inputs = open_all(dict(envelope.get("payload") or {}), self.keyring)
                result = await handler(inputs, ctx)
                event = StageSucceeded(
                    **ident, result=dict(result or {}), message_id=f"{entry_id}:succeeded"
                )
            except SealingError as exc:  # the run's key is gone: no retry brings it back
                event = StageFailed(
                    **ident,
                    retryable=False,
                    code="unsealable-input",
                    message=str(exc),
                    message_id=f"{entry_id}:failed",
                )
            except HandlerFailed as exc:
                event = StageFailed(
                    **ident,
                    retryable=exc.retryable,
                    code=exc.failure_code,
                    message=exc.reason,
                    message_id=f"{entry_id}:failed",
                )
            except Exception as exc:  # the handler's bug is reported, never swallowed
                event = StageFailed(
                    **ident,
                    retryable=True,
                    code="action-crashed",
                    message=type(exc).__name__,
                    message_id=f"{entry_id}:failed",
                )
        try:
            await self.hold.run(lambda: self._deliver(event), "outcome of action %s", capability)
        except Exception:  # not marked done: the outbox sweep runs the action again
            log.exception("outcome of action %s for run %s not committed", capability, run)
            return
        self._on_done(entry_id)
