"""Engine events: everything that can happen to a run, as frozen data.

The shell stamps every event with ``at_ms`` (when it was observed) and ``entropy`` (fresh random
hex) *before* the machine sees it. The machine draws fences and jitter only from ``entropy``, so
applying the same recorded events again reproduces the same state exactly (I12) while fences stay
unguessable and unique (I3).

Callback-like events (accepted, heartbeat, progress, succeeded, failed) name the attempt they
belong to by ``stage``, ``attempt`` and ``fence``; the machine accepts them only on an exact match
with the current attempt. Finalisers and compensations are addressed as pseudo-stages
``@finaliser/<index>`` and ``@compensate/<stage>`` so they share the same protocol.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeAlias

__all__ = [
    "CALLBACKS",
    "CancelRequested",
    "Event",
    "HeartbeatReceived",
    "PoisonReported",
    "ProgressReported",
    "RedriveRequested",
    "RunStarted",
    "StageAccepted",
    "StageFailed",
    "StageSucceeded",
    "TimerFired",
    "TimerKind",
    "event_from_json",
    "event_to_json",
]

TimerKind: TypeAlias = Literal["queue", "execution", "heartbeat", "run", "retry"]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Base:
    kind: ClassVar[str]
    run_id: str
    at_ms: int = 0
    entropy: str = ""  # hex; fences and jitter are derived from it


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStarted(_Base):
    kind: ClassVar[str] = "run-started"
    tenant: str
    workflow: str
    plan_digest: str
    context: dict[str, Any] = field(default_factory=dict)
    contracts: dict[str, str] = field(default_factory=dict)  # pinned ref → digest
    engine_version: str = "1"


@dataclass(frozen=True, slots=True, kw_only=True)
class _AttemptEvent(_Base):
    stage: str
    attempt: int
    fence: str
    message_id: str = ""  # the callback's own id (dedup key), when it has one


@dataclass(frozen=True, slots=True, kw_only=True)
class StageAccepted(_AttemptEvent):
    kind: ClassVar[str] = "stage-accepted"
    worker_id: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatReceived(_AttemptEvent):
    kind: ClassVar[str] = "heartbeat"


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgressReported(_AttemptEvent):
    kind: ClassVar[str] = "progress"
    progress: float = 0.0  # 0..1
    note: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class StageSucceeded(_AttemptEvent):
    kind: ClassVar[str] = "stage-succeeded"
    result: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageFailed(_AttemptEvent):
    kind: ClassVar[str] = "stage-failed"
    retryable: bool
    code: str = "failed"
    message: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class TimerFired(_Base):
    kind: ClassVar[str] = "timer-fired"
    timer: TimerKind
    timer_id: str
    stage: str = ""  # empty for the run deadline
    attempt: int = 0
    fence: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelRequested(_Base):
    kind: ClassVar[str] = "cancel-requested"
    reason: str = ""
    by: str = "operator"


@dataclass(frozen=True, slots=True, kw_only=True)
class RedriveRequested(_Base):
    """Operator re-drive of a failed, timed-out or quarantined stage: a new fenced attempt."""

    kind: ClassVar[str] = "redrive-requested"
    stage: str
    by: str = "operator"


@dataclass(frozen=True, slots=True, kw_only=True)
class PoisonReported(_AttemptEvent):
    """The transport or intake quarantined a job: invalid envelope or past the delivery limit."""

    kind: ClassVar[str] = "poison-reported"
    reason: str = ""
    delivery_count: int = 0


Event: TypeAlias = (
    RunStarted
    | StageAccepted
    | HeartbeatReceived
    | ProgressReported
    | StageSucceeded
    | StageFailed
    | TimerFired
    | CancelRequested
    | RedriveRequested
    | PoisonReported
)


# what a worker (or the engine's action executor) reports about one attempt: each is fenced
CALLBACKS = (
    StageAccepted,
    HeartbeatReceived,
    ProgressReported,
    StageSucceeded,
    StageFailed,
    PoisonReported,
)
_BY_KIND: dict[str, type[Any]] = {
    c.kind: c
    for c in (
        RunStarted,
        StageAccepted,
        HeartbeatReceived,
        ProgressReported,
        StageSucceeded,
        StageFailed,
        TimerFired,
        CancelRequested,
        RedriveRequested,
        PoisonReported,
    )
}


def event_to_json(event: Event) -> dict[str, Any]:
    doc = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
    doc["kind"] = event.kind
    return doc


def event_from_json(doc: dict[str, Any]) -> Event:
    """Inverse of :func:`event_to_json`; raises ``ValueError`` on an unknown kind or field."""
    data = dict(doc)
    kind = data.pop("kind", None)
    cls = _BY_KIND.get(str(kind))
    if cls is None:
        raise ValueError(f"unknown event kind {kind!r}")
    try:
        event: Event = cls(**data)
    except TypeError as exc:
        raise ValueError(f"malformed {kind} event: {exc}") from None
    return event
