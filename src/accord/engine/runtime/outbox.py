"""From a transition to one atomic commit: effects become outbox rows and timer changes.

The machine speaks in effects; the store speaks in rows. This module is the one translation
between them, so the shell never hand-builds a commit. It is pure: the caller passes the clock
reading and the run's current version.

Topics name where an outbox entry goes once the commit is durable:

- ``job:<queue>``      a worker job, published to transport queue ``<queue>``;
- ``action``           an in-process action (also finalisers and compensations);
- ``cancel:<queue>``   a cooperative cancellation request, published to :func:`control_queue`;
                       the fenced attempt's job is also withdrawn from ``<queue>`` where the
                       transport can (:func:`withdrawal`);
- ``telemetry``        a telemetry event, drained by its own consumer so a slow sink never
                       holds up progress (I7).

A fired timer is always removed by the commit of the transition it caused, unless that
transition re-arms the same id: the machine may treat a stale timer as a recorded no-op, and a
timer nobody removes would fire forever.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from accord.canonical import canonical_json
from accord.engine.machine.effects import (
    CancelTimer,
    DispatchJob,
    Effect,
    EmitTelemetry,
    InvokeAction,
    RequestCancellation,
    ScheduleTimer,
    effect_to_json,
)
from accord.engine.machine.state import RunState
from accord.engine.ports import Commit, JsonDict, OutboxEntry, Timer
from accord.generated.cancellation_requested_v1 import CancellationRequestedV1

__all__ = [
    "CONTROL_QUEUE",
    "build_commit",
    "cancelled_job",
    "changed_index",
    "control_body",
    "control_queue",
    "entry_for",
    "timer_for",
    "with_reply_to",
    "withdrawal",
    "without_telemetry",
]

CONTROL_QUEUE = "accord.control"
_CANCEL = ":cancel"  # a cancel entry's id is its job's id with this suffix


def control_queue(queue: str | None) -> str:
    """The transport queue on which workers of ``queue`` receive cancellation requests."""
    return f"{CONTROL_QUEUE}.{queue}" if queue else CONTROL_QUEUE


def entry_for(run_id: str, effect: Effect, now_ms: int) -> OutboxEntry | None:
    """The outbox row for an effect that must be handed off, or ``None`` for timer effects."""
    if isinstance(effect, DispatchJob):
        payload: JsonDict = {"envelope": effect.envelope, "capability": effect.capability}
        return OutboxEntry(effect.job_id, run_id, f"job:{effect.queue}", payload, now_ms)
    if isinstance(effect, InvokeAction):
        payload = {"envelope": effect.envelope, "capability": effect.capability}
        return OutboxEntry(effect.job_id, run_id, "action", payload, now_ms)
    if isinstance(effect, RequestCancellation):
        topic = f"cancel:{effect.queue or ''}"
        # its own id: the job's entry (same job id) may still be pending in the outbox
        entry_id = f"{effect.job_id}{_CANCEL}"
        return OutboxEntry(entry_id, run_id, topic, effect_to_json(effect), now_ms)
    if isinstance(effect, EmitTelemetry):
        payload = effect_to_json(effect) | {"run_id": run_id, "at_ms": now_ms}
        return OutboxEntry(effect.event_id, run_id, "telemetry", payload, now_ms)
    return None


def control_body(payload: Mapping[str, object]) -> bytes:
    """The ``cancellation-requested@1`` message a cancel entry is published as, built through
    its generated binding from the entry's payload (the effect as the store keeps it: its
    ``job_id`` is the message's ``jobId``)."""
    request = CancellationRequestedV1.model_validate(
        {
            "kind": RequestCancellation.kind,
            "jobId": payload.get("job_id"),
            "queue": payload.get("queue"),
            "stage": payload.get("stage"),
            "attempt": payload.get("attempt"),
            "fence": payload.get("fence"),
            **({"reason": payload["reason"]} if payload.get("reason") else {}),
        }
    )
    return canonical_json(request.model_dump(exclude_unset=True))


def withdrawal(entry: OutboxEntry) -> tuple[str, str] | None:
    """``(queue, message id)`` of the job a cancel entry's attempt was dispatched as, or
    ``None`` (not a cancel, or an action's: no job waits in a queue). The attempt is fenced, so
    its job, if still waiting, can only ever be refused: it is taken back rather than delivered."""
    if not entry.topic.startswith("cancel:") or not entry.topic[7:]:
        return None
    job_id = entry.payload.get("job_id")
    return (entry.topic[7:], job_id) if isinstance(job_id, str) and job_id else None


def cancelled_job(queue: str, message_id: str) -> tuple[str, str] | None:
    """:func:`withdrawal` for a cancel already turned into a control queue message (a joint
    commit): ``(job queue, job message id)``, or ``None`` for any other message."""
    head = CONTROL_QUEUE + "."
    if not queue.startswith(head) or not message_id.endswith(_CANCEL) or len(queue) == len(head):
        return None
    return queue[len(head) :], message_id[: -len(_CANCEL)]


def timer_for(run_id: str, effect: ScheduleTimer) -> Timer:
    payload: JsonDict = {
        "timer": effect.timer,
        "stage": effect.stage,
        "attempt": effect.attempt,
        "fence": effect.fence,
    }
    return Timer(effect.timer_id, run_id, effect.due_at_ms, payload)


def build_commit(
    run_id: str,
    *,
    expected_version: int,
    state: JsonDict,
    history: Sequence[JsonDict],
    effects: Sequence[Effect],
    now_ms: int,
    index: Mapping[str, str],
    fired_timer: str | None = None,
) -> Commit:
    """Everything one transition writes, for :meth:`Store.commit`."""
    outbox: list[OutboxEntry] = []
    timers_set: dict[str, Timer] = {}
    timers_cancel: list[str] = []
    for effect in effects:
        if isinstance(effect, ScheduleTimer):
            timers_set[effect.timer_id] = timer_for(run_id, effect)
            if effect.timer_id in timers_cancel:
                timers_cancel.remove(effect.timer_id)
        elif isinstance(effect, CancelTimer):
            timers_set.pop(effect.timer_id, None)
            if effect.timer_id not in timers_cancel:
                timers_cancel.append(effect.timer_id)
        else:
            entry = entry_for(run_id, effect, now_ms)
            if entry is not None:
                outbox.append(entry)
    if fired_timer and fired_timer not in timers_set and fired_timer not in timers_cancel:
        timers_cancel.append(fired_timer)
    return Commit(
        run_id=run_id,
        expected_version=expected_version,
        state=state,
        history=tuple(history),
        outbox=tuple(outbox),
        timers_set=tuple(timers_set.values()),
        timers_cancel=tuple(timers_cancel),
        index=dict(index),
    )


def changed_index(old: RunState | None, new: RunState) -> dict[str, str]:
    """The searchable columns that change (a key left out keeps its value; unchanged ones are
    left out so the store need not touch their indexes)."""
    if old is None:
        return {"status": new.status, "workflow": new.workflow, "tenant": new.tenant}
    changed = {"status": new.status} if new.status != old.status else {}
    if new.workflow != old.workflow or new.tenant != old.tenant:  # never, but stay exact
        changed |= {"workflow": new.workflow, "tenant": new.tenant}
    return changed


def with_reply_to(commit: Commit, queue: str) -> Commit:
    """The commit with every job it dispatches naming ``queue`` as its ``replyTo`` (envelope@2):
    the outcome queue of the run's shard, read by the shard's owner. Stored so, every engine's
    sweep republishes the same body."""
    if not any(e.topic.startswith("job:") for e in commit.outbox):
        return commit
    outbox = tuple(
        replace(e, payload={**e.payload, "envelope": {**envelope, "replyTo": queue}})
        if e.topic.startswith("job:") and isinstance(envelope := e.payload.get("envelope"), dict)
        else e
        for e in commit.outbox
    )
    return replace(commit, outbox=outbox)


def without_telemetry(commit: Commit) -> Commit:
    """The commit without its telemetry entries (for an engine with no sink: its dispatcher
    would only mark them done unseen)."""
    kept = tuple(e for e in commit.outbox if e.topic != "telemetry")
    return commit if len(kept) == len(commit.outbox) else replace(commit, outbox=kept)
