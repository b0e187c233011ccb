"""Stateful property test of the engine shell over the testing harness.

Hypothesis drives random interleavings against a real engine (memory store and queue, fake
clock): run starts, worker callbacks for the current attempt, duplicated and reordered ones
(re-delivering any earlier event), stale attempts and forged fences, timer firings after time
jumps, operator cancels and re-drives, and crashes (the in-memory engine is dropped and a fresh
one reloads from the store and sweeps the outbox). After every step each run is audited
incrementally (I2, I3, I4, I5, I6, I12); at the end every run is driven to quiescence and must be
terminal with a history that replays to its record (I1, I12).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from accord.engine.machine.events import (
    CancelRequested,
    Event,
    HeartbeatReceived,
    RedriveRequested,
    StageAccepted,
    StageFailed,
    StageSucceeded,
)
from accord.engine.machine.state import ACTIVE_ATTEMPT, RunState
from accord.engine.runtime.actions import ActionContext, ActionHandler, ActionRegistry
from accord.testing.harness import EngineHarness
from accord.testing.invariants import RunAuditor, assert_i1_terminal
from accord.testing.plans import model_ingest_shape
from accord.testing.strategies import synthetic_catalog, valid_workflows
from accord.workflow.compiler import compile_definition
from accord.workflow.plan import Plan

T = TypeVar("T")
# 200 examples x 50 steps take ~20 s of CPU; leave room for a heavily loaded runner
pytestmark = pytest.mark.timeout(300)

SHAPES = [
    model_ingest_shape(name="p-plain", max_attempts=1),
    model_ingest_shape(name="p-retry", max_attempts=3),
    model_ingest_shape(name="p-actions", lookup_action=True, finaliser=True, max_attempts=2),
    model_ingest_shape(name="p-deadline", finaliser=True, deadline_ms=200_000, max_attempts=2),
]
CATALOG = synthetic_catalog()
# hand-built model-ingest shapes, and random valid workflows compiled by the real compiler
PLANS = st.one_of(
    st.sampled_from(SHAPES),
    valid_workflows(max_segments=4).map(lambda doc: compile_definition(doc, CATALOG).unwrap()),
)
CONTEXT = {"modelId": "m", "id": "x", "count": 2, "flag": True}
RESULT = {"ok": True, "score": 0.5, "label": "l", "nested": {"x": 1}, "hit": False}
REDRIVABLE = {"failed", "timed-out", "quarantined", "cancelled"}
# weighted towards progress, so runs get deep into their plans before something goes wrong
CALLBACKS = ["accepted", "succeeded"] * 3 + ["heartbeat", "failed-retryable", "failed-terminal"]


class AnyAction(ActionRegistry):
    """Every action capability succeeds (finalisers, lookups, compensations)."""

    def get(self, capability: str) -> ActionHandler | None:
        async def ok(payload: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
            return {"hit": False, "by": capability}

        return ok


class ShellMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.h = EngineHarness(actions=AnyAction())
        self.runs: dict[str, Plan] = {}
        self.auditors: dict[str, RunAuditor] = {}
        self.sent: list[Event] = []
        self.states: dict[str, RunState] = {}  # as of the last invariant check (every step)

    def _do(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    @initialize(plan=PLANS)
    def first_run(self, plan: Plan) -> None:
        self.start(plan)

    @rule(plan=PLANS)
    def start(self, plan: Plan) -> None:
        if len(self.runs) >= 3:
            return
        rid = self._do(self.h.start_run(plan, CONTEXT, run_id=f"r{len(self.runs)}"))
        self.runs[rid] = plan
        self.auditors[rid] = RunAuditor(plan)
        self._do(self.h.settle())
        self.states[rid] = self._do(self.h.run(rid))

    @rule(
        pick=st.integers(0, 1000),
        kind=st.sampled_from(CALLBACKS),
        variant=st.sampled_from(["current", "current", "current", "old-attempt", "forged"]),
    )
    def callback(self, pick: int, kind: str, variant: str) -> None:
        live = self._live(self.states)
        if not live:
            return
        run_id, stage, attempt, fence = live[pick % len(live)]
        if variant == "old-attempt":
            attempt = max(1, attempt - 1)
        elif variant == "forged":
            fence = "f" * 32
        ident: dict[str, Any] = {"run_id": run_id, "stage": stage, "attempt": attempt}
        ident["fence"] = fence
        event: Event
        if kind == "accepted":
            event = StageAccepted(**ident)
        elif kind == "heartbeat":
            event = HeartbeatReceived(**ident)
        elif kind == "succeeded":
            event = StageSucceeded(**ident, result=RESULT | {"score": pick / 1000})
        else:
            event = StageFailed(**ident, retryable=kind == "failed-retryable", code="boom")
        self._send(event)

    @rule(pick=st.integers(0, 10_000))
    def redeliver(self, pick: int) -> None:
        """A duplicate, or (for an older event) a reordered one."""
        if self.sent:
            self._send(self.sent[pick % len(self.sent)])

    @rule(ms=st.sampled_from([500, 2_000, 10_000, 61_000, 310_000]))
    def advance(self, ms: int) -> None:
        self._do(self.h.advance(ms))

    @rule()
    def crash(self) -> None:
        self._do(self.h.crash())
        self._do(self.h.pump())

    @rule(pick=st.integers(0, 1000))
    def cancel(self, pick: int) -> None:
        if pick % 4 == 0:  # rare: most runs should get somewhere first
            run_id = sorted(self.runs)[pick % len(self.runs)]
            self._send(CancelRequested(run_id=run_id, reason="test"))

    @rule(pick=st.integers(0, 1000))
    def redrive(self, pick: int) -> None:
        if pick % 3:
            return
        run_id = sorted(self.runs)[pick % len(self.runs)]
        state = self.states[run_id]
        broken = [n for n, s in state.stages.items() if s.status in REDRIVABLE]
        stages = sorted(broken) or sorted(state.stages)
        self._send(RedriveRequested(run_id=run_id, stage=stages[pick % len(stages)]))

    def _send(self, event: Event) -> None:
        self._do(self.h.deliver(event))
        self.sent.append(event)
        self._do(self.h.settle())

    @staticmethod
    def _live(states: dict[str, RunState]) -> list[tuple[str, str, int, str]]:
        live = []
        for run_id, state in sorted(states.items()):
            for name, stage in sorted(state.stages.items()):
                cur = stage.current
                if cur is not None and cur.status in ACTIVE_ATTEMPT and not name.startswith("@"):
                    live.append((run_id, name, cur.attempt, cur.fence))
        return live

    @invariant()
    def audited(self) -> None:
        for run_id, auditor in self.auditors.items():
            state = self.states[run_id] = self._do(self.h.run(run_id))
            if state.seq != auditor.seen:  # otherwise nothing new to fold
                auditor.observe(state, self._do(self.h.history(run_id)))
            else:
                assert auditor.shadow == state, f"I12: run {run_id} changed without history"

    def teardown(self) -> None:
        try:
            if self.runs:
                self._do(self._drain())
        finally:
            self._do(self.h.close())
            self.loop.close()

    async def _drain(self) -> None:
        for _ in range(60):
            live = self._live({r: await self.h.run(r) for r in self.runs})
            for run_id, stage, attempt, fence in live:
                ident: dict[str, Any] = {"run_id": run_id, "stage": stage, "attempt": attempt}
                ident["fence"] = fence
                await self.h.deliver(StageAccepted(**ident))
                await self.h.deliver(StageSucceeded(**ident, result=RESULT))
                await self.h.settle()
            states = [await self.h.run(r) for r in sorted(self.runs)]
            if all(s.terminal for s in states):
                break
            if not live:
                await self.h.advance(60_000)
        for run_id in sorted(self.runs):
            state = await self.h.run(run_id)
            assert_i1_terminal(state)
            self.auditors[run_id].observe(state, await self.h.history(run_id))


ShellMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestShellStateful = ShellMachine.TestCase
