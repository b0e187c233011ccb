"""A mutable draft of one run, alive for the length of one :func:`~accord.engine.machine.apply`.

The machine's rules read more plainly as "set this, emit that" than as nested
``dataclasses.replace`` calls, so a transition works on a :class:`Draft` and freezes it at the
end. The draft copies only the containers it changes (the stage map, the released list) and shares
everything else — context, results, untouched stages — with the record it started from. Every
status change goes through :meth:`Draft.put`, which checks it against the transition table.
"""

from __future__ import annotations

from typing import Any

from accord.engine.machine import ids
from accord.engine.machine.effects import CancelTimer, Effect, EmitTelemetry, ScheduleTimer
from accord.engine.machine.events import TimerKind
from accord.engine.machine.state import AttemptState, RunState, StageState, evolve
from accord.engine.machine.transitions import check_attempt, check_run, check_stage
from accord.workflow.plan import Plan

__all__ = ["Draft"]


class Draft:
    def __init__(self, plan: Plan, run: RunState, at_ms: int, entropy: str) -> None:
        self.plan = plan
        self.base = run
        self.at_ms = at_ms
        self.entropy = entropy
        self.seq = run.seq + 1
        self.stages: dict[str, StageState] = dict(run.stages)
        self.status = run.status
        self.intent = run.intent
        self.released: list[str] = list(run.released)
        self.completion_order = run.completion_order
        self.compensations = run.compensations
        self.finalisers = run.finalisers
        self.join_arrivals = run.join_arrivals
        self.branch_states = run.branch_states
        self.result = run.result
        self.error = run.error
        self.effects: list[Effect] = []
        self.notes: list[str] = []
        self.rerouted = False  # a decision or gate chose a route: check for skipped stages

    # --- identity shared with RunState, for envelopes and payloads -----------------------------
    @property
    def run_id(self) -> str:
        return self.base.run_id

    @property
    def context(self) -> Any:
        return self.base.context

    # --- changes -------------------------------------------------------------------------------
    def put(self, stage: StageState) -> None:
        old = self.stages[stage.name]
        check_stage(stage.name, old.status, stage.status)
        before, after = old.current, stage.current
        if before is not None and after is not None and before.attempt == after.attempt:
            check_attempt(stage.name, before.status, after.status)
        self.stages[stage.name] = stage

    def set_attempt(self, name: str, status: str | None = None, **changes: Any) -> StageState:
        """Replace the current attempt of ``name`` (status checked against the table)."""
        st = self.stages[name]
        cur = st.current
        assert cur is not None, f"{name} has no attempt"
        if status is not None:
            changes["status"] = status
        new = evolve(cur, **changes)
        return evolve(st, attempts=(*st.attempts[:-1], new))

    def set_status(self, status: str) -> None:
        check_run(self.run_id, self.status, status)
        self.status = status

    def release(self, source: str, target: str) -> bool:
        """Record the edge; ``False`` when it was released before (I4)."""
        edge = ids.edge_id(source, target)
        if edge in self.released:
            return False
        self.released.append(edge)
        return True

    # --- effects -------------------------------------------------------------------------------
    def emit(self, effect: Effect) -> None:
        self.effects.append(effect)

    def telemetry(self, name: str, subject: str = "", **attributes: Any) -> None:
        attrs = {"runId": self.run_id, "workflow": self.base.workflow, **attributes}
        if subject:
            attrs["stage"] = subject
        event_id = ids.telemetry_id(self.run_id, self.seq, name, subject)
        self.effects.append(EmitTelemetry(event_id=event_id, name=name, attributes=attrs))

    def timer(
        self, kind: TimerKind, due_at_ms: int, stage: str = "", attempt: int = 0, fence: str = ""
    ) -> None:
        tid = ids.timer_id(self.run_id, stage, attempt, kind)
        self.effects.append(
            ScheduleTimer(
                timer_id=tid,
                timer=kind,
                due_at_ms=due_at_ms,
                stage=stage,
                attempt=attempt,
                fence=fence,
            )
        )

    def cancel_timers(self, stage: str, attempt: AttemptState, *kinds: str) -> None:
        for kind in kinds:
            self.effects.append(
                CancelTimer(timer_id=ids.timer_id(self.run_id, stage, attempt.attempt, kind))
            )

    def cancel_clocks(self, stage: str, attempt: AttemptState) -> None:
        """Cancel the clocks a live attempt has armed: queue while queued, else execution and
        (when configured) heartbeat."""
        if attempt.status == "queued":
            self.cancel_timers(stage, attempt, "queue")
        elif attempt.heartbeat_due_ms is not None:
            self.cancel_timers(stage, attempt, "execution", "heartbeat")
        else:
            self.cancel_timers(stage, attempt, "execution")

    def freeze(self) -> RunState:
        return evolve(
            self.base,
            stages=self.stages,
            status=self.status,
            intent=self.intent,
            released=tuple(self.released),
            completion_order=self.completion_order,
            compensations=self.compensations,
            finalisers=self.finalisers,
            join_arrivals=self.join_arrivals,
            branch_states=self.branch_states,
            result=self.result,
            error=self.error,
            seq=self.seq,
        )
