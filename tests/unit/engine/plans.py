"""Plans built by hand for the machine's tests: the model-ingest workflow and small shapes.

Capabilities are pinned with fake but well-formed digests; the machine never checks them (the
shell validates messages against the pinned contracts).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from accord.workflow.plan import (
    ActionPolicy,
    ApprovalStage,
    Approvers,
    Binding,
    CapabilityPin,
    DecisionBranch,
    DecisionStage,
    ForkStage,
    JoinStage,
    Plan,
    RetryPolicy,
    Stage,
    TaskStage,
    Timeouts,
)

__all__ = [
    "ALL_PLANS", "MODEL_ID", "RetryPolicy", "gate", "gated", "make", "model_ingest", "pin", "task",
]  # fmt: skip

MODEL_ID = Binding(
    source="context", path=("modelId",), expected_type="string", raw="${context.modelId}"
)


def pin(ref: str, kind: str = "worker") -> CapabilityPin:
    name, _, version = ref.partition("@")
    fake = "sha256:" + (name.encode().hex() * 8)[:64]
    return CapabilityPin(
        kind="worker" if kind == "worker" else "action",
        name=name,
        version=int(version),
        request=f"{name}-request@{version}",
        result=f"{name}-result@1",
        request_digest=fake,
        result_digest=fake,
    )


def task(
    name: str,
    ref: str,
    on_success: str,
    on_failure: str = "failed",
    *,
    kind: str = "worker",
    **extra: Any,
) -> TaskStage:
    return TaskStage(
        name=name,
        type="worker" if kind == "worker" else "action",
        capability=pin(ref, kind),
        input=extra.pop("input", {"modelId": MODEL_ID}),
        on_success=on_success,
        on_failure=on_failure,
        queue=(name if kind == "worker" else None),
        **extra,
    )


def make(name: str, entry: str, stages: tuple[Stage, ...], **extra: object) -> Plan:
    return Plan.create(name=name, version="1.0.0", entry=entry, stages=stages, **extra)


def model_ingest(**extra: object) -> Plan:
    fork = "derive-fork"
    stages: tuple[Stage, ...] = (
        task("cache-lookup", "cache.lookup@1", "cache-route", kind="action"),
        DecisionStage(
            name="cache-route",
            branches=(
                DecisionBranch(when='stages["cache-lookup"].result.hit == true', next="publish"),
                DecisionBranch(when="true", next="render-thumbnail"),
            ),
            on_evaluation_error="failed",
        ),
        task(
            "render-thumbnail",
            "thumbnail.render@3",
            fork,
            timeouts=Timeouts(execution_deadline_ms=300_000),
        ),
        ForkStage(
            name=fork, branches=("semantic-analysis", "technical-metadata"), join="derive-join"
        ),
        task(
            "semantic-analysis",
            "semantic.analyse@4",
            "derive-join",
            fork=fork,
            branch="semantic-analysis",
        ),
        task(
            "technical-metadata",
            "metadata.extract@2",
            "derive-join",
            fork=fork,
            branch="technical-metadata",
        ),
        JoinStage(
            name="derive-join",
            fork=fork,
            required=("semantic-analysis", "technical-metadata"),
            acceptable_terminal_states=("completed",),
            on_success="publish",
            on_failure="failed",
        ),
        task("publish", "catalogue.publish@2", "completed", kind="action"),
    )
    options: dict[str, object] = {
        "finalisers": (pin("audit.run-terminal@1", "action"),),
        "deadline_ms": 3_600_000,
    }
    options.update(extra)
    return make("model-ingest", "cache-lookup", stages, **options)


def linear(
    retry: RetryPolicy | None = None, timeouts: Timeouts | None = None, **extra: object
) -> Plan:
    """a (worker) → b (action) → completed; ``a`` carries the given retry and timeouts."""
    a_extra: dict[str, Any] = {}
    if retry is not None:
        a_extra["retry"] = retry
    if timeouts is not None:
        a_extra["timeouts"] = timeouts
    stages: tuple[Stage, ...] = (
        task("a", "alpha@1", "b", **a_extra),
        task("b", "beta@1", "completed", kind="action"),
    )
    return make("linear", "a", stages, **extra)


def saga() -> Plan:
    """reserve → charge → ship; reserve and charge declare compensations; two finalisers."""
    stages: tuple[Stage, ...] = (
        task("reserve", "reserve@1", "charge", compensate=pin("unreserve@1", "action")),
        task("charge", "charge@1", "ship", compensate=pin("refund@1", "action")),
        task("ship", "ship@1", "completed", retry=RetryPolicy(max_attempts=1)),
    )
    finalisers = (pin("audit@1", "action"), pin("notify@1", "action"))
    return make("saga", "reserve", stages, finalisers=finalisers)


def saga_with_policies() -> Plan:
    """The saga with a compensation and a finaliser under their own retry policy and clocks."""
    policy = ActionPolicy(
        retry=RetryPolicy(max_attempts=3, initial_backoff_ms=100, max_backoff_ms=400),
        timeouts=Timeouts(execution_deadline_ms=5_000),
    )
    stages: tuple[Stage, ...] = (
        task("reserve", "reserve@1", "charge", compensate=pin("unreserve@1", "action")),
        task("charge", "charge@1", "ship", compensate=pin("refund@1", "action"),
             compensate_policy=policy),
        task("ship", "ship@1", "completed", retry=RetryPolicy(max_attempts=1)),
    )  # fmt: skip
    finalisers = (pin("audit@1", "action"), pin("notify@1", "action"))
    return make(
        "saga-policies", "reserve", stages, finalisers=finalisers,
        finaliser_policies=(policy, None),
    )  # fmt: skip


def tolerant_fork() -> Plan:
    """A fork whose join accepts failed branches: a branch failure is an arrival, not an intent."""
    fork = "split"
    stages: tuple[Stage, ...] = (
        ForkStage(name=fork, branches=("left", "right"), join="merge"),
        task(
            "left",
            "left@1",
            "merge",
            "merge",
            fork=fork,
            branch="left",
            retry=RetryPolicy(max_attempts=1),
        ),
        task(
            "right",
            "right@1",
            "merge",
            "merge",
            fork=fork,
            branch="right",
            retry=RetryPolicy(max_attempts=1),
        ),
        JoinStage(
            name="merge",
            fork=fork,
            required=("left", "right"),
            acceptable_terminal_states=("completed", "failed"),
            on_success="done",
            on_failure="failed",
        ),
        task("done", "done@1", "completed", kind="action"),
    )
    return make("tolerant-fork", fork, stages)


def fallback() -> Plan:
    """``work`` fails over to a ``notify`` worker that stays open: the run has no intent while
    ``work`` is failed, so an operator may re-drive it."""
    stages: tuple[Stage, ...] = (
        task("work", "work@1", "completed", "notify", retry=RetryPolicy(max_attempts=1)),
        task("notify", "notify@1", "failed"),
    )
    return make("fallback", "work", stages)


def chained_binding() -> Plan:
    """``second`` reads ``first``'s result: a missing field is a terminal binding error."""
    ref = Binding(
        source="stage",
        stage="first",
        path=("uri",),
        expected_type="string",
        raw='${stages["first"].result.uri}',
    )
    stages: tuple[Stage, ...] = (
        task("first", "first@1", "second"),
        task("second", "second@1", "completed", input={"uri": ref}),
    )
    return make("chained", "first", stages)


def gate(name: str, on_approve: str, **extra: Any) -> ApprovalStage:
    """An approval gate: one operator of the run's tenant, not the requester, within a minute."""
    values: dict[str, Any] = {
        "approvers": Approvers(),
        "options": ("approve", "reject"),
        "on_approve": on_approve,
        "on_reject": "failed",
        "timeout_ms": 60_000,
        "on_timeout": "failed",
    }
    values.update(extra)
    return ApprovalStage(name=name, **values)


def gated(**gate_extra: Any) -> Plan:
    """a (worker) → review (approval) → b (action) → completed; a compensates."""
    stages: tuple[Stage, ...] = (
        task("a", "alpha@1", "review", compensate=pin("undo-alpha@1", "action")),
        gate("review", "b", **gate_extra),
        task("b", "beta@1", "completed", kind="action"),
    )
    return make("gated", "a", stages, finalisers=(pin("audit@1", "action"),))


def gated_fork() -> Plan:
    """A fork with an approval gate on one branch and a task on the other."""
    fork = "split"
    stages: tuple[Stage, ...] = (
        ForkStage(name=fork, branches=("sign-off", "work"), join="merge"),
        gate("sign-off", "merge", on_reject="merge", on_timeout="merge", fork=fork,
             branch="sign-off"),
        task("work", "work@1", "merge", fork=fork, branch="work"),
        JoinStage(
            name="merge",
            fork=fork,
            required=("sign-off", "work"),
            acceptable_terminal_states=("completed",),
            on_success="done",
            on_failure="failed",
        ),
        task("done", "done@1", "completed", kind="action"),
    )  # fmt: skip
    return make("gated-fork", fork, stages)


def nested_fork(**extra: object) -> Plan:
    """outer: [inner-fork → (a1 | a2) → inner-join → after-inner, b] → outer-join → done.

    The inner join accepts only completed branches and, failing, goes to ``recover`` (still on
    the outer branch), so an inner failure stops only the inner fork."""
    outer, inner = "outer", "inner-fork"
    stages: tuple[Stage, ...] = (
        ForkStage(name=outer, branches=(inner, "b"), join="outer-join"),
        ForkStage(name=inner, branches=("a1", "a2"), join="inner-join", fork=outer,
                  branch=inner),
        task("a1", "a1@1", "inner-join", "inner-join", fork=inner, branch="a1",
             retry=RetryPolicy(max_attempts=1)),
        task("a2", "a2@1", "inner-join", "inner-join", fork=inner, branch="a2",
             retry=RetryPolicy(max_attempts=1)),
        JoinStage(name="inner-join", fork=inner, required=("a1", "a2"),
                  acceptable_terminal_states=("completed",), on_success="after-inner",
                  on_failure="recover", branch=inner),
        task("after-inner", "after@1", "outer-join", fork=outer, branch=inner),
        task("recover", "recover@1", "outer-join", fork=outer, branch=inner),
        task("b", "b@1", "outer-join", "outer-join", fork=outer, branch="b",
             retry=RetryPolicy(max_attempts=1)),
        JoinStage(name="outer-join", fork=outer, required=(inner, "b"),
                  acceptable_terminal_states=("completed",), on_success="done",
                  on_failure="failed"),
        task("done", "done@1", "completed", kind="action"),
    )  # fmt: skip
    return make("nested-fork", outer, stages, **extra)


ALL_PLANS: dict[str, Callable[[], Plan]] = {
    "model-ingest": model_ingest,
    "linear": linear,
    "saga": saga,
    "saga-policies": saga_with_policies,
    "tolerant-fork": tolerant_fork,
    "fallback": fallback,
    "chained": chained_binding,
    "gated": gated,
    "gated-fork": gated_fork,
    "nested-fork": nested_fork,
}
