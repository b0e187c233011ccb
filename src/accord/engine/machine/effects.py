"""Engine effects: what the machine asks the shell to do after a commit.

Effects are data. The orchestrator turns them into store rows *in the same commit* as the state
change (outbox entries and timers, I7), then hands the outbox to the dispatcher. Ids are
deterministic (run, stage, attempt, kind), so doing an effect twice is harmless.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias

from accord.engine.machine.events import TimerKind

__all__ = [
    "CancelTimer",
    "DispatchJob",
    "Effect",
    "EmitTelemetry",
    "InvokeAction",
    "RequestCancellation",
    "ScheduleTimer",
    "effect_to_json",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchJob:
    """Publish a job to a worker queue. ``envelope`` is the full wire envelope (docs/architecture.md
    §2)."""

    kind: ClassVar[str] = "dispatch-job"
    job_id: str
    queue: str
    capability: str  # name@version
    envelope: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class InvokeAction:
    """Run an in-process action capability (also finalisers and compensations)."""

    kind: ClassVar[str] = "invoke-action"
    job_id: str
    capability: str
    envelope: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleTimer:
    kind: ClassVar[str] = "schedule-timer"
    timer_id: str
    timer: TimerKind
    due_at_ms: int
    stage: str = ""
    attempt: int = 0
    fence: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelTimer:
    kind: ClassVar[str] = "cancel-timer"
    timer_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestCancellation:
    """Ask a worker to stop an attempt cooperatively. The attempt is already fenced: nothing it
    reports afterwards can change the run, whether or not it stops."""

    kind: ClassVar[str] = "request-cancellation"
    job_id: str
    queue: str | None
    stage: str
    attempt: int
    fence: str
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class EmitTelemetry:
    kind: ClassVar[str] = "emit-telemetry"
    event_id: str
    name: str  # ``stage.completed``, ``run.terminal``, ``callback.rejected`` …
    attributes: dict[str, Any] = field(default_factory=dict)


Effect: TypeAlias = (
    DispatchJob | InvokeAction | ScheduleTimer | CancelTimer | RequestCancellation | EmitTelemetry
)


def effect_to_json(effect: Effect) -> dict[str, Any]:
    doc = {f.name: getattr(effect, f.name) for f in dataclasses.fields(effect)}
    doc["kind"] = effect.kind
    return doc
