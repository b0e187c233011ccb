"""Hand-built compiled plans for scenarios, tests and benchmarks.

:func:`model_ingest_shape` is the model-ingest workflow's graph without its contract catalogue:
``A → fork(B, C) → join → D``, every task a worker on its own queue, optionally wrapped by an
action stage in front (like ``cache-lookup``) and a finaliser (like ``audit.run-terminal``). It
lets the engine be exercised and measured without compiling YAML; plans compiled from
``workflows/model-ingest.yaml`` have the same shape.
"""

from __future__ import annotations

from accord.workflow.plan import (
    Binding,
    CapabilityPin,
    ForkStage,
    JoinStage,
    Plan,
    RetryPolicy,
    Stage,
    TaskStage,
    Timeouts,
)

__all__ = ["QUEUES", "model_ingest_shape", "pin"]

QUEUES = ("render", "analyse", "metadata", "publish")
_DIGEST = "sha256:" + "0" * 64


def pin(name: str, version: int = 1, kind: str = "worker") -> CapabilityPin:
    return CapabilityPin(
        kind="action" if kind == "action" else "worker",
        name=name,
        version=version,
        request=f"{name}-request@1",
        result=f"{name}-result@1",
        request_digest=_DIGEST,
        result_digest=_DIGEST,
    )


def _task(
    name: str,
    queue: str | None,
    on_success: str,
    retry: RetryPolicy,
    timeouts: Timeouts,
    *,
    fork: str | None = None,
    branch: str | None = None,
    action: bool = False,
) -> TaskStage:
    return TaskStage(
        name=name,
        type="action" if action else "worker",
        capability=pin(f"test.{name}", kind="action" if action else "worker"),
        input={"modelId": Binding(source="context", path=("modelId",), raw="${context.modelId}")},
        on_success=on_success,
        on_failure="failed",
        retry=retry,
        timeouts=timeouts,
        queue=None if action else queue,
        fork=fork,
        branch=branch,
    )


def model_ingest_shape(
    *,
    name: str = "model-ingest-shape",
    lookup_action: bool = False,
    finaliser: bool = False,
    max_attempts: int = 3,
    queue_deadline_ms: int = 60_000,
    execution_deadline_ms: int = 300_000,
    deadline_ms: int | None = None,
) -> Plan:
    """``[lookup →] render → fork(analyse, metadata) → join → publish [+ finaliser]``."""
    retry = RetryPolicy(max_attempts=max_attempts, initial_backoff_ms=1_000, max_backoff_ms=8_000)
    t = Timeouts(queue_deadline_ms=queue_deadline_ms, execution_deadline_ms=execution_deadline_ms)
    stages: list[Stage] = []
    if lookup_action:
        stages.append(_task("lookup", None, "render", retry, t, action=True))
    stages += [
        _task("render", "render", "fork", retry, t),
        ForkStage(name="fork", branches=("analyse", "metadata"), join="join"),
        _task("analyse", "analyse", "join", retry, t, fork="fork", branch="analyse"),
        _task("metadata", "metadata", "join", retry, t, fork="fork", branch="metadata"),
        JoinStage(
            name="join",
            fork="fork",
            required=("analyse", "metadata"),
            acceptable_terminal_states=("completed",),
            on_success="publish",
            on_failure="failed",
        ),
        _task("publish", "publish", "completed", retry, t),
    ]
    return Plan.create(
        name=name,
        version="1.0.0",
        entry="lookup" if lookup_action else "render",
        stages=tuple(stages),
        finalisers=(pin("test.audit", kind="action"),) if finaliser else (),
        deadline_ms=deadline_ms,
    )
