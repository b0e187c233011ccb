"""The migration map between two plans and each rule that refuses moving a run along it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from accord.contracts.sources import load_catalog
from accord.workflow.migration import (
    MigrationError,
    Refusal,
    check_run,
    event_fields,
    migration_map,
    parse_map,
)
from accord.workflow.plan import ForkStage, JoinStage, Plan, Stage, TaskStage
from tests.unit.engine import plans
from tests.unit.engine.migration_plans import QUALITY, renamed, version, with_quality_check
from tests.unit.engine.sim import Sim

ROOT = Path(__file__).resolve().parents[3]
OLD = plans.model_ingest()


def _run(plan: Plan, *steps: tuple[str, dict[str, Any] | None]) -> dict[str, Any]:
    sim = Sim(plan)
    sim.start(modelId="m-1")
    for stage, result in steps:
        sim.succeed(stage, result)
    return sim.state.to_json()


AT_RENDER = (("cache-lookup", {"hit": False}),)
AT_FORK = (*AT_RENDER, ("render-thumbnail", {"uri": "s3://t"}))


def _codes(found: list[Refusal]) -> list[tuple[str, str]]:
    return [(r.code, r.stage) for r in found]


def _swap(plan: Plan, name: str, **changes: Any) -> tuple[Stage, ...]:
    return tuple(
        dataclasses.replace(s, **changes) if s.name == name else s  # type: ignore[type-var]
        for s in plan.stages
    )


# --- the map -----------------------------------------------------------------------------------


def test_map_pairs_kept_renamed_added_and_removed_stages() -> None:
    new = renamed(with_quality_check(OLD), "render-thumbnail", "render")
    mmap = migration_map(OLD, new, {"render-thumbnail": "render"})
    assert mmap.renamed == {"render-thumbnail": "render"}
    assert mmap.added == (QUALITY,) and mmap.removed == ()
    assert set(mmap.kept) == {s.name for s in OLD.stages} - {"render-thumbnail"}
    assert mmap.new_name("render-thumbnail") == "render" and mmap.new_name("publish") == "publish"
    doc = mmap.to_json()
    assert doc["from"]["digest"] == OLD.digest and doc["to"]["version"] == "2.5.0"


def test_map_without_the_rename_removes_the_old_name_and_adds_the_new() -> None:
    new = renamed(OLD, "render-thumbnail", "render")
    mmap = migration_map(OLD, new)
    assert mmap.removed == ("render-thumbnail",) and mmap.added == ("render",)
    assert mmap.new_name("render-thumbnail") is None


@pytest.mark.parametrize(
    ("renames", "said"),
    [
        ({"nope": "publish"}, "'nope' is not a stage of model-ingest 1.0.0"),
        ({"publish": "nope"}, "'nope' is not a stage of model-ingest 2.4.0"),
        ({"publish": QUALITY, "cache-lookup": QUALITY}, "same new stage"),
    ],
)
def test_map_refuses_entries_naming_unknown_stages_or_one_target_twice(
    renames: dict[str, str], said: str
) -> None:
    with pytest.raises(MigrationError, match=said) as info:
        migration_map(OLD, with_quality_check(OLD), renames)
    assert info.value.code == "migration-bad-map"


def test_map_refuses_plans_of_another_workflow() -> None:
    with pytest.raises(MigrationError) as info:
        migration_map(OLD, plans.linear())
    assert info.value.code == "migration-wrong-workflow"


@pytest.mark.parametrize("entry", ["a", "=b", "a=", "a=b a=c"])
def test_parse_map_refuses_malformed_entries(entry: str) -> None:
    with pytest.raises(MigrationError) as info:
        parse_map(entry.split(" "))
    assert info.value.code == "migration-bad-map"
    assert parse_map(["a=b", " c = d "]) == {"a": "b", "c": "d"}


# --- the rules ---------------------------------------------------------------------------------


def test_rule_a_run_at_the_fork_may_gain_a_stage_after_the_join() -> None:
    mmap = migration_map(OLD, with_quality_check(OLD))
    assert check_run(_run(OLD, *AT_FORK), mmap) == []
    fields = event_fields(_run(OLD, *AT_FORK), mmap)
    assert fields["added"] == {QUALITY: "worker"} and fields["removed"] == ()


def test_rule_an_ended_run_cannot_move() -> None:
    run = _run(OLD, ("cache-lookup", {"hit": True}), ("publish", None), ("@finaliser/0", None))
    assert run["status"] == "completed"
    found = check_run(run, migration_map(OLD, with_quality_check(OLD)))
    assert _codes(found) == [("migration-run-ended", "")]


def test_rule_a_run_of_another_version_cannot_move_along_the_map() -> None:
    newer = with_quality_check(OLD)
    found = check_run(_run(newer, *AT_FORK), migration_map(OLD, newer))
    assert _codes(found) == [("migration-wrong-plan", "")]


def test_rule_removing_a_live_stage_strands_its_attempt() -> None:
    new = version(OLD, "3.0.0", tuple(s for s in OLD.stages if s.name != "render-thumbnail"))
    new = version(
        new,
        "3.0.0",
        _swap(
            new,
            "cache-route",
            branches=(
                dataclasses.replace(OLD.stage("cache-route").branches[0]),  # type: ignore[attr-defined]
                dataclasses.replace(OLD.stage("cache-route").branches[1], next="derive-fork"),  # type: ignore[attr-defined]
            ),
        ),
    )
    found = check_run(_run(OLD, *AT_RENDER), migration_map(OLD, new))
    assert ("migration-strands-attempt", "render-thumbnail") in _codes(found)
    assert "removes it" in found[0].message


def test_rule_renaming_a_live_stage_strands_its_attempt() -> None:
    new = renamed(OLD, "render-thumbnail", "render")
    found = check_run(
        _run(OLD, *AT_RENDER), migration_map(OLD, new, {"render-thumbnail": "render"})
    )
    assert _codes(found) == [("migration-strands-attempt", "render-thumbnail")]
    assert (
        check_run(_run(OLD, *AT_FORK), migration_map(OLD, new, {"render-thumbnail": "render"}))
        == []
    )


def test_rule_repinning_a_live_stage_to_another_capability_strands_it() -> None:
    pin = plans.pin("thumbnail.render@4")
    new = version(OLD, "3.0.0", _swap(OLD, "render-thumbnail", capability=pin))
    found = check_run(_run(OLD, *AT_RENDER), migration_map(OLD, new))
    assert _codes(found) == [("migration-strands-attempt", "render-thumbnail")]
    assert "thumbnail.render@3" in found[0].message and "thumbnail.render@4" in found[0].message
    assert check_run(_run(OLD, *AT_FORK), migration_map(OLD, new)) == []  # it has run: fine


def test_rule_changing_a_live_stages_type_strands_it() -> None:
    new = version(OLD, "3.0.0", _swap(OLD, "render-thumbnail", type="action", queue=None))
    found = check_run(_run(OLD, *AT_RENDER), migration_map(OLD, new))
    assert _codes(found) == [("migration-strands-attempt", "render-thumbnail")]


def test_rule_reading_the_result_of_a_stage_the_run_can_no_longer_reach_is_refused() -> None:
    """The new version adds ``inspect`` before the render and ``publish`` reads it: a run past
    the render never runs ``inspect``, so publish's binding would find nothing."""
    from accord.workflow.plan import Binding

    read = Binding(source="stage", stage="inspect", path=("ok",), raw="i")
    route = OLD.stage("cache-route")
    assert not isinstance(route, TaskStage)
    stages: list[Stage] = [
        plans.task("inspect", "inspect.model@1", "render-thumbnail"),
    ]
    for s in OLD.stages:
        if s.name == "cache-route":
            branches = tuple(
                dataclasses.replace(b, next="inspect") if b.next == "render-thumbnail" else b
                for b in s.branches  # type: ignore[attr-defined]
            )
            stages.append(dataclasses.replace(s, branches=branches))  # type: ignore[type-var]
        elif s.name == "publish":
            stages.append(dataclasses.replace(s, input={"modelId": plans.MODEL_ID, "ok": read}))  # type: ignore[type-var]
        else:
            stages.append(s)
    new = version(OLD, "3.0.0", tuple(stages))
    found = check_run(_run(OLD, *AT_FORK), migration_map(OLD, new))
    assert _codes(found) == [("migration-removes-read-result", "publish")]
    assert "'inspect'" in found[0].message
    # a run still at the cache lookup goes through inspect: nothing is lost
    assert check_run(_run(OLD), migration_map(OLD, new)) == []


def test_rule_a_removed_stage_whose_result_a_later_binding_reads_is_refused() -> None:
    """Publish reads the render's result. Version 3 renames the render: without the explicit
    rename the map removes the completed render and its result with it, while publish — still to
    run — reads the new name, which the run will never reach again."""
    from accord.workflow.plan import Binding

    def reading(plan: Plan, stage: str, number: str) -> Plan:
        uri = Binding(source="stage", stage=stage, path=("uri",), raw="u")
        return version(
            plan, number, _swap(plan, "publish", input={"modelId": plans.MODEL_ID, "uri": uri})
        )

    two = reading(OLD, "render-thumbnail", "2.0.0")
    three = reading(renamed(two, "render-thumbnail", "render"), "render", "3.0.0")
    run = _run(two, *AT_FORK)
    found = check_run(run, migration_map(two, three))
    assert _codes(found) == [("migration-removes-read-result", "publish")]
    assert "removes the result of 'render-thumbnail'" in found[0].message
    assert check_run(run, migration_map(two, three, {"render-thumbnail": "render"})) == []


def _catalog() -> Any:
    return load_catalog(ROOT / "schemas" / "contracts")


def _result_pin(ref: str) -> Any:
    return dataclasses.replace(plans.pin("thumbnail.render@3"), result=ref)


def test_rule_a_held_result_repinned_to_a_backward_compatible_contract_may_move() -> None:
    old = version(
        OLD,
        "1.0.0",
        _swap(OLD, "render-thumbnail", capability=_result_pin("thumbnail-generation-request@1")),
    )
    new = version(
        OLD,
        "2.0.0",
        _swap(OLD, "render-thumbnail", capability=_result_pin("thumbnail-generation-request@2")),
    )
    run = _run(old, *AT_FORK)
    assert check_run(run, migration_map(old, new), _catalog()) == []


def test_rule_a_held_result_repinned_to_an_incompatible_contract_is_refused() -> None:
    old = version(
        OLD,
        "1.0.0",
        _swap(OLD, "render-thumbnail", capability=_result_pin("thumbnail-generation-request@2")),
    )
    new = version(
        OLD,
        "2.0.0",
        _swap(OLD, "render-thumbnail", capability=_result_pin("thumbnail-generation-request@1")),
    )
    found = check_run(_run(old, *AT_FORK), migration_map(old, new), _catalog())
    assert _codes(found) == [("migration-contract-incompatible", "render-thumbnail")]
    assert "field-removed-optional@payload.generate360Views" in found[0].message
    # without the catalog nothing can be proved, and a contract it lacks cannot either
    found = check_run(_run(old, *AT_FORK), migration_map(old, new))
    assert "without the contract catalog" in found[0].message
    lacking = version(
        OLD, "3.0.0", _swap(OLD, "render-thumbnail", capability=_result_pin("no-such-result@9"))
    )
    found = check_run(_run(old, *AT_FORK), migration_map(old, lacking), _catalog())
    assert "no-such-result@9 not in the catalog" in found[0].message


def test_rule_a_changed_context_contract_is_proved_too() -> None:
    old = version(OLD, "1.0.0", OLD.stages, context_contract="thumbnail-generation-request@2")
    new = version(OLD, "2.0.0", OLD.stages, context_contract="thumbnail-generation-request@1")
    found = check_run(_run(old, *AT_FORK), migration_map(old, new), _catalog())
    assert _codes(found) == [("migration-contract-incompatible", "")]
    assert found[0].message.startswith("context:")


def test_rule_a_released_fork_with_other_branches_has_no_equivalent_state() -> None:
    extra = plans.task(
        "texture-scan", "texture.scan@1", "derive-join", fork="derive-fork", branch="texture-scan"
    )
    stages = [
        *_swap(
            OLD, "derive-fork", branches=("semantic-analysis", "technical-metadata", "texture-scan")
        ),
        extra,
    ]
    new = version(OLD, "3.0.0", tuple(stages))
    new = version(
        new,
        "3.0.0",
        _swap(
            new, "derive-join", required=("semantic-analysis", "technical-metadata", "texture-scan")
        ),
    )
    found = check_run(_run(OLD, *AT_FORK), migration_map(OLD, new))
    assert ("migration-no-equivalent-state", "derive-fork") in _codes(found)
    assert check_run(_run(OLD, *AT_RENDER), migration_map(OLD, new)) == []  # not forked yet


def test_rule_a_gathering_join_requiring_other_branches_has_no_equivalent_state() -> None:
    new = version(OLD, "3.0.0", _swap(OLD, "derive-join", required=("semantic-analysis",)))
    run = _run(OLD, *AT_FORK, ("technical-metadata", None))
    assert run["join_arrivals"]["derive-join"] == ["technical-metadata"]
    found = check_run(run, migration_map(OLD, new))
    assert _codes(found) == [("migration-no-equivalent-state", "derive-join")]


def test_rule_a_completed_stage_that_changes_type_has_no_equivalent_state() -> None:
    new = version(OLD, "3.0.0", _swap(OLD, "cache-lookup", type="worker", queue="cache"))
    found = check_run(_run(OLD, *AT_FORK), migration_map(OLD, new))
    assert _codes(found) == [("migration-no-equivalent-state", "cache-lookup")]
    fields = event_fields(_run(OLD), migration_map(OLD, new))
    assert fields["retyped"] == {"cache-lookup": "worker"}


def test_rule_removing_a_completed_stage_with_a_compensation_has_no_equivalent_state() -> None:
    saga = plans.saga()
    first = saga.stages[0]
    assert isinstance(first, TaskStage) and first.compensate is not None
    sim = Sim(saga)
    sim.start(modelId="m-1")
    sim.succeed(first.name)
    rest = tuple(s for s in saga.stages if s.name != first.name)
    new = version(saga, "2.0.0", rest, entry=rest[0].name)
    found = check_run(sim.state.to_json(), migration_map(saga, new))
    assert ("migration-no-equivalent-state", first.name) in _codes(found)


def test_fork_and_join_kinds_are_what_the_rules_expect() -> None:
    assert isinstance(OLD.stage("derive-fork"), ForkStage)
    assert isinstance(OLD.stage("derive-join"), JoinStage)
