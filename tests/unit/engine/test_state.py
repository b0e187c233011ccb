"""Records, the transition table, replay (I12), rebuilding dispatches and the outbox (I7)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from accord.canonical import canonical_json
from accord.engine.machine.effects import DispatchJob, EmitTelemetry, InvokeAction
from accord.engine.machine.envelope import rebuild_effect
from accord.engine.machine.events import CancelRequested
from accord.engine.machine.replay import ReplayDivergence, replay
from accord.engine.machine.state import HistoryEntry, RunState, StageState
from accord.engine.machine.transitions import (
    ATTEMPT_TRANSITIONS,
    RUN_TRANSITIONS,
    STAGE_TRANSITIONS,
    IllegalTransition,
    check_run,
    check_stage,
)
from tests.unit.engine import invariants as inv
from tests.unit.engine import plans
from tests.unit.engine.sim import Sim

STAGE_STATUSES = {
    "pending", "queued", "running", "retry-scheduled", "completed", "failed", "timed-out",
    "cancelled", "skipped", "quarantined", "waiting",
}  # fmt: skip


def _busy_run() -> Sim:
    sim = Sim(plans.model_ingest())
    sim.start()
    sim.succeed("cache-lookup", {"hit": False, "tags": ["a", "b"]})
    sim.accept("render-thumbnail")
    sim.progress("render-thumbnail", 0.25)
    sim.succeed("render-thumbnail", {"thumbnail": "t.png"})
    sim.succeed("semantic-analysis")
    sim.fail("technical-metadata", retryable=True)
    return sim


def test_transition_table_covers_every_status_and_refuses_illegal_moves() -> None:
    assert set(STAGE_TRANSITIONS) == STAGE_STATUSES
    assert all(targets <= STAGE_STATUSES for targets in STAGE_TRANSITIONS.values())
    assert all(t <= set(ATTEMPT_TRANSITIONS) for t in ATTEMPT_TRANSITIONS.values())
    assert STAGE_TRANSITIONS["completed"] == frozenset()
    with pytest.raises(IllegalTransition):
        check_stage("a", "completed", "running")
    with pytest.raises(IllegalTransition):
        check_run("r", "completed", "finalising")
    assert RUN_TRANSITIONS["running"] == {"finalising"}


def test_run_state_json_round_trip_is_exact_and_canonical() -> None:
    run = _busy_run().state
    doc = json.loads(canonical_json(run.to_json()))
    back = RunState.from_json(doc)
    assert back == run and canonical_json(back.to_json()) == canonical_json(run.to_json())
    assert back.join_arrivals == {"derive-join": ("semantic-analysis",)}
    assert isinstance(back.released, tuple) and isinstance(
        back.stages["render-thumbnail"], StageState
    )


def test_history_entry_json_round_trip() -> None:
    entry = _busy_run().history[-1]
    assert HistoryEntry.from_json(json.loads(canonical_json(entry.to_json()))) == entry


def test_every_history_entry_records_its_event_and_seq_grows_by_one() -> None:
    sim = _busy_run()
    assert [h.seq for h in sim.history] == list(range(1, len(sim.history) + 1))
    assert sim.state.seq == len(sim.history)
    assert [h.event["kind"] for h in sim.history][:2] == ["run-started", "stage-succeeded"]


def test_I12_replay_reproduces_the_stored_record_exactly() -> None:
    sim = _busy_run()
    sim.apply(sim.callbacks[1])  # a duplicate: rejections are history too
    sim.apply(CancelRequested(run_id="run-1"))
    sim.succeed("@finaliser/0")
    inv.assert_i12_replay(sim.plan, sim.history, sim.state)
    for n in range(1, len(sim.history)):
        partial = replay(sim.plan, sim.history[:n])
        assert partial is not None and partial.seq == n
    assert replay(sim.plan, []) is None


def test_replay_reports_divergence_instead_of_guessing() -> None:
    sim = _busy_run()
    tampered = list(sim.history)
    tampered[2] = dataclasses.replace(tampered[2], accepted=False, reason="stale")
    with pytest.raises(ReplayDivergence) as err:
        replay(sim.plan, tampered)
    assert err.value.seq == 3


def test_rebuild_effect_reproduces_the_first_dispatch_exactly() -> None:
    sim = _busy_run()
    sim.fire(sim.timer("retry", "technical-metadata"))
    first_by_job = {d.job_id: d for d in sim.dispatched}
    for name in ("technical-metadata",):
        rebuilt = rebuild_effect(sim.plan, sim.state, name)
        assert isinstance(rebuilt, DispatchJob) and rebuilt == first_by_job[rebuilt.job_id]
    assert rebuild_effect(sim.plan, sim.state, "semantic-analysis") is None
    sim2 = Sim(plans.saga())
    sim2.start()
    sim2.fail("reserve")
    action = rebuild_effect(sim2.plan, RunState.from_json(sim2.state.to_json()), "@finaliser/0")
    assert isinstance(action, InvokeAction) and action == sim2.dispatched[-1]


def test_I7_every_dispatch_and_clock_is_in_the_same_transition() -> None:
    sim = Sim(plans.model_ingest())
    tr = sim.start()
    inv.assert_i7_outbox(None, tr)
    before = sim.state
    tr = sim.succeed("cache-lookup", {"hit": False})
    inv.assert_i7_outbox(before, tr)
    before = sim.state
    tr = sim.succeed("render-thumbnail")
    inv.assert_i7_outbox(before, tr)
    names = [e.name for e in tr.effects if isinstance(e, EmitTelemetry)]
    assert names == ["stage.completed", "stage.dispatched", "stage.dispatched"]
    ids = [e.event_id for e in tr.effects if isinstance(e, EmitTelemetry)]
    assert len(set(ids)) == len(ids)


def test_I1_drained_runs_reach_exactly_one_terminal_state() -> None:
    for name, build in plans.ALL_PLANS.items():
        sim = Sim(build())
        sim.start()
        run = sim.drain(results={"cache-lookup": {"hit": False}, "first": {"uri": "s3://x"}})
        inv.assert_i1_terminal(run)
        assert run.status == "completed", name
        inv.assert_i12_replay(sim.plan, sim.history, run)


def test_history_events_are_exactly_event_to_json() -> None:
    from accord.engine.machine.events import event_from_json, event_to_json

    for entry in _busy_run().history:
        assert event_to_json(event_from_json(entry.event)) == entry.event
