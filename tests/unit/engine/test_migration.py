"""Run migration in the machine: the run-migrated transition, its refusals, and replay across
versions (I12)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from accord.canonical import canonical_json
from accord.engine.machine.effects import DispatchJob, EmitTelemetry, InvokeAction, ScheduleTimer
from accord.engine.machine.events import (
    CancelRequested,
    RunMigrated,
    event_from_json,
    event_to_json,
)
from accord.engine.machine.replay import replay, replay_across
from accord.engine.machine.state import RunState
from accord.errors import EngineError
from accord.workflow.migration import event_fields, migration_map
from tests.unit.engine import plans
from tests.unit.engine.migration_plans import QUALITY, migrate, renamed, with_quality_check
from tests.unit.engine.sim import Sim

OLD = plans.model_ingest()
NEW = with_quality_check(OLD)


def _at_fork() -> Sim:
    """model-ingest with both derive branches running."""
    sim = Sim(OLD)
    sim.start(modelId="m-1")
    sim.succeed("cache-lookup", {"hit": False})
    sim.succeed("render-thumbnail", {"uri": "s3://t"})
    assert sim.live() == ["semantic-analysis", "technical-metadata"]
    return sim


def _refused(tr: Any, reason: str) -> str:
    (entry,) = tr.history
    assert not entry.accepted and entry.reason == reason, entry
    return str(entry.note)


def test_rule_a_migration_repins_the_run_adds_stages_pending_and_dispatches_nothing() -> None:
    sim = _at_fork()
    before = sim.state
    tr = migrate(sim, NEW)
    run = tr.run
    assert tr.history[0].accepted and tr.history[0].event["kind"] == "run-migrated"
    assert run.plan_digest == NEW.digest and run.seq == before.seq + 1
    assert run.stages[QUALITY].status == "pending" and run.stages[QUALITY].kind == "worker"
    for name in ("semantic-analysis", "technical-metadata"):  # live work keeps attempt and fence
        assert run.stages[name] == before.stages[name]
    assert run.released == before.released and run.context == before.context
    assert not [e for e in tr.effects if isinstance(e, DispatchJob | InvokeAction | ScheduleTimer)]
    (tel,) = [e for e in tr.effects if isinstance(e, EmitTelemetry)]
    assert tel.name == "run.migrated" and tel.attributes["toDigest"] == NEW.digest
    assert "migrated from" in tr.history[0].note and "key:author" in tr.history[0].note


def test_rule_a_migrated_run_completes_on_the_new_plan_through_the_added_stage() -> None:
    sim = _at_fork()
    migrate(sim, NEW)
    sim.succeed("semantic-analysis")
    tr = sim.succeed("technical-metadata")
    assert tr.run.stages[QUALITY].status == "queued"  # the join now routes to the new stage
    (job,) = [e for e in tr.effects if isinstance(e, DispatchJob)]
    assert job.capability == "quality.check@1"
    tr = sim.succeed(QUALITY, {"score": 0.9})
    (publish,) = [e for e in tr.effects if isinstance(e, InvokeAction)]
    assert publish.envelope["payload"]["score"] == 0.9  # the new binding reads the new stage
    run = sim.drain()
    assert run.status == "completed" and run.stages["publish"].status == "completed"


def test_rule_replay_across_versions_rebuilds_the_migrated_run_exactly() -> None:
    sim = _at_fork()
    migrate(sim, NEW)
    run = sim.drain(results={QUALITY: {"score": 1}})
    stored = [json.loads(canonical_json(h.to_json())) for h in sim.history]
    assert replay_across({OLD.digest: OLD, NEW.digest: NEW}, stored) == run
    with pytest.raises(EngineError):  # one plan cannot replay a run that moved
        replay(OLD, stored)
    with pytest.raises(EngineError, match="not among the plans"):
        replay_across({OLD.digest: OLD}, stored)
    assert RunState.from_json(json.loads(canonical_json(run.to_json()))) == run


def test_rule_a_migration_after_the_terminal_intent_is_late() -> None:
    sim = _at_fork()
    sim.apply(CancelRequested(run_id=sim.run_id))
    before = sim.state
    tr = migrate(sim, NEW)
    assert "cannot move" in _refused(tr, "late")
    assert tr.run.plan_digest == OLD.digest and tr.run.stages == before.stages


def test_rule_a_migration_from_another_version_is_invalid() -> None:
    sim = _at_fork()
    tr = migrate(sim, NEW, from_digest="sha256:" + "0" * 64)
    assert "is pinned to" in _refused(tr, "invalid")


def test_rule_a_migration_to_the_same_version_is_invalid() -> None:
    sim = _at_fork()
    fields = event_fields(sim.state.to_json(), migration_map(OLD, NEW))
    fields["to_digest"] = OLD.digest
    tr = sim.apply(RunMigrated(run_id=sim.run_id, **fields))
    assert "already on that version" in _refused(tr, "invalid")


def test_rule_the_proofs_refusals_are_recorded_and_refused() -> None:
    sim = _at_fork()
    shorter = plans.make("model-ingest", "cache-lookup", OLD.stages[:3])  # no fork any more
    tr = migrate(sim, shorter)
    note = _refused(tr, "invalid")
    assert "migration-strands-attempt" in note and tr.run.plan_digest == OLD.digest
    entry = tr.history[0].event
    assert entry["problems"] and entry["by"] == "key:author"


def test_rule_the_machine_refuses_moving_live_work_even_without_problems() -> None:
    sim = _at_fork()
    for over in (
        {"removed": ("semantic-analysis",)},
        {"renamed": {"technical-metadata": "x"}},
        {"retyped": {"semantic-analysis": "action"}},
    ):
        fields = event_fields(sim.state.to_json(), migration_map(OLD, NEW)) | over
        tr = sim.apply(RunMigrated(run_id=sim.run_id, **fields))
        assert "strands its work" in _refused(tr, "invalid")


def test_rule_the_machine_refuses_unknown_stages_and_name_clashes() -> None:
    sim = _at_fork()
    base = event_fields(sim.state.to_json(), migration_map(OLD, NEW))
    tr = sim.apply(RunMigrated(run_id=sim.run_id, **(base | {"removed": ("nope",)})))
    assert "not a stage of the run" in _refused(tr, "invalid")
    tr = sim.apply(RunMigrated(run_id=sim.run_id, **(base | {"added": {"publish": "action"}})))
    assert "a stage the run keeps" in _refused(tr, "invalid")
    clash = base | {"renamed": {"cache-lookup": "publish"}}
    tr = sim.apply(RunMigrated(run_id=sim.run_id, **clash))
    assert "share one name" in _refused(tr, "invalid")


def test_rule_renames_carry_results_released_edges_and_completion_order() -> None:
    sim = _at_fork()
    new = renamed(OLD, "render-thumbnail", "render")
    before = sim.state
    tr = migrate(sim, new, {"render-thumbnail": "render"})
    run = tr.run
    assert tr.history[0].accepted, tr.history[0]
    assert "render-thumbnail" not in run.stages
    assert run.stages["render"].result == before.stages["render-thumbnail"].result
    assert run.stages["render"].name == "render"
    assert "cache-route->render" in run.released and "render->derive-fork" in run.released
    assert "render" in run.completion_order
    run = sim.drain()
    assert run.status == "completed"
    stored = [json.loads(canonical_json(h.to_json())) for h in sim.history]
    assert replay_across({OLD.digest: OLD, new.digest: new}, stored) == run


def test_rule_join_arrivals_follow_a_renamed_branch() -> None:
    sim = _at_fork()
    sim.succeed("technical-metadata")
    new = renamed(OLD, "technical-metadata", "tech")
    tr = migrate(sim, new, {"technical-metadata": "tech"})
    assert tr.history[0].accepted, tr.history[0]
    assert tr.run.join_arrivals["derive-join"] == ("tech",)
    assert "tech" in tr.run.branch_states
    assert sim.drain().status == "completed"


def test_rule_the_event_round_trips_as_json() -> None:
    ev = RunMigrated(
        run_id="r",
        from_digest="a",
        to_digest="b",
        renamed={"x": "y"},
        added={"z": "worker"},
        removed=("w",),
        problems=("p",),
        by="me",
    )
    doc = json.loads(json.dumps(event_to_json(ev)))
    assert event_from_json(doc) == ev


def test_rule_history_records_the_decision_who_why_from_to_and_the_map() -> None:
    sim = _at_fork()
    tr = migrate(sim, NEW)
    event = tr.history[0].event
    assert event["from_digest"] == OLD.digest and event["to_digest"] == NEW.digest
    assert event["added"] == {QUALITY: "worker"} and event["by"] == "key:author"
    assert event["reason"] == "test" and event["to_version"] == "2.4.0"
