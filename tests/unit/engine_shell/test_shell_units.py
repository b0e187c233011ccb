"""Unit and property tests of the shell's pure parts: outcome parsing, commit building, and
explanations; plus the action executor's classification of handler outcomes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accord.canonical import canonical_json
from accord.engine.machine.effects import (
    CancelTimer,
    DispatchJob,
    Effect,
    EmitTelemetry,
    InvokeAction,
    RequestCancellation,
    ScheduleTimer,
)
from accord.engine.machine.events import (
    Event,
    HeartbeatReceived,
    ProgressReported,
    StageAccepted,
    StageFailed,
    StageSucceeded,
)
from accord.engine.machine.explain import describe_event
from accord.engine.runtime.actions import ActionContext, ActionExecutor, ActionRegistry
from accord.engine.runtime.intake import MalformedOutcome, parse_delivery, parse_outcome
from accord.engine.runtime.outbox import build_commit, control_queue
from accord.errors import StageFailed as HandlerFailed
from accord.testing.workers import outcome

JOB = {"messageId": "msg_1", "runId": "r1", "stage": "render", "attempt": 2, "fence": "ab" * 16}
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=10,
)


@given(st.binary(max_size=300))
def test_parse_outcome_refuses_junk_only_with_a_reason(body: bytes) -> None:
    try:
        event, _ = parse_outcome(body)
    except MalformedOutcome as exc:
        assert str(exc)
    else:
        assert isinstance(event, StageAccepted | HeartbeatReceived | ProgressReported)


@given(json_values)
def test_parse_outcome_never_crashes_on_any_json(doc: Any) -> None:
    try:
        parse_outcome(json.dumps(doc).encode())
    except MalformedOutcome as exc:
        assert str(exc)


@given(json_values | st.lists(json_values, max_size=4).map(lambda m: {"messageType": "batch",
                                                                    "outcomes": m}))  # fmt: skip
def test_parse_delivery_never_crashes_and_names_each_bad_member(doc: Any) -> None:
    try:
        batch, members = parse_delivery(json.dumps(doc).encode())
    except MalformedOutcome as exc:
        assert str(exc)
        return
    assert batch == (isinstance(doc, dict) and doc.get("messageType") == "batch")
    assert len(members) == (len(doc["outcomes"]) if batch else 1)
    for i, (_, got) in enumerate(members):
        assert not isinstance(got, MalformedOutcome) or str(got).startswith(f"batch member {i}: ")


@given(
    kind=st.sampled_from(["accepted", "heartbeat", "progress", "succeeded", "failed"]),
    result=st.dictionaries(st.text(min_size=1, max_size=5), st.integers(), max_size=3),
    retryable=st.booleans(),
)
def test_worker_outcomes_parse_to_the_attempt_they_answer(
    kind: str, result: dict[str, int], retryable: bool
) -> None:
    payload: dict[str, Any] = dict(result) if kind == "succeeded" else {}
    if kind == "heartbeat":
        payload = {"at": 1.5}
    elif kind == "failed":
        payload = {"code": "boom", "message": "m", "retryable": retryable}
    elif kind == "progress":
        payload = {"percent": 40, "message": "m"}
    message_id, body = outcome(JOB, kind, payload)
    event, _ = parse_outcome(body)
    assert isinstance(
        event, StageAccepted | HeartbeatReceived | ProgressReported | StageSucceeded | StageFailed
    )
    assert (event.run_id, event.stage, event.attempt, event.fence) == (
        "r1",
        "render",
        2,
        JOB["fence"],
    )
    assert event.message_id == message_id
    expected: dict[str, type] = {
        "accepted": StageAccepted,
        "heartbeat": HeartbeatReceived,
        "progress": ProgressReported,
        "succeeded": StageSucceeded,
        "failed": StageFailed,
    }
    assert type(event) is expected[kind]
    if isinstance(event, StageSucceeded):
        assert event.result == result
    if isinstance(event, StageFailed):
        assert event.retryable is retryable and event.code == "boom"
    if isinstance(event, ProgressReported):
        assert event.progress == pytest.approx(0.4)


def test_parse_outcome_names_the_bad_field() -> None:
    _, good = outcome(JOB, "failed", {"code": "x", "message": "", "retryable": True})
    bad = json.loads(good) | {"payload": {"code": "x", "message": "", "retryable": "yes"}}
    with pytest.raises(MalformedOutcome, match=r"payload\.retryable"):
        parse_outcome(canonical_json(bad))
    with pytest.raises(MalformedOutcome, match="not JSON"):
        parse_outcome(b"\xff{")
    with pytest.raises(MalformedOutcome, match="field 'messageType': Input should be 'accepted'"):
        parse_outcome(canonical_json({**JOB, "messageType": "done"}))
    with pytest.raises(MalformedOutcome, match="exceeds"):
        parse_outcome(b" " * 2_000_000)


def _sched(tid: str, due: int = 10) -> ScheduleTimer:
    return ScheduleTimer(timer_id=tid, timer="queue", due_at_ms=due, stage="s", attempt=1)


@given(st.lists(st.tuples(st.booleans(), st.sampled_from(["t1", "t2", "t3"])), max_size=8))
def test_commit_keeps_the_last_word_on_each_timer(ops: list[tuple[bool, str]]) -> None:
    effects: list[Effect] = [_sched(t) if arm else CancelTimer(timer_id=t) for arm, t in ops]
    commit = build_commit(
        "r", expected_version=3, state={}, history=[], effects=effects, now_ms=5, index={}
    )
    last: dict[str, bool] = {}
    for arm, t in ops:
        last[t] = arm
    assert {t.timer_id for t in commit.timers_set} == {t for t, arm in last.items() if arm}
    assert set(commit.timers_cancel) == {t for t, arm in last.items() if not arm}
    assert commit.new_version == 4


def test_fired_timer_is_removed_unless_rearmed() -> None:
    kw: dict[str, Any] = {"expected_version": 1, "state": {}, "history": [], "now_ms": 0}
    stale = build_commit("r", effects=[], index={}, fired_timer="t1", **kw)
    assert stale.timers_cancel == ("t1",)
    rearmed = build_commit("r", effects=[_sched("t1", 99)], index={}, fired_timer="t1", **kw)
    assert rearmed.timers_cancel == () and rearmed.timers_set[0].due_at_ms == 99


def test_effects_become_outbox_rows_by_topic() -> None:
    effects: list[Effect] = [
        DispatchJob(job_id="j1", queue="render", capability="c@1", envelope=JOB),
        InvokeAction(job_id="j2", capability="a@1", envelope=JOB),
        RequestCancellation(job_id="j1", queue="render", stage="s", attempt=1, fence="f"),
        EmitTelemetry(event_id="e1", name="stage.completed"),
    ]
    commit = build_commit(
        "r", expected_version=0, state={}, history=[], effects=effects, now_ms=7, index={}
    )
    assert [(e.entry_id, e.topic) for e in commit.outbox] == [
        ("j1", "job:render"),
        ("j2", "action"),
        ("j1:cancel", "cancel:render"),
        ("e1", "telemetry"),
    ]
    assert all(e.created_at_ms == 7 for e in commit.outbox)
    assert control_queue("render") == "accord.control.render"


@pytest.mark.parametrize(
    ("raises", "expected"),
    [
        (None, ("stage-succeeded", None)),
        (HandlerFailed("nope", failure_code="not-found"), ("stage-failed", "not-found")),
        (RuntimeError("bug"), ("stage-failed", "action-crashed")),
    ],
)
async def test_action_outcomes_are_classified(
    raises: Exception | None, expected: tuple[str, str | None]
) -> None:
    got: list[Event] = []
    done: list[str] = []

    async def handler(payload: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
        assert ctx.stage == "render" and ctx.attempt == 2 and payload == {"a": 1}
        if raises is not None:
            raise raises
        return {"ok": True}

    async def deliver(event: Event) -> None:
        got.append(event)

    executor = ActionExecutor(ActionRegistry({"a@1": handler}), deliver, done.append)
    executor.submit("entry-1", "r1", {"capability": "a@1", "envelope": JOB | {"payload": {"a": 1}}})
    executor.submit("entry-1", "r1", {"capability": "a@1", "envelope": JOB})  # already running
    await executor.wait_idle()
    assert len(got) == 1 and done == ["entry-1"]
    event = got[0]
    assert event.kind == expected[0] and event.run_id == "r1"
    if isinstance(event, StageFailed):
        assert event.code == expected[1]
        assert event.retryable is isinstance(raises, RuntimeError)


def test_events_are_described_for_operators() -> None:
    failed = {"kind": "stage-failed", "stage": "s", "attempt": 1, "code": "x", "retryable": True}
    assert describe_event(failed).startswith("stage 's' attempt 1 failed (retryable, x)")
    assert "timer fired" in describe_event({"kind": "timer-fired", "timer": "queue"})


def test_i3_event_entropy_is_fresh_and_never_shared_with_a_forked_child() -> None:
    import os

    from accord.engine.runtime.stamping import ENTROPY

    draws = {ENTROPY.draw() for _ in range(600)}  # crosses a pool refill
    assert len(draws) == 600 and all(len(d) == 32 for d in draws)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child draws from its own, fresh pool
        os.write(write, ENTROPY.draw().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    os.close(write)
    assert child != ENTROPY.draw() and child not in draws
