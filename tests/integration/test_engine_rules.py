"""One named test per rule of the engine shell (docs/architecture.md §4 "The shell",
docs/reliability.md I1–I7).

Most run on the testing harness (memory store and queue, fake clock); the multi-engine rules run
two engines on one SQLite file, as two processes would.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from engine_shell_support import ACTIONS

from accord.adapters import open_engine, open_store, open_transport
from accord.engine.machine.effects import DispatchJob, EmitTelemetry
from accord.engine.machine.events import StageSucceeded
from accord.engine.machine.ids import timer_id
from accord.engine.ports import Commit
from accord.engine.runtime.actions import ActionContext
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.errors import StageFailed, StoreError, TransportError
from accord.testing.clock import FakeClock
from accord.testing.harness import EngineHarness
from accord.testing.invariants import assert_run_invariants
from accord.testing.plans import model_ingest_shape
from accord.testing.workers import outcome

PLAN = model_ingest_shape(finaliser=True)


async def _history_kinds(h: EngineHarness, run: str) -> list[tuple[str, bool, str | None]]:
    return [(e.event["kind"], e.accepted, e.reason) for e in await h.history(run)]


async def test_i4_deterministic_job_ids_make_republish_harmless() -> None:
    async with EngineHarness(actions=ACTIONS) as h:
        run = await h.start_run(PLAN, {"modelId": "m1"})
        entries = await h.outbox()
        assert [e.topic for e in entries if e.topic.startswith("job:")] == ["job:render"]
        # the engine dies after publishing, before the done-mark: the sweep publishes again
        await h.crash()
        assert await h.pump() >= 1
        await h.engine.dispatcher.dispatch(entries)  # and once more, by hand
        jobs = await h.jobs("render")
        assert len(jobs) == 1 and jobs[0]["runId"] == run
        assert jobs[0]["messageId"] and jobs[0]["fence"] == h.job(run, "render")["fence"]
        assert await h.outbox() == []


async def test_i2_matching_duplicate_outcome_acked_without_second_release() -> None:
    async with EngineHarness(actions=ACTIONS) as h:
        run = await h.start_run(PLAN, {"modelId": "m1"})
        job = (await h.jobs("render"))[0]
        await h.send_outcome(*outcome(job, "accepted"))
        mid, body = outcome(job, "succeeded", {"uri": "s3://x"})
        await h.send_outcome(mid, body)
        released = (await h.run(run)).released
        dispatched = len(h.effects_of(run, [DispatchJob]))
        # the same outcome again under a new message id (a worker retrying its callback)
        again = await h.send_outcome(mid + "-retry", body)
        assert isinstance(again[0], StageSucceeded)
        state = await h.run(run)
        assert state.released == released
        assert len(h.effects_of(run, [DispatchJob])) == dispatched
        assert (await _history_kinds(h, run))[-1] == ("stage-succeeded", False, "duplicate")
        assert await h.take(h.engine.intake.queue) == []  # both deliveries acknowledged


async def test_i3_stale_fence_recorded_and_changes_nothing() -> None:
    async with EngineHarness(actions=ACTIONS) as h:
        run = await h.start_run(PLAN, {"modelId": "m1"})
        before = await h.run(run)
        done = await h.succeed(run, "render", {"x": 1}, fence="0" * 32)
        assert done.history[0].reason == "stale"
        after = await h.run(run)
        assert after.stages == before.stages and after.seq == before.seq + 1
        assert any(isinstance(e, EmitTelemetry) for e in done.effects)
        assert_run_invariants(PLAN, after, await h.history(run), [e for _, e in h.effects])


async def test_i5_late_callback_after_intent_is_rejected() -> None:
    async with EngineHarness(actions=ACTIONS) as h:
        run = await h.start_run(PLAN, {"modelId": "m1"})
        await h.accept(run, "render")
        await h.succeed(run, "render")
        await h.accept(run, "analyse")
        await h.fail(run, "analyse", code="bad-model")  # terminal: failed intent
        late = await h.succeed(run, "metadata")
        assert late.history[0].reason == "late"
        await h.settle()
        state = await h.run(run)
        assert state.intent == "failed" and state.status == "failed"
        assert state.stages["metadata"].status != "completed"


async def test_i6_timer_claimed_once_with_two_engines(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'two.db'}"
    clock = FakeClock()
    engines = [
        Engine(
            open_store(url, clock=clock),
            open_transport(url, clock=clock),
            clock,
            options=EngineOptions(owner=f"e{i}"),
            actions=ACTIONS,
            owns_ports=True,
        )
        for i in range(2)
    ]
    try:
        await engines[0].register_plan(PLAN)
        runs = [await engines[i % 2].start_run(PLAN.name, {"modelId": f"m{i}"}) for i in range(6)]
        clock.advance(60_001)  # every render job's queue deadline has passed
        fired = await asyncio.gather(*(e.timers.fire_due() for e in engines))
        assert sum(fired) == len(runs)
        for rid in runs:
            timeouts = [
                e for e in await engines[0].history(rid) if e.event["kind"] == "timer-fired"
            ]
            assert len(timeouts) == 1 and timeouts[0].accepted
            assert (await engines[1].load(rid)).stages["render"].status == "retry-scheduled"  # type: ignore[union-attr]
        assert sum(await asyncio.gather(*(e.timers.fire_due() for e in engines))) == 0
    finally:
        for e in engines:
            await e.stop()


async def test_i7_stranded_outbox_entry_republished_by_reconciler() -> None:
    async with EngineHarness(actions=ACTIONS) as h:
        crashed = Engine(
            h.store, h.transport, h.clock, options=EngineOptions(dispatch=False)
        )  # commits, never publishes
        await crashed.register_plan(PLAN)
        run = await crashed.start_run(PLAN.name, {"modelId": "m1"})
        assert await h.jobs("render") == []
        restarted = Engine(h.store, h.transport, h.clock, options=EngineOptions(grace_ms=5_000))
        assert (await restarted.reconcile()).republished == 0  # too young: maybe in flight
        h.clock.advance(5_001)
        stranded = await h.outbox()
        assert "job:render" in [e.topic for e in stranded]
        report = await restarted.reconcile()
        assert report.republished == len(stranded)
        jobs = await h.jobs("render")
        assert [j["runId"] for j in jobs] == [run]
        assert await h.outbox() == []


async def test_i6_reconciler_rearms_a_missing_deadline() -> None:
    async with EngineHarness(actions=ACTIONS) as h:
        run = await h.start_run(PLAN, {"modelId": "m1"})
        stored = await h.store.load(run)
        assert stored is not None
        lost = timer_id(run, "render", 1, "queue")  # the store lost the queue-deadline timer
        await h.store.commit(Commit(run, stored.version, stored.state, timers_cancel=[lost]))
        assert await h.advance(120_000) == 0
        report = await h.engine.reconcile()
        assert report.rearmed == 1 and report.divergences[0].kind == "missing-deadline"
        assert await h.fire_timers() == 1
        assert (await h.run(run)).stages["render"].status == "retry-scheduled"


async def test_dead_lettered_job_is_quarantined_by_reconciler() -> None:
    clock = FakeClock()
    transport = open_transport("memory://", clock=clock, delivery_limits={"render": 1})
    async with EngineHarness(actions=ACTIONS, clock=clock, transport=transport) as h:
        run = await h.start_run(PLAN, {"modelId": "m1"})
        for delivery in await h.take("render"):
            await h.transport.nack(delivery)  # the worker crashed on it, past the limit
        assert await h.take("render") == []
        report = await h.engine.reconcile()
        assert report.poisoned == 1
        render = (await h.run(run)).stages["render"]
        assert render.status == "quarantined"
        assert render.quarantine is not None and render.quarantine["reason"] == "dead-lettered"


async def test_malformed_outcome_is_quarantined_never_dropped() -> None:
    async with EngineHarness(actions=ACTIONS) as h:
        run = await h.start_run(PLAN, {"modelId": "m1"})
        results = await h.send_outcome("junk-1", b'{"messageType": "succeeded", "runId": 7}')
        assert results == [None]
        assert (
            h.engine.intake.quarantined[0]["reason"]
            == "not a valid outcome@1 message: field 'runId': Input should be a valid string"
        )
        _, orphan = outcome(h.job(run, "render") | {"runId": "run_gone"}, "accepted")
        assert await h.send_outcome("orphan-1", orphan) == [None]
        held = await h.take(h.engine.intake.queue + ".quarantine")
        reasons = {json.loads(d.body)["message_id"]: json.loads(d.body)["reason"] for d in held}
        assert reasons == {
            "junk-1": (
                "not a valid outcome@1 message: field 'runId': Input should be a valid string"
            ),
            "orphan-1": "no run 'run_gone'",
        }
        assert await h.take(h.engine.intake.queue) == []


async def test_action_failures_are_classified() -> None:
    async def refuse(payload: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
        raise StageFailed("no such model", failure_code="not-found", retryable=False)

    plan = model_ingest_shape(name="lookup-fails", lookup_action=True)
    async with EngineHarness(actions={"test.lookup@1": refuse}) as h:
        run = await h.start_run(plan, {"modelId": "m1"})
        await h.settle()
        state = await h.run(run)
        assert state.status == "failed"
        assert state.stages["lookup"].error is not None
        assert state.stages["lookup"].error["code"] == "not-found"


async def test_i7_slow_telemetry_sink_never_blocks_progress() -> None:
    gate = asyncio.Event()
    emitted: list[dict[str, Any]] = []

    class SlowSink:
        async def emit(self, events: Any) -> None:
            await gate.wait()
            emitted.extend(events)

    async with EngineHarness(actions=ACTIONS, sink=SlowSink()) as h:
        stop = asyncio.Event()
        consumer = asyncio.get_running_loop().create_task(h.engine.dispatcher.run_telemetry(stop))
        run = await h.start_run(PLAN, {"modelId": "m1"})
        for stage in ("render", "analyse", "metadata", "publish"):
            await h.accept(run, stage)
            await h.succeed(run, stage)
        await h.settle()
        assert (await h.run(run)).status == "completed"  # while the sink is still stuck
        assert any(e.topic == "telemetry" for e in await h.outbox())
        gate.set()
        for _ in range(100):
            await asyncio.sleep(0.01)
            await h.engine.dispatcher.flush()
            if not await h.outbox():
                break
        stop.set()
        await consumer
        assert await h.outbox() == [] and any(e["name"] == "run.started" for e in emitted)


async def test_graceful_shutdown_finishes_in_flight_action(tmp_path: Path) -> None:
    started = asyncio.Event()

    async def slow(payload: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
        started.set()
        await asyncio.sleep(0.2)
        return {"hit": False}

    url = f"sqlite:///{tmp_path / 'stop.db'}"
    plan = model_ingest_shape(name="slow-lookup", lookup_action=True)
    engine = open_engine(
        url, url, options=EngineOptions(poll_ms=10), actions={"test.lookup@1": slow}
    )
    await engine.register_plan(plan)
    await engine.start()
    run = await engine.start_run(plan.name, {"modelId": "m1"})
    await started.wait()
    await engine.stop()  # must wait for the action and commit its outcome
    store = open_store(url)
    try:
        stored = await store.load(run)
        assert stored is not None and stored.state["stages"]["lookup"]["status"] == "completed"
        assert stored.state["stages"]["render"]["status"] == "queued"
        assert await store.claim_outbox(10, "check", 0) == []  # the render job was handed off
    finally:
        await store.close()


async def test_capability_announcements_expire() -> None:
    async with EngineHarness() as h:
        await h.engine.announce("w1", ["thumbnail.render@3", "semantic.analyse@4"], 10_000)
        assert (await h.engine.live_capabilities())["thumbnail.render@3"] == ["w1"]
        h.clock.advance(10_001)
        assert await h.engine.live_capabilities() == {}


async def test_i2_starting_a_run_twice_creates_it_once() -> None:
    async with EngineHarness(actions=ACTIONS) as h:
        await h.start_run(PLAN, {"modelId": "m1"}, run_id="run_once")
        await h.crash()  # a fresh process knows nothing: its create-only commit must lose
        await h.start_run(PLAN, {"modelId": "m2"}, run_id="run_once")
        kinds = await _history_kinds(h, "run_once")
        assert kinds == [("run-started", True, None), ("run-started", False, "duplicate")]
        assert (await h.run("run_once")).context == {"modelId": "m1"}
        assert len(await h.jobs("render")) == 1


async def test_i7_a_publish_refused_after_the_commit_is_left_to_the_sweep() -> None:
    """The broker refuses the job of a committed transition: the delivery still succeeds (the
    run exists; starting it again would make a second one), the entry stays in the outbox, and
    the sweep publishes it."""
    async with EngineHarness(actions=ACTIONS) as h:
        transport = h.engine.dispatcher._transport
        publish, refusals = transport.publish, [1]

        async def refusing(queue: str, message_id: str, body: bytes, delay_ms: int = 0) -> None:
            if refusals:
                refusals.pop()
                raise TransportError(f"RabbitMQ refused a publish to {queue!r}", retryable=True)
            await publish(queue, message_id, body, delay_ms)

        transport.publish = refusing  # type: ignore[method-assign]
        run = await h.start_run(PLAN, {"modelId": "m1"})  # returns: the run is committed
        assert (await h.run(run)).stages["render"].status != "pending"
        assert h.engine.dispatcher.failed == 1
        assert await h.jobs("render") == []
        assert [e.topic for e in await h.outbox()] == ["job:render"]  # still owed
        assert await h.pump() >= 1  # the sweep hands it off
        jobs = await h.jobs("render")
        assert len(jobs) == 1 and jobs[0]["runId"] == run
        assert await h.outbox() == []


async def test_a_start_up_reconciliation_that_meets_a_broker_away_is_run_again(
    tmp_path: Path,
) -> None:
    """A broker restarting while an engine starts defers the first reconciliation to
    housekeeping (it runs again at the next poll, not a period later); a transport error that
    is not retryable, or a store that does not answer, still refuses the start."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    engine = open_engine(url, url, options=EngineOptions(poll_ms=10, reconcile_every_ms=600_000))
    real = engine.reconciler.run_once
    calls: list[str] = []

    async def flaky() -> Any:
        calls.append("pass")
        if len(calls) == 1:
            raise TransportError("connection reset by peer", retryable=True)
        return await real()

    engine.reconciler.run_once = flaky  # type: ignore[method-assign]
    await engine.start()
    try:
        for _ in range(200):
            if len(calls) >= 2:
                break
            await asyncio.sleep(0.01)
        assert len(calls) == 2, "the deferred reconciliation never ran"
        await asyncio.sleep(0.1)
        assert len(calls) == 2, "housekeeping kept reconciling after one pass succeeded"
    finally:
        await engine.stop()

    async def broken() -> Any:
        raise TransportError("no such queue", retryable=False)

    async def store_away() -> Any:
        raise StoreError("connection problem: connection refused", retryable=True)

    for failing, error, match in ((broken, TransportError, "no such queue"),
                                  (store_away, StoreError, "connection refused")):  # fmt: skip
        refused = open_engine(url, url, options=EngineOptions(poll_ms=10))
        refused.reconciler.run_once = failing  # type: ignore[method-assign]
        try:
            with pytest.raises(error, match=match):
                await refused.start()
        finally:
            await refused.stop()
