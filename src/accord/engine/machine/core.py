"""``apply(plan, run, event) -> Transition``: the engine's one pure function.

The rules it follows, and the table of legal status changes, are in
:mod:`accord.engine.machine.transitions`; this module is the front door. It creates a run from
``RunStarted``, routes every other event to its handler, and turns the outcome into a
:class:`Transition`: the next record, the effects to carry out, and exactly one history entry.

A refused event is a value, not an exception: the record comes back unchanged except for ``seq``
(the refusal is history too), with a ``callback.rejected`` telemetry effect for refused callbacks
other than duplicates — a duplicate produces nothing at all (I2) — and a ``CancelTimer`` for a
fired timer that no longer applies, so the store stops offering it. Only wiring mistakes raise
:class:`~accord.errors.EngineError`: an event for a run that does not exist, or a plan whose
digest is not the run's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from accord.engine.machine import clocks, gates, ids, migrate, outcomes
from accord.engine.machine.draft import Draft
from accord.engine.machine.effects import Effect, EmitTelemetry
from accord.engine.machine.events import (
    CALLBACKS,
    ApprovalDecided,
    CancelRequested,
    Event,
    HeartbeatReceived,
    PoisonReported,
    ProgressReported,
    RedriveRequested,
    RunMigrated,
    RunStarted,
    StageAccepted,
    StageFailed,
    StageSucceeded,
    TimerFired,
)
from accord.engine.machine.flow import route, skip_unreachable
from accord.engine.machine.state import HistoryEntry, RunState, StageState, evolve
from accord.errors import EngineError
from accord.workflow.plan import Plan

__all__ = ["ENGINE_VERSION", "Transition", "apply"]

ENGINE_VERSION = "1"
_START = "@start"

_HANDLERS: dict[type[Any], Callable[[Draft, Any], outcomes.Refusal | None]] = {
    StageAccepted: outcomes.on_accepted,
    HeartbeatReceived: outcomes.on_heartbeat,
    ProgressReported: outcomes.on_progress,
    StageSucceeded: outcomes.on_succeeded,
    StageFailed: outcomes.on_failed,
    PoisonReported: outcomes.on_poison,
    TimerFired: clocks.on_timer,
    CancelRequested: outcomes.on_cancel,
    RedriveRequested: outcomes.on_redrive,
    ApprovalDecided: gates.on_decision,
    RunMigrated: migrate.on_migrated,
}


@dataclass(frozen=True, slots=True)
class Transition:
    run: RunState
    effects: tuple[Effect, ...]
    history: tuple[HistoryEntry, ...]

    @property
    def accepted(self) -> bool:
        return all(h.accepted for h in self.history)


def apply(plan: Plan, run: RunState | None, event: Event) -> Transition:
    """Apply one event. Pure and deterministic; domain refusals come back as recorded data."""
    if isinstance(event, RunStarted):
        if run is not None:
            return _refuse(run, event, outcomes.Refusal("duplicate", "the run has already started"))
        return _start(plan, event)
    if run is None:
        raise EngineError(f"run {event.run_id!r} does not exist: only run-started creates a run")
    if run.plan_digest != plan.digest:
        raise EngineError(f"run {run.run_id!r} is pinned to {run.plan_digest}, not {plan.digest}")
    if event.run_id != run.run_id:
        return _refuse(
            run, event, outcomes.Refusal("invalid", f"event is for run {event.run_id!r}")
        )
    d = Draft(plan, run, event.at_ms, event.entropy)
    refusal = _HANDLERS[type(event)](d, event)
    if refusal is not None:
        return _refuse(run, event, refusal)
    return _commit(d, event)


_FIELDS: dict[type[Any], tuple[str, ...]] = {}


def _field_names(cls: type[Any]) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _event_json(event: Event) -> dict[str, Any]:
    """``event_to_json`` with the field list looked up once per event class (hot path)."""
    doc = {name: getattr(event, name) for name in _field_names(type(event))}
    if doc.get("sampled") is True:  # RunStarted: written only when false (event_to_json)
        del doc["sampled"]
    doc["kind"] = event.kind
    return doc


def _commit(d: Draft, event: Event) -> Transition:
    if d.rerouted:
        skip_unreachable(d)
    entry = HistoryEntry(
        seq=d.seq,
        at_ms=event.at_ms,
        event=_event_json(event),
        accepted=True,
        note="; ".join(d.notes),
    )
    return Transition(d.freeze(), tuple(d.effects), (entry,))


def _refuse(run: RunState, event: Event, refusal: outcomes.Refusal) -> Transition:
    reason, note, effects = refusal
    seq = run.seq + 1
    if isinstance(event, CALLBACKS) and reason != "duplicate":
        attrs = {
            "runId": run.run_id,
            "stage": event.stage,
            "attempt": event.attempt,
            "reason": reason,
        }
        tid = ids.telemetry_id(run.run_id, seq, "callback.rejected", event.stage)
        effects = (EmitTelemetry(event_id=tid, name="callback.rejected", attributes=attrs),)
    entry = HistoryEntry(
        seq=seq,
        at_ms=event.at_ms,
        event=_event_json(event),
        accepted=False,
        reason=reason,
        note=note,
    )
    return Transition(evolve(run, seq=seq), effects, (entry,))


def _start(plan: Plan, event: RunStarted) -> Transition:
    if event.plan_digest != plan.digest:
        raise EngineError(f"run-started names plan {event.plan_digest}, not {plan.digest}")
    deadline = event.at_ms + plan.deadline_ms if plan.deadline_ms is not None else None
    base = RunState(
        run_id=event.run_id,
        tenant=event.tenant,
        workflow=event.workflow,
        plan_digest=plan.digest,
        dsl_version=plan.dsl_version,
        compiler_version=plan.compiler_version,
        engine_version=event.engine_version,
        contracts={**plan.contracts, **event.contracts},
        context=event.context,
        requested_by=event.requested_by,
        sampled=event.sampled,
        stages={s.name: StageState(name=s.name, kind=s.type) for s in plan.stages},
        started_at_ms=event.at_ms,
        deadline_at_ms=deadline,
    )
    d = Draft(plan, base, event.at_ms, event.entropy)
    if deadline is not None:
        d.timer("run", deadline)
    d.telemetry("run.started", plan=plan.digest)
    route(d, _START, plan.entry)
    return _commit(d, event)
