"""A tiny driver for the pure machine: it stamps time and entropy, keeps the history and the
timers the effects armed, and checks the invariants after every step.

It is deliberately not the engine's shell: no store, no queue, no clock — just enough bookkeeping
to write scenarios as plain calls (``sim.succeed("a")``) and to feed random event streams.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from accord.engine.machine import Transition, apply
from accord.engine.machine.effects import (
    CancelTimer,
    DispatchJob,
    Effect,
    InvokeAction,
    ScheduleTimer,
)
from accord.engine.machine.events import (
    ApprovalDecided,
    Event,
    HeartbeatReceived,
    PoisonReported,
    ProgressReported,
    RunStarted,
    StageAccepted,
    StageFailed,
    StageSucceeded,
    TimerFired,
)
from accord.engine.machine.state import HistoryEntry, RunState
from accord.workflow.plan import Plan
from tests.unit.engine import invariants as inv

T0 = 1_700_000_000_000


class Sim:
    def __init__(
        self, plan: Plan, run_id: str = "run-1", *, check: bool = True, seed: int = 0
    ) -> None:
        self.seed = seed
        self.plan = plan
        self.run_id = run_id
        self.check = check
        self.run: RunState | None = None
        self.now = T0
        self.history: list[HistoryEntry] = []
        self.timers: dict[str, ScheduleTimer] = {}  # live
        self.all_timers: list[ScheduleTimer] = []  # every one ever armed (to fire stale ones)
        self.dispatched: list[DispatchJob | InvokeAction] = []
        self.callbacks: list[Event] = []  # every callback sent, for duplicates and reorderings
        self.last: Transition | None = None
        self._n = 0

    # --- driving ---------------------------------------------------------------------------
    def apply(self, event: Event) -> Transition:
        self._n += 1
        stamped = dataclasses.replace(
            event,
            at_ms=event.at_ms or self.now,
            entropy=event.entropy or f"{self.seed:08x}{self._n:08x}",
        )
        before = self.run
        tr = apply(self.plan, before, stamped)
        self.run, self.last = tr.run, tr
        self.history.extend(tr.history)
        self._track(tr.effects)
        if self.check:
            self._check(before, tr)
        return tr

    def _track(self, effects: tuple[Effect, ...]) -> None:
        for e in effects:
            if isinstance(e, ScheduleTimer):
                self.timers[e.timer_id] = e
                self.all_timers.append(e)
            elif isinstance(e, CancelTimer):
                self.timers.pop(e.timer_id, None)
            elif isinstance(e, DispatchJob | InvokeAction):
                self.dispatched.append(e)

    def _check(self, before: RunState | None, tr: Transition) -> None:
        inv.assert_versions_grow(before, tr.run)
        inv.assert_i7_outbox(before, tr)
        if before is not None:
            inv.assert_i2_one_effective_completion(before, tr)
            inv.assert_i3_fencing(before, self._event(tr), tr)
            inv.assert_i4_no_double_release(before, tr.run, (d.job_id for d in self.dispatched))
            inv.assert_i5_nothing_after_intent(before, tr)
        if not tr.run.terminal:
            inv.assert_i6_deadlines(self.plan, tr.run, self._live_timers())

    def _event(self, tr: Transition) -> Event:
        from accord.engine.machine.events import event_from_json

        return event_from_json(tr.history[0].event)

    def _live_timers(self) -> dict[str, ScheduleTimer]:
        return self.timers

    def start(self, requested_by: str = "key:requester", **context: Any) -> Transition:
        ctx = context or {"modelId": "m-1"}
        return self.apply(
            RunStarted(
                run_id=self.run_id,
                tenant="acme",
                workflow=self.plan.name,
                plan_digest=self.plan.digest,
                context=ctx,
                requested_by=requested_by,
            )
        )

    @property
    def state(self) -> RunState:
        assert self.run is not None
        return self.run

    def ident(self, stage: str) -> dict[str, Any]:
        st = self.state.stages[stage]
        return {"run_id": self.run_id, "stage": stage, "attempt": st.attempt, "fence": st.fence}

    def _callback(self, event: Event) -> Transition:
        self.callbacks.append(event)
        return self.apply(event)

    def accept(self, stage: str) -> Transition:
        return self._callback(StageAccepted(**self.ident(stage)))

    def heartbeat(self, stage: str) -> Transition:
        return self._callback(HeartbeatReceived(**self.ident(stage)))

    def progress(self, stage: str, value: float) -> Transition:
        return self._callback(ProgressReported(**self.ident(stage), progress=value))

    def succeed(self, stage: str, result: dict[str, Any] | None = None) -> Transition:
        return self._callback(StageSucceeded(**self.ident(stage), result=result or {"ok": True}))

    def fail(self, stage: str, *, retryable: bool = False, code: str = "boom") -> Transition:
        return self._callback(StageFailed(**self.ident(stage), retryable=retryable, code=code))

    def poison(self, stage: str, count: int = 5) -> Transition:
        return self._callback(
            PoisonReported(**self.ident(stage), reason="crash-loop", delivery_count=count)
        )

    def decide(
        self,
        stage: str,
        decision: str = "approve",
        *,
        by: str = "key:approver",
        role: str = "operator",
        tenants: tuple[str, ...] = ("acme",),
        **more: Any,
    ) -> Transition:
        """A person's decision on gate ``stage`` (eligible by default)."""
        return self.apply(
            ApprovalDecided(
                run_id=self.run_id,
                stage=stage,
                decision=decision,
                by=by,
                role=role,
                tenants=tenants,
                **more,
            )
        )

    def waiting(self) -> list[str]:
        """Approval gates waiting for a decision, in name order."""
        return sorted(n for n, s in self.state.stages.items() if s.status == "waiting")

    def timer(self, kind: str, stage: str = "") -> ScheduleTimer:
        for t in reversed(self.all_timers):
            if t.timer == kind and t.stage == stage:
                return t
        raise AssertionError(f"no {kind} timer for {stage!r}")

    def fire(self, timer: ScheduleTimer) -> Transition:
        self.now = max(self.now, timer.due_at_ms)
        return self.apply(
            TimerFired(
                run_id=self.run_id,
                timer=timer.timer,
                timer_id=timer.timer_id,
                stage=timer.stage,
                attempt=timer.attempt,
                fence=timer.fence,
            )
        )

    def live(self) -> list[str]:
        """Stages (and pseudo-stages) with a live attempt, in name order."""
        return sorted(
            n
            for n, s in self.state.stages.items()
            if s.current and s.current.status in ("queued", "running")
        )

    def drain(self, results: dict[str, dict[str, Any]] | None = None, limit: int = 100) -> RunState:
        """Deliver success for every live attempt and fire due retries until nothing moves."""
        results = results or {}
        for _ in range(limit):
            if self.state.terminal:
                break
            live = self.live()
            if live:
                self.succeed(live[0], results.get(live[0]))
                continue
            gates = self.waiting()
            if gates:
                result = self.state.stages[gates[0]].result or {}
                if self.now >= result["due_at_ms"]:  # too late to decide: the gate times out
                    self.fire(self.timer("approval", gates[0]))
                else:
                    self.decide(gates[0], "approve", by=f"key:drain-{self._n}")
                continue
            retries = [t for t in self.timers.values() if t.timer == "retry"]
            if not retries:
                break
            self.fire(min(retries, key=lambda t: t.due_at_ms))
        return self.state
