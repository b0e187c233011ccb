"""The task kind: a ``worker`` stage (dispatched over a queue) or an ``action`` stage (a
platform capability the engine invokes). Both run a pinned capability with typed input, retry
under a bounded policy and leave along ``on_success`` or ``on_failure``.

``compensate`` is a reference, or a map ``{action, retry, timeouts}`` that gives the compensation
its own retry policy and clocks (:class:`ActionPolicy`; workflow ``finalisers`` take the same
maps). ``evidence`` lists result field paths a success must carry (docs/approvals.md).

Schema codes it reports: ``schema-payload-too-large``, ``schema-evidence-path`` and ``binding-*``
syntax codes, besides the reader's; type codes: ``type-queue-missing``, ``type-queue-mismatch``
(warning), ``type-cache-not-cacheable``, ``type-retry-unknown-error``,
``type-evidence-unknown-field`` and the input codes of :mod:`accord.workflow.check_inputs`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from accord.canonical import canonical_json
from accord.contracts.yamlsource import Node
from accord.workflow import limits
from accord.workflow.bindings import BindingError, parse_input
from accord.workflow.check_inputs import type_input, walk
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

__all__ = [
    "KIND",
    "ActionPolicy",
    "TaskDef",
    "TaskStage",
    "evidence_note",
    "missing_evidence",
    "policy_from_json",
    "policy_to_json",
    "read_action",
    "read_actions",
    "read_evidence",
]


@dataclass(frozen=True, slots=True)
class ActionPolicy:
    """The retry policy and clocks of an engine action that is not a stage: a compensation or a
    finaliser written as a map (``{action, retry, timeouts}``). Written as a bare reference, it
    has none: one attempt under the default clocks."""

    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeouts: Timeouts = field(default_factory=Timeouts)


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
    compensate_policy: ActionPolicy | None = None
    evidence: tuple[str, ...] = ()


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
    compensate_policy: ActionPolicy | None = None  # the compensation's own retries and clocks
    evidence: tuple[str, ...] = ()  # result field paths a success must carry
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
    "evidence",
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
    compensate, compensate_policy = read_action(r, node, "compensate", name)
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
        compensate=compensate,
        compensate_policy=compensate_policy,
        evidence=read_evidence(r, node, name),
    )


def read_evidence(r: SchemaReader, node: Node, stage: str) -> tuple[str, ...]:
    """``evidence``: result field paths (``receipt.id``) that a success must carry."""
    paths = r.names(node, "evidence", stage, required=False)
    for path in paths:
        if not _PATH.match(path):
            r.error_at(
                "schema-evidence-path", f"{path!r} is not a field path (a.b.c)", node, "evidence",
                stage,
            )  # fmt: skip
    for dupe in sorted({p for p in paths if paths.count(p) > 1}):
        r.error_at("schema-evidence-path", f"{dupe!r} is listed twice", node, "evidence", stage)
    return paths


def evidence_note(owner: str, paths: tuple[str, ...], result: Mapping[str, Any] | None) -> str:
    """``evidence of 'publish': catalogueId=cat-1, receipt.id=r-9`` (values cut at 80 chars)."""
    shown = []
    for path in paths:
        value: Any = result or {}
        for key in path.split("."):
            value = value.get(key) if isinstance(value, Mapping) else None
        text = value if isinstance(value, str) else canonical_json(value).decode("utf-8")
        shown.append(f"{path}={text[:80]}")
    who = owner if owner == "the run" else repr(owner)
    return f"evidence of {who}: {', '.join(shown)}"


def missing_evidence(paths: tuple[str, ...], result: Mapping[str, Any] | None) -> list[str]:
    """The paths of ``paths`` that ``result`` lacks (absent or null)."""
    missing = []
    for path in paths:
        value: Any = result or {}
        for key in path.split("."):
            value = value.get(key) if isinstance(value, Mapping) else None
        if value is None:
            missing.append(path)
    return missing


def read_action(
    r: SchemaReader, node: Node, key: str, stage: str
) -> tuple[str | None, ActionPolicy | None]:
    """``key`` as an action reference (``name@version``) or as a map ``{action, retry,
    timeouts, execution_deadline_ms}`` giving the action its own retry policy and clocks."""
    value = node.get(key)
    if value is None or value.kind != "map":
        return r.optional_ref(node, key, stage), None
    r.closed(value, {"action", "retry", "timeouts", "execution_deadline_ms"}, stage)
    ref = r.capability_ref(value, "action", stage)
    return ref or None, ActionPolicy(retry=r.retry(value, stage), timeouts=r.timeouts(value, stage))


def _rough_size(value: Any) -> int:
    """At least half the canonical JSON size (escapes only add), cheaply."""
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, dict):
        return sum(len(k) + 3 + _rough_size(v) for k, v in value.items()) + 2
    if isinstance(value, list):
        return sum(_rough_size(v) + 1 for v in value) + 2
    return 8


def read_actions(
    r: SchemaReader, node: Node, key: str
) -> tuple[tuple[str, ...], tuple[ActionPolicy | None, ...]]:
    """A list of actions (workflow ``finalisers``), each a reference or a map as
    :func:`read_action` reads it."""
    seq = r.child(node, key, "", kind="seq", required=False)
    refs: list[str] = []
    policies: list[ActionPolicy | None] = []
    for item in seq.items if seq is not None else ():
        if item.kind == "map":
            r.closed(item, {"action", "retry", "timeouts", "execution_deadline_ms"}, "")
            refs.append(r.capability_ref(item, "action", ""))
            policies.append(ActionPolicy(retry=r.retry(item, ""), timeouts=r.timeouts(item, "")))
            continue
        if item.kind != "scalar" or not isinstance(item.value, str):
            r.error_at("schema-type", f"{key!r} holds action references", item, None, "")
            continue
        if not _REF.match(item.value):
            r.error_at("schema-capability-ref", f"{item.value!r} is not name@version", node, key)
        refs.append(item.value)
        policies.append(None)
    return tuple(refs), tuple(policies)


_REF = re.compile(r"^[a-z][a-z0-9._-]*@[1-9][0-9]*$")  # as the schema reader's
_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


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
    result = ctx.catalog.message(cap.result)
    for path in s.evidence:
        _, problem = walk(result.payload if result is not None else None, tuple(path.split(".")))
        if problem:
            text = f"evidence {path!r}: {problem} in {cap.result}"
            ctx.diags.append(s.diag("type-evidence-unknown-field", text, "evidence"))
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
        compensate_policy=s.compensate_policy,
        evidence=s.evidence,
        fork=at.fork,
        branch=at.branch,
        line=at.line,
    )


def _retry_json(r: RetryPolicy) -> dict[str, Any]:
    return {
        "max_attempts": r.max_attempts,
        "initial_backoff_ms": r.initial_backoff_ms,
        "max_backoff_ms": r.max_backoff_ms,
        "multiplier": r.multiplier,
        "jitter": r.jitter,
        "retry_on": list(r.retry_on),
    }


def _timeouts_json(t: Timeouts) -> dict[str, Any]:
    return {
        "queue_deadline_ms": t.queue_deadline_ms,
        "execution_deadline_ms": t.execution_deadline_ms,
        "heartbeat_timeout_ms": t.heartbeat_timeout_ms,
    }


def _retry_from(r: Mapping[str, Any]) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=r["max_attempts"],
        initial_backoff_ms=r["initial_backoff_ms"],
        max_backoff_ms=r["max_backoff_ms"],
        multiplier=r["multiplier"],
        jitter=r["jitter"],
        retry_on=tuple(r["retry_on"]),
    )


def _timeouts_from(t: Mapping[str, Any]) -> Timeouts:
    return Timeouts(
        queue_deadline_ms=t["queue_deadline_ms"],
        execution_deadline_ms=t["execution_deadline_ms"],
        heartbeat_timeout_ms=t["heartbeat_timeout_ms"],
    )


def policy_to_json(policy: ActionPolicy | None) -> dict[str, Any] | None:
    if policy is None:
        return None
    return {"retry": _retry_json(policy.retry), "timeouts": _timeouts_json(policy.timeouts)}


def policy_from_json(doc: Mapping[str, Any] | None) -> ActionPolicy | None:
    if doc is None:
        return None
    return ActionPolicy(retry=_retry_from(doc["retry"]), timeouts=_timeouts_from(doc["timeouts"]))


def to_json(stage: TaskStage) -> dict[str, Any]:
    c = stage.cache
    doc: dict[str, Any] = {
        "capability": pin_to_json(stage.capability),
        "queue": stage.queue,
        "input": {k: value_to_json(v) for k, v in stage.input.items()},
        "on_success": stage.on_success,
        "on_failure": stage.on_failure,
        "retry": _retry_json(stage.retry),
        "timeouts": _timeouts_json(stage.timeouts),
        "cache": {"enabled": c.enabled, "ttl_ms": c.ttl_ms},
        "compensate": pin_to_json(stage.compensate),
        "fork": stage.fork,
        "branch": stage.branch,
    }
    if stage.compensate_policy is not None:  # written only when set: earlier plans keep digests
        doc["compensate_policy"] = policy_to_json(stage.compensate_policy)
    if stage.evidence:  # likewise
        doc["evidence"] = list(stage.evidence)
    return doc


def from_json(doc: Mapping[str, Any], line: int) -> TaskStage:
    cap = pin_from_json(doc["capability"])
    if cap is None:
        raise ValueError(f"task stage {doc['name']!r} has no capability")
    c = doc["cache"]
    return TaskStage(
        name=doc["name"],
        type="worker" if doc["type"] == "worker" else "action",
        capability=cap,
        queue=doc.get("queue"),
        input={k: value_from_json(v) for k, v in doc["input"].items()},
        on_success=doc["on_success"],
        on_failure=doc["on_failure"],
        retry=_retry_from(doc["retry"]),
        timeouts=_timeouts_from(doc["timeouts"]),
        cache=CachePolicy(enabled=c["enabled"], ttl_ms=c["ttl_ms"]),
        compensate=pin_from_json(doc.get("compensate")),
        compensate_policy=policy_from_json(doc.get("compensate_policy")),
        evidence=tuple(doc.get("evidence", ())),
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
