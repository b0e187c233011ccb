"""The task kind: a ``worker`` stage (dispatched over a queue) or an ``action`` stage (a
platform capability the engine invokes). Both run a pinned capability with typed input, retry
under a bounded policy and leave along ``on_success`` or ``on_failure``.

Schema codes it reports: ``schema-payload-too-large`` and ``binding-*`` syntax codes, besides the
reader's; type codes: ``type-queue-missing``, ``type-queue-mismatch`` (warning),
``type-cache-not-cacheable``, ``type-retry-unknown-error`` and the input codes of
:mod:`accord.workflow.check_inputs`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from accord.canonical import canonical_json
from accord.contracts.yamlsource import Node
from accord.workflow import limits
from accord.workflow.bindings import BindingError, parse_input
from accord.workflow.check_inputs import type_input
from accord.workflow.kinds.base import (
    Arrow,
    Edge,
    Placement,
    References,
    Resolved,
    StageDef,
    StageKind,
    TypeContext,
    reads_nothing,
)
from accord.workflow.schema_fields import SchemaReader
from accord.workflow.values import (
    CachePolicy,
    CapabilityPin,
    InputValue,
    RetryPolicy,
    Timeouts,
    pin_from_json,
    pin_to_json,
    value_from_json,
    value_to_json,
)

__all__ = ["KIND", "TaskDef", "TaskStage"]


@dataclass(frozen=True, slots=True)
class TaskDef(StageDef):
    type: Literal["worker", "action"] = "worker"
    capability: str = ""
    queue: str | None = None
    input: Mapping[str, Any] = field(default_factory=dict)
    on_success: str = ""
    on_failure: str = ""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeouts: Timeouts = field(default_factory=Timeouts)
    cache: CachePolicy = field(default_factory=CachePolicy)
    compensate: str | None = None


@dataclass(frozen=True, slots=True)
class TaskStage:
    """A ``worker`` (dispatched over ``queue``) or ``action`` (invoked in the engine) stage."""

    name: str
    type: Literal["worker", "action"]
    capability: CapabilityPin
    input: Mapping[str, InputValue]
    on_success: str
    on_failure: str
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeouts: Timeouts = field(default_factory=Timeouts)
    queue: str | None = None
    cache: CachePolicy = field(default_factory=CachePolicy)
    compensate: CapabilityPin | None = None
    fork: str | None = None  # enclosing fork, when the stage is on a fork branch
    branch: str | None = None  # that branch's entry stage name
    line: int = field(default=0, compare=False)


# --- schema ---------------------------------------------------------------------------------

_COMMON = {
    "name",
    "type",
    "input",
    "on_success",
    "on_failure",
    "retry",
    "timeouts",
    "execution_deadline_ms",
    "cache",
    "compensate",
}
FIELDS = {
    "worker": frozenset(_COMMON | {"worker", "queue"}),
    "action": frozenset(_COMMON | {"action"}),
}


def read(r: SchemaReader, node: Node, name: str, kind: str) -> TaskDef:
    capability = r.capability_ref(node, kind, name)
    raw_input = r.child(node, "input", name, kind="map", required=False)
    value: dict[str, Any] = raw_input.plain() if raw_input is not None else {}
    parsed: dict[str, Any] = {}
    try:
        parsed = {k: parse_input(v) for k, v in value.items()}
    except BindingError as exc:
        r.error_at(exc.code, exc.message, node, "input", name)
    if _rough_size(value) > limits.MAX_INPUT_BYTES // 2 and (
        len(canonical_json(value)) > limits.MAX_INPUT_BYTES
    ):
        r.error_at(
            "schema-payload-too-large",
            f"literal input exceeds {limits.MAX_INPUT_BYTES} bytes",
            node,
            "input",
            name,
        )
    cache = CachePolicy()
    cache_node = r.child(node, "cache", name, kind="map", required=False)
    if cache_node is not None:
        r.closed(cache_node, {"enabled", "ttl_ms"}, name)
        cache = CachePolicy(
            enabled=r.boolean(cache_node, "enabled", name, False),
            ttl_ms=r.integer(cache_node, "ttl_ms", name, (0, limits.MAX_CACHE_TTL_MS), 0) or 0,
        )
    return TaskDef(
        name,
        node,
        type="worker" if kind == "worker" else "action",
        capability=capability,
        queue=r.text(node, "queue", name, default=None),
        input=parsed,
        on_success=r.text(node, "on_success", name),
        on_failure=r.text(node, "on_failure", name),
        retry=r.retry(node, name),
        timeouts=r.timeouts(node, name),
        cache=cache,
        compensate=r.optional_ref(node, "compensate", name),
    )


def _rough_size(value: Any) -> int:
    """At least half the canonical JSON size (escapes only add), cheaply."""
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, dict):
        return sum(len(k) + 3 + _rough_size(v) for k, v in value.items()) + 2
    if isinstance(value, list):
        return sum(_rough_size(v) + 1 for v in value) + 2
    return 8


# --- graph ----------------------------------------------------------------------------------


def edges(s: TaskDef) -> list[Edge]:
    return [
        Edge(s.name, s.on_success, "success", "on_success"),
        Edge(s.name, s.on_failure, "failure", "on_failure"),
    ]


def references(s: TaskDef, refs: References) -> None:
    refs.target(s.on_success, "on_success")
    refs.target(s.on_failure, "on_failure")


# --- types and budget -----------------------------------------------------------------------


def resolve(ctx: TypeContext, s: TaskDef) -> None:
    """Pin the capability (and compensation), settle the queue, type the input."""
    pin = ctx.pin(s.capability, s.type, s, s.type)
    if s.compensate:
        comp = ctx.pin(s.compensate, "action", s, "compensate")
        if comp is not None:
            ctx.out.compensations[s.name] = comp
    if pin is None:
        return
    ctx.out.pins[s.name] = pin
    cap = ctx.out.capabilities[s.capability]
    queue = s.queue
    if s.type == "worker":
        queue = s.queue or cap.queue
        if queue is None:
            ctx.diags.append(
                s.diag("type-queue-missing", "no queue on the stage or its capability", "worker")
            )
        elif cap.queue and queue != cap.queue:
            ctx.diags.append(
                s.diag(
                    "type-queue-mismatch",
                    f"queue {queue!r} differs from the capability's {cap.queue!r}",
                    "queue",
                    severity="warning",
                )
            )
    ctx.out.queues[s.name] = queue
    if s.cache.enabled and not cap.cacheable:
        ctx.diags.append(
            s.diag("type-cache-not-cacheable", f"{s.capability} is not cacheable", "cache")
        )
    for cls in s.retry.retry_on:
        if cls not in ("retryable", "timeout") and cls not in cap.errors:
            ctx.diags.append(
                s.diag(
                    "type-retry-unknown-error",
                    f"retry_on {cls!r} is neither a class nor an error of {s.capability}",
                    "retry",
                )
            )
    request = ctx.catalog.message(cap.request)
    if request is not None:
        typed, found = type_input(s, request.payload, lambda b: ctx.source(b, s.name))
        ctx.out.inputs[s.name] = typed
        ctx.diags.extend(found)


def cost_ms(s: TaskDef) -> int:
    """Every attempt waiting its full queue deadline and running its full execution deadline,
    plus the longest backoff between attempts."""
    t, r = s.timeouts, s.retry
    return r.max_attempts * (t.queue_deadline_ms + t.execution_deadline_ms) + (
        r.worst_case_backoff_ms()
    )


# --- plan -----------------------------------------------------------------------------------


def plan(s: TaskDef, at: Placement, r: Resolved) -> TaskStage:
    return TaskStage(
        name=s.name,
        type=s.type,
        capability=r.pins[s.name],
        input=r.inputs.get(s.name, dict(s.input)),
        on_success=s.on_success,
        on_failure=s.on_failure,
        retry=s.retry,
        timeouts=s.timeouts,
        queue=r.queues.get(s.name),
        cache=s.cache,
        compensate=r.compensations.get(s.name),
        fork=at.fork,
        branch=at.branch,
        line=at.line,
    )


def to_json(stage: TaskStage) -> dict[str, Any]:
    r, t, c = stage.retry, stage.timeouts, stage.cache
    return {
        "capability": pin_to_json(stage.capability),
        "queue": stage.queue,
        "input": {k: value_to_json(v) for k, v in stage.input.items()},
        "on_success": stage.on_success,
        "on_failure": stage.on_failure,
        "retry": {
            "max_attempts": r.max_attempts,
            "initial_backoff_ms": r.initial_backoff_ms,
            "max_backoff_ms": r.max_backoff_ms,
            "multiplier": r.multiplier,
            "jitter": r.jitter,
            "retry_on": list(r.retry_on),
        },
        "timeouts": {
            "queue_deadline_ms": t.queue_deadline_ms,
            "execution_deadline_ms": t.execution_deadline_ms,
            "heartbeat_timeout_ms": t.heartbeat_timeout_ms,
        },
        "cache": {"enabled": c.enabled, "ttl_ms": c.ttl_ms},
        "compensate": pin_to_json(stage.compensate),
        "fork": stage.fork,
        "branch": stage.branch,
    }


def from_json(doc: Mapping[str, Any], line: int) -> TaskStage:
    cap = pin_from_json(doc["capability"])
    if cap is None:
        raise ValueError(f"task stage {doc['name']!r} has no capability")
    r, t, c = doc["retry"], doc["timeouts"], doc["cache"]
    return TaskStage(
        name=doc["name"],
        type="worker" if doc["type"] == "worker" else "action",
        capability=cap,
        queue=doc.get("queue"),
        input={k: value_from_json(v) for k, v in doc["input"].items()},
        on_success=doc["on_success"],
        on_failure=doc["on_failure"],
        retry=RetryPolicy(
            max_attempts=r["max_attempts"],
            initial_backoff_ms=r["initial_backoff_ms"],
            max_backoff_ms=r["max_backoff_ms"],
            multiplier=r["multiplier"],
            jitter=r["jitter"],
            retry_on=tuple(r["retry_on"]),
        ),
        timeouts=Timeouts(
            queue_deadline_ms=t["queue_deadline_ms"],
            execution_deadline_ms=t["execution_deadline_ms"],
            heartbeat_timeout_ms=t["heartbeat_timeout_ms"],
        ),
        cache=CachePolicy(enabled=c["enabled"], ttl_ms=c["ttl_ms"]),
        compensate=pin_from_json(doc.get("compensate")),
        fork=doc.get("fork"),
        branch=doc.get("branch"),
        line=line,
    )


# --- rendering ------------------------------------------------------------------------------


def label(stage: TaskStage) -> str:
    queue = f" · {stage.queue}" if stage.queue else ""
    return f"{stage.name}<br/>{stage.type} {stage.capability.ref}{queue}"


def arrows(stage: TaskStage) -> list[Arrow]:
    return [(stage.on_success, "success", ""), (stage.on_failure, "failure", "failure")]


KIND: StageKind[TaskDef, TaskStage] = StageKind(
    name="task",
    definition=TaskDef,
    stage=TaskStage,
    fields=FIELDS,
    read=read,
    edges=edges,
    references=references,
    has_result=True,
    resolve=resolve,
    check_reads=reads_nothing,
    cost_ms=cost_ms,
    plan=plan,
    to_json=to_json,
    from_json=from_json,
    shape="box",
    style=None,
    label=label,
    arrows=arrows,
)
