"""Plan versions for the migration tests: model-ingest and the versions a migration moves to."""

from __future__ import annotations

import dataclasses
from typing import Any

from accord.engine.machine import Transition
from accord.engine.machine.events import RunMigrated
from accord.workflow.migration import check_run, event_fields, migration_map
from accord.workflow.plan import (
    Binding,
    DecisionStage,
    ForkStage,
    JoinStage,
    Plan,
    Stage,
    TaskStage,
)
from tests.unit.engine import invariants as inv
from tests.unit.engine import plans
from tests.unit.engine.sim import Sim

QUALITY = "quality-check"


def version(plan: Plan, number: str, stages: tuple[Stage, ...], **extra: Any) -> Plan:
    doc: dict[str, Any] = {
        "name": plan.name,
        "version": number,
        "entry": plan.entry,
        "stages": stages,
        "finalisers": plan.finalisers,
        "deadline_ms": plan.deadline_ms,
    }
    doc.update(extra)
    return Plan.create(**doc)


def _with(stage: Stage, **changes: Any) -> Stage:
    return dataclasses.replace(stage, **changes)  # type: ignore[type-var]


def with_quality_check(old: Plan, number: str = "2.4.0") -> Plan:
    """``derive-join → quality-check (worker) → publish``; publish reads the check's result."""
    stages: list[Stage] = []
    for s in old.stages:
        if isinstance(s, JoinStage) and s.name == "derive-join":
            stages.append(_with(s, on_success=QUALITY))
            stages.append(plans.task(QUALITY, "quality.check@1", "publish"))
        elif s.name == "publish":
            score = Binding(source="stage", stage=QUALITY, path=("score",), raw="q")
            stages.append(_with(s, input={"modelId": plans.MODEL_ID, "score": score}))
        else:
            stages.append(s)
    return version(old, number, tuple(stages))


def renamed(old: Plan, before: str, after: str, number: str = "2.5.0") -> Plan:
    """``before`` renamed ``after``, every edge to it following."""
    edges = ("on_success", "on_failure", "on_approve", "on_reject", "on_timeout")

    def fix(s: Stage) -> Stage:
        changes: dict[str, Any] = {}
        if s.name == before:
            changes["name"] = after
        for e in edges:
            if getattr(s, e, None) == before:
                changes[e] = after
        if isinstance(s, DecisionStage):
            changes["branches"] = tuple(
                dataclasses.replace(b, next=after) if b.next == before else b for b in s.branches
            )
        if isinstance(s, ForkStage) and before in s.branches:
            changes["branches"] = tuple(after if b == before else b for b in s.branches)
        if isinstance(s, JoinStage) and before in s.required:
            changes["required"] = tuple(after if b == before else b for b in s.required)
        if isinstance(s, TaskStage) and s.branch == before:
            changes["branch"] = after
        return _with(s, **changes) if changes else s

    return version(old, number, tuple(fix(s) for s in old.stages))


def migrate(sim: Sim, new: Plan, renames: dict[str, str] | None = None, **over: Any) -> Transition:
    """Prove and apply a migration of the sim's run to ``new``; the sim follows when accepted."""
    mmap = migration_map(sim.plan, new, renames)
    doc = sim.state.to_json()
    fields = event_fields(doc, mmap)
    fields.update(over)
    problems = tuple(str(r) for r in check_run(doc, mmap))
    # the per-step checks pair attempts by stage name, which a rename changes on purpose
    sim.check, before = False, sim.state
    tr = sim.apply(
        RunMigrated(run_id=sim.run_id, by="key:author", reason="test", problems=problems, **fields)
    )
    sim.check = True
    inv.assert_versions_grow(before, tr.run)
    inv.assert_i5_nothing_after_intent(before, tr)
    if tr.history[0].accepted:
        sim.plan = new
    return tr
