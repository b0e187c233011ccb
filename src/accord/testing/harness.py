"""The testing API: a whole engine in one process, on a clock you move by hand.

:class:`EngineHarness` wires a real :class:`~accord.engine.runtime.orchestrator.Engine` to the
memory store, the memory transport and a :class:`~accord.testing.clock.FakeClock`. Nothing is
mocked: every event goes through the same load → apply → commit → hand-off path as in production.
Time
moves only when the scenario says so, and background loops do not run; the scenario drives them::

    h = EngineHarness(actions={"cache.lookup@1": lookup})
    await h.register(plan)
    run = await h.start_run("model-ingest", {"modelId": "m1"})
    await h.settle()                            # run in-process actions to quiescence
    job = h.job(run, "render-thumbnail")        # the envelope the worker would receive
    await h.accept(run, "render-thumbnail")     # or: await h.send_outcome(outcome(...))
    await h.succeed(run, "render-thumbnail", {"uri": "..."})
    await h.advance(60_000)                     # fires every timer now due
    state, entries = await h.run(run), await h.history(run)

Callbacks default to the current attempt and fence of the stage; pass ``attempt``/``fence`` to
deliver stale or forged ones, or re-send an old :class:`Delivered` event to duplicate it.
:meth:`crash` drops the in-memory engine (caches, running actions, unflushed done-marks) and
starts a fresh one on the same store and transport, as a restarted process would.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

from accord.adapters import open_store, open_transport
from accord.engine.machine.effects import DispatchJob, Effect, InvokeAction
from accord.engine.machine.events import (
    Event,
    HeartbeatReceived,
    ProgressReported,
    StageAccepted,
    StageFailed,
    StageSucceeded,
)
from accord.engine.machine.state import HistoryEntry, RunState
from accord.engine.ports import Delivery, OutboxEntry, Sink, Store, Transport
from accord.engine.runtime.actions import ActionHandler, ActionRegistry
from accord.engine.runtime.orchestrator import Delivered, Engine, EngineOptions
from accord.testing.clock import FakeClock
from accord.workflow.plan import Plan

__all__ = ["EngineHarness"]


class EngineHarness:
    def __init__(
        self,
        *,
        actions: ActionRegistry | Mapping[str, ActionHandler] | None = None,
        clock: FakeClock | None = None,
        store: Store | None = None,
        transport: Transport | None = None,
        sink: Sink | None = None,
    ) -> None:
        self.clock = clock or FakeClock()
        self.store = store or open_store("memory://", clock=self.clock)
        self.transport = transport or open_transport("memory://", clock=self.clock)
        self.registry = actions if isinstance(actions, ActionRegistry) else ActionRegistry(actions)
        self._sink = sink
        self.transitions: list[Delivered] = []
        self.effects: list[tuple[str, Effect]] = []
        self._jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self._crashes = 0
        self.engine = self._new_engine()

    def _new_engine(self) -> Engine:
        return Engine(
            self.store,
            self.transport,
            self.clock,
            options=EngineOptions(owner=f"harness-{self._crashes}", grace_ms=0, lease_ms=1_000),
            actions=self.registry,
            sink=self._sink,
            observers=[self._observe],
        )

    def _observe(self, done: Delivered) -> None:
        self.transitions.append(done)
        for effect in done.effects:
            self.effects.append((done.run_id, effect))
            if isinstance(effect, DispatchJob | InvokeAction):
                self._jobs[(done.run_id, str(effect.envelope.get("stage")))] = effect.envelope

    # -- runs ------------------------------------------------------------------------------

    async def register(self, plan: Plan, *, activate: bool = True) -> str:
        return await self.engine.register_plan(plan, activate=activate)

    async def start_run(
        self,
        workflow: str | Plan,
        context: Mapping[str, Any] | None = None,
        tenant: str = "default",
        run_id: str | None = None,
    ) -> str:
        if isinstance(workflow, Plan):
            await self.register(workflow)
            workflow = workflow.digest
        return await self.engine.start_run(workflow, context, tenant, run_id)

    async def deliver(self, event: Event) -> Delivered:
        return await self.engine.deliver(event)

    def job(self, run_id: str, stage: str) -> dict[str, Any]:
        """The envelope of the latest attempt dispatched or invoked for ``stage``."""
        return self._jobs[(run_id, stage)]

    def _ident(
        self, run_id: str, stage: str, attempt: int | None, fence: str | None
    ) -> dict[str, Any]:
        env = self._jobs.get((run_id, stage), {})
        return {
            "run_id": run_id,
            "stage": stage,
            "attempt": env.get("attempt", 0) if attempt is None else attempt,
            "fence": str(env.get("fence", "")) if fence is None else fence,
        }

    async def accept(
        self, run_id: str, stage: str, *, attempt: int | None = None, fence: str | None = None
    ) -> Delivered:
        return await self.deliver(StageAccepted(**self._ident(run_id, stage, attempt, fence)))

    async def heartbeat(self, run_id: str, stage: str, **who: Any) -> Delivered:
        ident = self._ident(run_id, stage, who.get("attempt"), who.get("fence"))
        return await self.deliver(HeartbeatReceived(**ident))

    async def progress(self, run_id: str, stage: str, fraction: float, **who: Any) -> Delivered:
        ident = self._ident(run_id, stage, who.get("attempt"), who.get("fence"))
        return await self.deliver(ProgressReported(**ident, progress=fraction))

    async def succeed(
        self,
        run_id: str,
        stage: str,
        result: Mapping[str, Any] | None = None,
        *,
        attempt: int | None = None,
        fence: str | None = None,
    ) -> Delivered:
        ident = self._ident(run_id, stage, attempt, fence)
        return await self.deliver(StageSucceeded(**ident, result=dict(result or {})))

    async def fail(
        self,
        run_id: str,
        stage: str,
        *,
        retryable: bool = False,
        code: str = "failed",
        attempt: int | None = None,
        fence: str | None = None,
    ) -> Delivered:
        ident = self._ident(run_id, stage, attempt, fence)
        return await self.deliver(StageFailed(**ident, retryable=retryable, code=code))

    # -- the transport side ----------------------------------------------------------------

    async def send_outcome(self, message_id: str, body: bytes) -> list[Event | None]:
        """Publish an outcome envelope to the outcomes queue and run intake over it."""
        await self.transport.publish(self.engine.intake.queue, message_id, body)
        return await self.process_outcomes()

    async def process_outcomes(self) -> list[Event | None]:
        return [
            event
            for d in await self.take(self.engine.intake.queue)
            for event in await self.engine.intake.process(d)
        ]

    async def take(self, queue: str, limit: int = 10_000) -> list[Delivery]:
        """Every delivery ready on ``queue`` now (leased to the caller; ack or nack them)."""
        taken: list[Delivery] = []
        consumer = self.transport.consume(queue, limit)
        try:
            while len(taken) < limit:
                try:
                    taken.append(await asyncio.wait_for(anext(consumer), 0.02))
                except TimeoutError:
                    break
        finally:
            await consumer.aclose()  # type: ignore[attr-defined]
        return taken

    async def jobs(self, queue: str) -> list[dict[str, Any]]:
        """Take and acknowledge every job waiting on a worker queue; returns their envelopes."""
        out = []
        for delivery in await self.take(queue):
            out.append(json.loads(delivery.body))
            await self.transport.ack(delivery)
        return out

    # -- time and background work ----------------------------------------------------------

    async def settle(self) -> None:
        """Run in-process actions (and what they cause) until none is left running."""
        await self.engine.executor.wait_idle()
        await self.engine.dispatcher.flush()

    async def fire_timers(self) -> int:
        fired = await self.engine.timers.fire_due()
        await self.settle()
        return fired

    async def advance(self, ms: int) -> int:
        """Move the clock, then fire every timer now due; returns how many fired."""
        self.clock.advance(ms)
        return await self.fire_timers()

    async def pump(self) -> int:
        """Sweep the outbox and fire due timers, as the engine's loops would."""
        n = await self.engine.pump()
        await self.settle()
        return n

    async def crash(self) -> Engine:
        """Lose everything in memory, as ``kill -9`` would, and start a fresh engine."""
        await self.engine.executor.abandon()
        self._crashes += 1
        self.engine = self._new_engine()
        return self.engine

    # -- reading ---------------------------------------------------------------------------

    async def run(self, run_id: str) -> RunState:
        state = await self.engine.load(run_id)
        if state is None:
            raise KeyError(run_id)
        return state

    async def history(self, run_id: str) -> list[HistoryEntry]:
        return await self.engine.history(run_id)

    async def outbox(self) -> list[OutboxEntry]:
        """Outbox entries not yet marked done (a peek: a zero lease leaves them claimable)."""
        return await self.store.claim_outbox(100_000, "harness-peek", 0)

    async def close(self) -> None:
        await self.settle()
        await self.transport.close()
        await self.store.close()

    async def __aenter__(self) -> EngineHarness:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def effects_of(self, run_id: str, kinds: Sequence[type] = ()) -> list[Effect]:
        return [
            e for r, e in self.effects if r == run_id and (not kinds or isinstance(e, tuple(kinds)))
        ]
