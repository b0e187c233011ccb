"""Outcome batches at the engine's intake (accord.engine.runtime.intake): each member is taken
exactly as if it had come alone, and the batch is settled once, as a whole.

On the testing harness (memory store and queue); the joint case runs the engine and a worker on
one SQLite file, where a lone outcome is acknowledged by its own commit.
"""

from __future__ import annotations

import json
from pathlib import Path

from engine_shell_support import ACTIONS, assert_drained, wait_terminal

from accord.adapters import open_engine, open_transport
from accord.adapters.clock import SystemClock
from accord.engine.machine.effects import DispatchJob
from accord.engine.machine.events import StageAccepted, StageSucceeded
from accord.engine.runtime.intake import OUTCOMES_QUEUE, encode_batch
from accord.engine.runtime.orchestrator import EngineOptions
from accord.testing.harness import EngineHarness
from accord.testing.invariants import assert_run_invariants
from accord.testing.plans import model_ingest_shape
from accord.testing.workers import outcome
from accord.worker.batching import OutcomeBatcher

PLAN = model_ingest_shape(finaliser=True)


async def test_a_batch_commits_each_member_in_order_and_is_acknowledged_once() -> None:
    async with EngineHarness(actions=ACTIONS) as h:
        one = await h.start_run(PLAN, {"modelId": "m1"})
        two = await h.start_run(PLAN, {"modelId": "m2"})
        j1, j2 = h.job(one, "render"), h.job(two, "render")
        members = [
            outcome(j1, "accepted"),
            outcome(j2, "accepted"),
            outcome(j1, "succeeded", {"uri": "s3://one"}),
        ]
        events = await h.send_outcome(*encode_batch(members))
        assert [type(e) for e in events] == [StageAccepted, StageAccepted, StageSucceeded]
        assert [e.run_id for e in events if e] == [one, two, one]
        first, second = await h.run(one), await h.run(two)
        assert first.stages["render"].status == "completed"
        assert first.stages["render"].result == {"uri": "s3://one"}
        assert second.stages["render"].status == "running"
        assert h.engine.intake.processed == 3
        assert await h.take(h.engine.intake.queue) == []  # the batch is settled
        for run in (one, two):
            assert_run_invariants(PLAN, await h.run(run), await h.history(run))


async def test_a_redelivered_batch_is_duplicates_released_once() -> None:
    async with EngineHarness(actions=ACTIONS) as h:
        run = await h.start_run(PLAN, {"modelId": "m1"})
        job = h.job(run, "render")
        mid, body = encode_batch([outcome(job, "accepted"), outcome(job, "succeeded", {"u": 1})])
        await h.send_outcome(mid, body)
        released = (await h.run(run)).released
        dispatched = len(h.effects_of(run, [DispatchJob]))
        # the engine died before the batch's ack: the same batch comes again
        again = await h.send_outcome(mid + "-again", body)
        assert [type(e) for e in again] == [StageAccepted, StageSucceeded]
        state = await h.run(run)
        assert state.released == released
        assert len(h.effects_of(run, [DispatchJob])) == dispatched
        kinds = [(e.event["kind"], e.accepted, e.reason) for e in await h.history(run)]
        assert kinds[-1] == ("stage-succeeded", False, "duplicate")
        assert await h.take(h.engine.intake.queue) == []


async def test_a_bad_member_is_quarantined_alone_and_the_others_go_on() -> None:
    async with EngineHarness(actions=ACTIONS) as h:
        run = await h.start_run(PLAN, {"modelId": "m1"})
        job = h.job(run, "render")
        _, orphan = outcome(job | {"runId": "run_gone", "messageId": "gone"}, "accepted")
        body = b"".join(
            (
                b'{"messageType":"batch","outcomes":[',
                outcome(job, "accepted")[1],
                b',{"messageType":"succeeded","runId":7},',
                orphan,
                b"]}",
            )
        )
        events = await h.send_outcome("batch-mixed", body)
        assert isinstance(events[0], StageAccepted) and events[1:] == [None, None]
        assert (await h.run(run)).stages["render"].status == "running"
        held = await h.take(h.engine.intake.queue + ".quarantine")
        reasons = {json.loads(d.body)["message_id"]: json.loads(d.body)["reason"] for d in held}
        assert reasons == {
            "batch-mixed#1": "batch member 1: not a valid outcome@1 message: field 'runId': "
            "Input should be a valid string",
            "gone:accepted": "no run 'run_gone'",
        }
        assert await h.take(h.engine.intake.queue) == []  # the batch itself is settled


async def test_a_batch_that_cannot_be_read_is_quarantined_whole() -> None:
    async with EngineHarness(actions=ACTIONS) as h:
        await h.start_run(PLAN, {"modelId": "m1"})
        events = await h.send_outcome("batch-empty", b'{"messageType":"batch","outcomes":[]}')
        assert events == [None]
        nested = b'{"messageType":"batch","outcomes":[{"messageType":"batch","outcomes":[]}]}'
        assert await h.send_outcome("batch-nested", nested) == [None]
        reasons = [q["reason"] for q in h.engine.intake.quarantined]
        assert reasons == [
            "field 'outcomes' of a batch must be a non-empty array",
            "batch member 0: a batch inside a batch",
        ]


async def test_batches_on_the_joint_queue_are_acknowledged_by_intake(tmp_path: Path) -> None:
    """With the queue in the store's database a lone outcome is settled by its own commit; a
    batch is settled once, after all its members are committed."""
    db = tmp_path / "joint.db"
    plan = model_ingest_shape(name="joint-batches")
    engine = open_engine(
        f"sqlite:///{db}", f"sqlite:///{db}", SystemClock(), options=EngineOptions(poll_ms=10)
    )
    worker = open_transport(f"sqlite:///{db}")
    try:
        await engine.register_plan(plan)
        await engine.start()
        runs = [await engine.start_run(plan.name, {"modelId": f"m{i}"}) for i in range(3)]
        answers = OutcomeBatcher(worker, OUTCOMES_QUEUE)
        for stage in ("render", "analyse", "metadata", "publish"):
            jobs = []
            async for delivery in worker.consume(stage, 10):
                jobs.append((delivery, json.loads(delivery.body)))
                if len(jobs) == len(runs):
                    break
            # all of a stage's answers in one batch: accepted and succeeded of every run
            pairs = [outcome(j, "accepted") for _, j in jobs]
            pairs += [outcome(j, "succeeded", {}) for _, j in jobs]
            await answers.transport.publish(OUTCOMES_QUEUE, *encode_batch(pairs))
            for delivery, _ in jobs:
                await worker.ack(delivery)
        await wait_terminal(engine.store, runs)
        await assert_drained(engine, plan, runs)
    finally:
        await worker.close()
        await engine.stop()
