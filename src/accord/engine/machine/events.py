"""Engine events: everything that can happen to a run, as frozen data.

The shell stamps every event with ``at_ms`` (when it was observed) and ``entropy`` (fresh random
hex) *before* the machine sees it. The machine draws fences and jitter only from ``entropy``, so
applying the same recorded events again reproduces the same state exactly (I12) while fences stay
unguessable and unique (I3).

Callback-like events (accepted, heartbeat, progress, succeeded, failed) name the attempt they
belong to by ``stage``, ``attempt`` and ``fence``; the machine accepts them only on an exact match
with the current attempt. Finalisers and compensations are addressed as pseudo-stages
``@finaliser/<index>`` and ``@compensate/<stage>`` so they share the same protocol.

A run moves to another plan version by :class:`RunMigrated`, which carries the decision (who,
why, from, to, the stage map) and what the shell's proof found wrong, if anything; the machine
refuses a migration with problems, so a refused migration is recorded too.

An approval gate is decided by :class:`ApprovalDecided`. The shell stamps it with who decided
(principal, role, tenants) and with what it found wrong in the form data against the gate's form
contract (``form_problems``); the machine alone decides whether the decision counts, so a refused
decision is recorded like any refused event and replay needs nothing but the history.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeAlias

__all__ = [
    "CALLBACKS",
    "ApprovalDecided",
    "CancelRequested",
    "Event",
    "HeartbeatReceived",
    "PoisonReported",
    "ProgressReported",
    "RedriveRequested",
    "RunMigrated",
    "RunStarted",
    "StageAccepted",
    "StageFailed",
    "StageSucceeded",
    "TimerFired",
    "TimerKind",
    "event_from_json",
    "event_to_json",
]

TimerKind: TypeAlias = Literal["queue", "execution", "heartbeat", "run", "retry", "approval"]


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
    requested_by: str = ""  # the principal that asked for the run, when known
    # which version admitted the run and why (``{"digest", "reason", ...}``; see
    # :mod:`accord.workflow.canary`); empty for runs started before canaries existed
    admission: dict[str, Any] = field(default_factory=dict)
    # the engine's trace-sampling decision for the run (docs/observability.md, "Sampling"): the
    # flags of every job's traceparent; written only when false, so earlier records keep their form
    sampled: bool = True


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
class ApprovalDecided(_Base):
    """A person's decision on a waiting approval gate: ``approve`` or ``reject``."""

    kind: ClassVar[str] = "approval-decided"
    stage: str
    decision: str  # approve | reject
    by: str  # the principal's id
    role: str = ""
    tenants: tuple[str, ...] = ()
    comment: str = ""
    form: dict[str, Any] = field(default_factory=dict)
    form_problems: tuple[str, ...] = ()  # what the shell found against the form contract


@dataclass(frozen=True, slots=True, kw_only=True)
class PoisonReported(_AttemptEvent):
    """The transport or intake quarantined a job: invalid envelope or past the delivery limit."""

    kind: ClassVar[str] = "poison-reported"
    reason: str = ""
    delivery_count: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RunMigrated(_Base):
    """An authorised move of a live run to another plan version (see
    :mod:`accord.engine.machine.migrate`): who, why, from, to and the stage map the shell proved
    safe with :mod:`accord.workflow.migration`."""

    kind: ClassVar[str] = "run-migrated"
    from_digest: str
    to_digest: str
    renamed: dict[str, str] = field(default_factory=dict)  # old stage name → new
    added: dict[str, str] = field(default_factory=dict)  # new stage name → its type
    retyped: dict[str, str] = field(default_factory=dict)  # kept pending stage → its new type
    removed: tuple[str, ...] = ()  # old stage names the new plan drops
    contracts: dict[str, str] = field(default_factory=dict)  # the new plan's pins
    to_version: str = ""  # the new definition's version string
    by: str = "operator"
    reason: str = ""
    problems: tuple[str, ...] = ()  # what the shell's proof refused (the machine then refuses)


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
    | ApprovalDecided
    | RunMigrated
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
        ApprovalDecided,
        RunMigrated,
    )
}


def event_to_json(event: Event) -> dict[str, Any]:
    doc = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
    if doc.get("sampled") is True:  # RunStarted: written only when false
        del doc["sampled"]
    doc["kind"] = event.kind
    return doc


def event_from_json(doc: dict[str, Any]) -> Event:
    """Inverse of :func:`event_to_json`; raises ``ValueError`` on an unknown kind or field."""
    data = dict(doc)
    kind = data.pop("kind", None)
    cls = _BY_KIND.get(str(kind))
    if cls is None:
        raise ValueError(f"unknown event kind {kind!r}")
    for name in ("tenants", "form_problems", "removed", "problems"):  # tuples travel as JSON lists
        if isinstance(data.get(name), list):
            data[name] = tuple(data[name])
    try:
        event: Event = cls(**data)
    except TypeError as exc:
        raise ValueError(f"malformed {kind} event: {exc}") from None
    return event
