"""Nothing poisons a commit, at the shell's parts: an outcome intake takes is always storable, a
coalesced commit that cannot be stored commits its members one by one, refused callbacks are
recorded at most ``REFUSALS_RECORDED`` times per attempt (the rest quarantined), and a run is
started only with a safe tenant and a context its plan's context contract accepts."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accord.canonical import canonical_json
from accord.engine.machine.events import (
    HeartbeatReceived,
    ProgressReported,
    StageAccepted,
    event_to_json,
)
from accord.engine.machine.replay import replay
from accord.engine.runtime.intake import MalformedOutcome, parse_delivery
from accord.errors import AccordError
from accord.testing.harness import EngineHarness
from accord.testing.plans import model_ingest_shape
from accord.testing.workers import outcome
from accord.workflow.plan import Plan, TaskStage

ROOT = Path(__file__).resolve().parents[3]
PLAN = model_ingest_shape(name="poisoned-outcomes")
JOB = {"messageId": "msg_1", "runId": "r1", "stage": "render", "attempt": 2, "fence": "ab" * 8}

# text with lone surrogates and control characters; numbers with NaN and the infinities
# (st.text never draws a lone surrogate: join characters instead)
texts = st.lists(st.characters() | st.sampled_from(["\ud800", "\udfff", "\x00"]), max_size=6).map(
    "".join
)
anything = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
KINDS = ("accepted", "heartbeat", "progress", "succeeded", "failed")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(KINDS),
    field=st.sampled_from(["messageId", "runId", "stage", "fence", "tenant", "workerId"]),
    value=texts,
    payload=st.dictionaries(st.sampled_from(["percent", "message", "code", "x"]), anything),
)
def test_every_outcome_intake_takes_can_be_stored(
    kind: str, field: str, value: str, payload: dict[str, Any]
) -> None:
    doc: dict[str, Any] = {
        "messageId": "m", "messageType": kind, "runId": "r", "stage": "s", "attempt": 1,
        "fence": "f", "tenant": "t", "payload": payload, field: value,
    }  # fmt: skip
    body = json.dumps(doc).encode()  # NaN and Infinity as such, a surrogate escaped
    try:
        _, [(_, got)] = parse_delivery(body)
    except MalformedOutcome as exc:
        assert str(exc)
        return
    if isinstance(got, MalformedOutcome):
        return
    canonical_json(event_to_json(got))  # never raises for what intake lets through


async def test_a_coalesced_commit_that_cannot_be_stored_commits_its_members_one_by_one() -> None:
    """Behind the wire's checks: should an unstorable event reach the shell, the event that
    shared its commit is committed and only the bad one is refused."""
    from accord.engine.runtime.intake import RefusedOutcome

    async with EngineHarness() as h:
        run = await h.start_run(PLAN, {"modelId": "m1"})
        job = h.job(run, "render")
        ident = {"run_id": run, "stage": "render", "attempt": job["attempt"], "fence": job["fence"]}
        bad = ProgressReported(**ident, progress=float("nan"), message_id="forged")
        commits = h.engine.commits
        got = await asyncio.gather(
            h.engine.deliver(bad),
            h.engine.deliver(StageAccepted(**ident, worker_id="w1")),
            return_exceptions=True,
        )
        assert h.engine.mail.coalesced == 1  # they did share a batch
        assert isinstance(got[0], RefusedOutcome), got[0]
        assert "cannot be stored" in str(got[0])
        assert not isinstance(got[1], BaseException)
        assert (await h.run(run)).stages["render"].status == "running"
        assert h.engine.commits == commits + 1
        history = await h.history(run)
        assert [e.event["kind"] for e in history].count("progress") == 0
        assert replay(PLAN, history) == await h.run(run)


async def test_forged_stale_outcomes_are_recorded_at_most_n_times_per_attempt() -> None:
    from accord.engine.runtime.orchestrator import REFUSALS_RECORDED

    async with EngineHarness() as h:
        run = await h.start_run(PLAN, {"modelId": "m1"})
        job = h.job(run, "render")
        await h.send_outcome(*outcome(job, "accepted"))
        before = len(await h.history(run))
        forged = job | {"fence": "forged"}
        for n in range(500):
            mid = f"forged-{n}"
            await h.send_outcome(*outcome(forged | {"messageId": mid}, "heartbeat"))
        history = await h.history(run)
        refused = history[before:]
        assert len(refused) == REFUSALS_RECORDED
        assert {(e.accepted, e.reason) for e in refused} == {(False, "stale")}
        assert h.engine.refusals.unrecorded == 500 - REFUSALS_RECORDED
        held = await h.take(h.engine.intake.queue + ".quarantine")
        assert len(held) == 500 - REFUSALS_RECORDED  # counted and kept, not dropped
        reason = json.loads(held[0].body)["reason"]
        assert reason.startswith("refused (stale: fence does not match the current attempt)")
        state = await h.run(run)
        assert replay(PLAN, history) == state  # I12 still holds
        # a fresh engine counts from the stored history: still nothing more recorded
        await h.crash()
        await h.send_outcome(*outcome(forged | {"messageId": "forged-after"}, "heartbeat"))
        assert len(await h.history(run)) == len(history)
        # the worker's own outcomes are taken as ever
        await h.send_outcome(*outcome(job, "succeeded", {"uri": "s3://x"}))
        assert (await h.run(run)).stages["render"].status == "completed"


@pytest.mark.parametrize(
    "tenant", ["../other tenant\n", "", "a b", "-x", "x" * 64, "t\u00e9", "\ud800"]
)
async def test_start_run_refuses_an_unsafe_tenant_and_creates_nothing(tenant: str) -> None:
    async with EngineHarness() as h:
        await h.register(PLAN)
        with pytest.raises(AccordError, match="tenant"):
            await h.engine.start_run(PLAN.name, {"modelId": "m1"}, tenant, run_id="r-bad")
        assert await h.engine.load("r-bad") is None
        assert await h.engine.store.history("r-bad") == []


async def test_start_run_refuses_a_context_that_cannot_be_stored() -> None:
    async with EngineHarness() as h:
        await h.register(PLAN)
        for context in ({"x": float("nan")}, {"\ud800": 1}, {"x": ["\udfff"]}):
            with pytest.raises(AccordError, match="context"):
                await h.engine.start_run(PLAN.name, context, run_id="r-bad")
        assert await h.engine.load("r-bad") is None


def _with_context_contract() -> tuple[Plan, Any]:
    from accord.cli.workflow import compile_file
    from accord.contracts.sources import load_catalog

    catalog = load_catalog(ROOT / "schemas" / "contracts")
    plan = compile_file(ROOT / "workflows" / "model-ingest.yaml", catalog).unwrap()
    ref = next(s for s in plan.stages if isinstance(s, TaskStage)).capability.request
    kw = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)}
    kw = {k: v for k, v in kw.items() if k not in ("digest", "_index")}
    return Plan.create(**kw | {"context_contract": ref, "name": "with-context"}), catalog


async def test_start_run_refuses_a_context_that_breaks_the_context_contract() -> None:
    from accord.engine.runtime.orchestrator import Engine

    plan, catalog = _with_context_contract()
    async with EngineHarness() as h:
        engine = Engine(h.store, h.transport, h.clock, catalog=catalog)
        await engine.register_plan(plan)
        with pytest.raises(AccordError, match="modelId: required field is missing"):
            await engine.start_run(plan.name, {"other": 1}, run_id="r-bad")
        assert await engine.load("r-bad") is None
        rid = await engine.start_run(plan.name, {"modelId": "m1"}, run_id="r-good")
        assert (await engine.load(rid)) is not None


async def test_a_heartbeat_forged_with_a_huge_attempt_is_quarantined() -> None:
    async with EngineHarness() as h:
        run = await h.start_run(PLAN, {"modelId": "m1"})
        job = h.job(run, "render")
        message_id, body = outcome(job, "heartbeat", {"at": 1.0})
        forged = canonical_json(json.loads(body) | {"attempt": 2**70})
        events = await h.send_outcome(message_id, forged)
        assert events == [None]
        assert h.engine.intake.quarantined[-1]["reason"] == (
            "not a valid outcome@1 message: field 'attempt': "
            "Input should be less than or equal to 2147483647"
        )
        assert not any(isinstance(e, HeartbeatReceived) for e in events)


async def test_a_member_answered_with_failed_fails_alone() -> None:
    import contextlib
    from collections.abc import AsyncIterator

    from accord.engine.runtime.coalesce import Failed, Mailboxes

    lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def locked(_key: str) -> AsyncIterator[None]:
        async with lock:
            yield

    mail: Mailboxes[int, int] = Mailboxes(locked)
    batches: list[list[int]] = []

    async def run_batch(items: list[int]) -> list[int | Failed]:
        batches.append(items)
        return [Failed(ValueError(f"bad {n}")) if n % 2 else n * 10 for n in items]

    got = await asyncio.gather(
        *(mail.submit("r", n, run_batch) for n in (1, 2, 3, 4)), return_exceptions=True
    )
    assert batches == [[1, 2, 3, 4]]  # one batch; the leader (1) failed alone
    assert [str(g) if isinstance(g, Exception) else g for g in got] == ["bad 1", 20, "bad 3", 40]


async def test_a_run_starts_with_its_context_contracts_defaults_applied() -> None:
    """A binding the compiler accepts for a context field with a default finds the default: the
    run's context is the one the contract's check gives back."""
    from accord.engine.runtime.orchestrator import Engine

    base, catalog = _with_context_contract()
    kw = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    kw = {k: v for k, v in kw.items() if k not in ("digest", "_index")}
    plan = Plan.create(**kw | {"context_contract": "metadata-extraction-request@1"})
    async with EngineHarness() as h:
        engine = Engine(h.store, h.transport, h.clock, catalog=catalog)
        await engine.register_plan(plan)
        rid = await engine.start_run(plan.name, {"modelId": "m1"}, run_id="r-defaults")
        run = await engine.load(rid)
        assert run is not None
        assert run.context == {"modelId": "m1", "computeVolume": True}
