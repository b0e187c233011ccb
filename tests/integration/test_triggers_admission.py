"""Admission: each refusal is an answer with its recorded reason, on the embedded store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.integration._triggers_kit import CATALOG, T0, WORKFLOW, schedule, sqlite_opener

from accord.engine.runtime.admission import REFUSED_STATUS, Admission
from accord.engine.runtime.orchestrator import Engine
from accord.testing import FakeClock
from accord.workflow.compiler import compile_workflow
from accord.workflow.plan import Plan

CTX = {"modelId": "a-1"}


def _plan(budgets: str = "", edit: Callable[[str], str] = lambda t: t) -> Plan:
    text = WORKFLOW.format(name="admitted", queue="adm.q", triggers=schedule(), budgets=budgets)
    return compile_workflow(edit(text), "admitted.yaml", CATALOG).unwrap()


async def _engine(tmp: Path, clock: FakeClock, p: Plan, *, live: bool = True) -> Engine:
    engine = sqlite_opener(tmp)(clock, "engine-a")
    await engine.register_plan(p)
    if live:
        await engine.announce("worker-1", ["metadata.extract@2"], 86_400_000)
    return engine


async def _refused_once(
    tmp: Path, p: Plan, code: str, *, clock: FakeClock | None = None, live: bool = True,
    before: int = 0, **start: Any,
) -> None:  # fmt: skip
    clock = clock or FakeClock(T0)
    engine = await _engine(tmp, clock, p, live=live)
    try:
        admission = Admission(engine)
        for i in range(before):  # starts that fill the budget first
            d = await admission.start("admitted", CTX, "acme", requester="t", run_id=f"run_ok{i}")
            assert d.admitted, d
        d = await admission.start(
            "admitted", CTX, "acme", requester="tester", run_id="run_refused", **start
        )
        assert not d.admitted and d.run_id is None
        assert d.codes == (code,), d.reasons
        assert await engine.load("run_refused") is None  # nothing was started
        [record] = await admission.refused("admitted")
        assert record["kind"] == REFUSED_STATUS
        reasons: Any = record["reasons"]
        assert [r["code"] for r in reasons] == [code]
        assert record["requester"] == "tester" and record["tenant"] == "acme"
    finally:
        await engine.stop()


async def test_an_admissible_start_is_admitted_and_asking_again_is_answered(tmp_path: Path) -> None:
    engine = await _engine(tmp_path, FakeClock(T0), _plan())
    try:
        admission = Admission(engine)
        first = await admission.start("admitted", CTX, "acme", requester="t", run_id="run_a")
        again = await admission.start("admitted", CTX, "acme", requester="t", run_id="run_a")
        assert first.admitted and not first.existing
        assert again.admitted and again.existing and again.run_id == "run_a"
        assert await admission.refused("admitted") == []
    finally:
        await engine.stop()


async def test_planned_plan_is_refused(tmp_path: Path) -> None:
    planned = 'version: "1"\nstatus: planned\npromotion_criteria: two weeks without incident\n'
    p = _plan(edit=lambda t: t.replace('version: "1"\n', planned))
    await _refused_once(tmp_path, p, "admission-plan-planned")


async def test_no_owner_is_refused(tmp_path: Path) -> None:
    p = _plan(edit=lambda t: t.replace("owner: asset-processing\n", ""))
    await _refused_once(tmp_path, p, "admission-no-owner")


async def test_no_review_date_is_refused(tmp_path: Path) -> None:
    p = _plan(edit=lambda t: t.replace('review_date: "2030-12-31"\n', ""))
    await _refused_once(tmp_path, p, "admission-no-review-date")


async def test_an_expired_review_date_is_refused(tmp_path: Path) -> None:
    in_2031 = FakeClock(1_924_992_000_000)  # 2031-01-01
    await _refused_once(tmp_path, _plan(), "admission-review-expired", clock=in_2031)


async def test_a_requester_that_may_not_start_for_the_tenant_is_refused(tmp_path: Path) -> None:
    await _refused_once(
        tmp_path, _plan(), "admission-requester-denied", permits=lambda r, w, t: t != "acme"
    )


async def test_max_concurrent_runs_per_workflow(tmp_path: Path) -> None:
    p = _plan("budgets:\n  max_concurrent_runs: 2")
    await _refused_once(tmp_path, p, "admission-concurrency-workflow", before=2)


async def test_max_concurrent_runs_per_tenant(tmp_path: Path) -> None:
    p = _plan("budgets:\n  max_concurrent_runs_per_tenant: 1")
    await _refused_once(tmp_path, p, "admission-concurrency-tenant", before=1)


async def test_max_runs_per_hour(tmp_path: Path) -> None:
    p = _plan("budgets:\n  max_runs_per_hour: 3")
    await _refused_once(tmp_path, p, "admission-rate-hour", before=3)


async def test_the_hourly_budget_is_per_clock_hour(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    engine = await _engine(tmp_path, clock, _plan("budgets:\n  max_runs_per_hour: 1"))
    try:
        admission = Admission(engine)
        assert (await admission.start("admitted", CTX, "acme", requester="t", run_id="r1")).admitted
        assert not (
            await admission.start("admitted", CTX, "acme", requester="t", run_id="r2")
        ).admitted
        clock.advance(3_600_000)
        assert (await admission.start("admitted", CTX, "acme", requester="t", run_id="r3")).admitted
    finally:
        await engine.stop()


async def test_max_attempts_total(tmp_path: Path) -> None:
    p = _plan("budgets:\n  max_attempts_total: 2")  # the one worker stage may make 3 attempts
    await _refused_once(tmp_path, p, "admission-attempts-budget")


async def test_a_deadline_that_leaves_no_time_for_the_run(tmp_path: Path) -> None:
    p = _plan(
        edit=lambda t: t.replace("entry: extract\n", "entry: extract\ndeadline_ms: 7200000\n")
    )
    await _refused_once(tmp_path, p, "admission-deadline-passed", deadline_at_ms=T0 + 60_000)


async def test_a_capability_with_no_live_worker(tmp_path: Path) -> None:
    await _refused_once(tmp_path, _plan(), "admission-no-live-worker", live=False)


@pytest.mark.parametrize("workflow", ["never-registered"])
async def test_a_workflow_with_no_active_plan(tmp_path: Path, workflow: str) -> None:
    engine = await _engine(tmp_path, FakeClock(T0), _plan())
    try:
        d = await Admission(engine).start(workflow, CTX, "acme", requester="t", run_id="run_x")
        assert d.codes == ("admission-no-active-plan",)
        rows = await engine.store.list_runs(10, status=REFUSED_STATUS, workflow=workflow)
        assert len(rows) == 1
    finally:
        await engine.stop()


async def test_a_schedule_refused_by_admission_records_why_in_its_fire_record(
    tmp_path: Path,
) -> None:
    from accord.engine.runtime.schedules import Scheduler

    clock = FakeClock(T0 + 30_000)
    engine = await _engine(tmp_path, clock, _plan("budgets:\n  max_concurrent_runs: 1"))
    try:
        s = Scheduler(engine, ["admitted"])
        await s.tick()
        for _ in range(2):
            clock.advance(60_000)
            await s.tick()
        fires = await s.fires("admitted", "every-minute")
        assert [f["decision"] for f in fires] == ["started", "refused"]
        assert "admission-concurrency-workflow" in str(fires[1]["reason"])
    finally:
        await engine.stop()
