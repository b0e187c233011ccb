"""Shadow runs: 100 recorded model-ingest runs replayed through a changed version with every
effect off, and the report checked against counts worked out by hand.

The recorded runs (i = 0 … 99) go through the engine's own path on a SQLite store: the cache
lookup hits when i % 4 == 0 and its result says ``fresh`` when i % 8 == 0; the render's result
carries a ``uri`` unless i % 3 == 0; semantic analysis fails once (retryable) and then succeeds
when i % 10 == 5. The new version (a) takes the cache route only for a fresh hit, (b) adds a
``quality-check`` worker between the join and publish, reading the render's ``uri``.

By hand: the 13 fresh hits (i % 8 == 0) replay identically. The 12 other hits now decide for the
render, which their recorded run never called: decision, route, new call, would dispatch,
incomplete. Of the 75 misses, the 50 with a ``uri`` reach the new quality check, a capability
never called: new call, would dispatch, route, incomplete; the 25 without one fail the check's
binding, and the finaliser then asks with a failed intent, which no recorded call answers:
binding, would dispatch, route, incomplete. The retried analyses replay as retries (their runs
diverge only after the join)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from tests.unit.engine import plans
from tests.unit.engine.migration_plans import QUALITY, version

from accord.adapters import open_store, open_transport
from accord.adapters.clock import SystemClock
from accord.engine.machine.effects import ScheduleTimer
from accord.engine.machine.events import StageFailed, StageSucceeded, TimerFired
from accord.engine.machine.state import RunState
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.engine.runtime.shadow import shadow
from accord.workflow.activation import stored_document
from accord.workflow.plan import Binding, DecisionBranch, DecisionStage, Plan, Stage

ROOT = Path(__file__).resolve().parents[2]
ACCORD = str(Path(sys.executable).with_name("accord"))
OLD = plans.model_ingest()


def _new_version() -> Plan:
    uri = Binding(source="stage", stage="render-thumbnail", path=("uri",), raw="uri")
    stages: list[Stage] = []
    for s in OLD.stages:
        if isinstance(s, DecisionStage):
            lookup = 'stages["cache-lookup"].result'
            fresh = f"{lookup}.hit == true && {lookup}.fresh == true"
            branches = (DecisionBranch(when=fresh, next="publish"), s.branches[1])
            stages.append(
                DecisionStage(
                    name=s.name, branches=branches, on_evaluation_error=s.on_evaluation_error
                )
            )
        elif s.name == "derive-join":
            stages.append(
                s.__class__(
                    **{**{f: getattr(s, f) for f in s.__dataclass_fields__}, "on_success": QUALITY}
                )
            )
            stages.append(plans.task(QUALITY, "quality.check@1", "publish", input={"uri": uri}))
        else:
            stages.append(s)
    return version(OLD, "2.0.0", tuple(stages))


NEW = _new_version()


def _result(i: int, stage: str) -> dict[str, Any]:
    if stage == "cache-lookup":
        return {"hit": i % 4 == 0, "fresh": i % 8 == 0}
    if stage == "render-thumbnail":
        return {"uri": f"s3://t/{i}"} if i % 3 else {"ok": True}
    return {"ok": True, "stage": stage}


async def _record(engine: Engine, i: int) -> str:
    rid = await engine.start_run(
        OLD.digest, {"modelId": f"m-{i}"}, tenant="acme", run_id=f"rec-{i:03d}"
    )
    failed_once = False
    for _ in range(100):
        stored = await engine.store.load(rid)
        assert stored is not None
        run = RunState.from_json(stored.state)
        if run.terminal:
            return rid
        live = sorted(
            n
            for n, s in run.stages.items()
            if s.current and s.current.status in ("queued", "running")
        )
        if not live:
            raise AssertionError(f"{rid} stuck: {run.status}")
        name = live[0]
        st = run.stages[name]
        ident = {"run_id": rid, "stage": name, "attempt": st.attempt, "fence": st.fence}
        if name == "semantic-analysis" and i % 10 == 5 and not failed_once:
            failed_once = True
            done = await engine.deliver(StageFailed(**ident, retryable=True, code="retryable"))
            (timer,) = [
                e for e in done.effects if isinstance(e, ScheduleTimer) and e.timer == "retry"
            ]
            await engine.deliver(
                TimerFired(
                    run_id=rid,
                    timer="retry",
                    timer_id=timer.timer_id,
                    stage=name,
                    attempt=timer.attempt,
                    fence=timer.fence,
                    at_ms=timer.due_at_ms,
                )
            )
            continue
        await engine.deliver(StageSucceeded(**ident, result=_result(i, name)))
    raise AssertionError(f"{rid} did not end")


async def _cli(*args: str) -> tuple[int, Any]:
    proc = await asyncio.create_subprocess_exec(
        ACCORD,
        *args,
        "--json",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(os.environ),
    )
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, json.loads(out)


async def test_shadow_report_on_100_recorded_runs_matches_the_hand_count(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shadow.db'}"
    engine = Engine(
        open_store(url),
        open_transport("memory://"),
        SystemClock(),
        options=EngineOptions(dispatch=False),
        owns_ports=True,
    )
    try:
        await engine.register_plan(OLD)
        rids = [await _record(engine, i) for i in range(100)]
        for rid in rids:
            stored = await engine.store.load(rid)
            assert stored is not None and stored.state["status"] == "completed"
        retried = await engine.store.history("rec-005")
        assert any(h["event"]["kind"] == "stage-failed" for h in retried)
        await engine.store.put_plan(NEW.digest, stored_document(NEW))
        report = await shadow(engine.store, NEW, runs=100)
        history_before = {rid: len(await engine.store.history(rid)) for rid in rids}
    finally:
        await engine.stop()

    doc = report.to_json()
    assert doc["replayed"] == 100 and doc["recorded_digest"] == OLD.digest
    assert doc["identical"] == 13 and doc["diverged"] == 87
    assert doc["runs_with"] == {
        "route": 87,
        "decision": 12,
        "new-call": 62,
        "would-dispatch": 87,
        "binding": 25,
        "outcome": 87,
    }
    assert doc["shadow_outcomes"] == {"completed": 13, "incomplete": 87}
    by_id = {r.run_id: r for r in report.runs}
    assert by_id["rec-008"].divergences == ()  # a fresh hit
    stale = {(d.kind, d.subject) for d in by_id["rec-004"].divergences}
    assert stale == {
        ("decision", "cache-route"),
        ("route", "cache-route->publish"),
        ("route", "cache-route->render-thumbnail"),
        ("route", "publish->completed"),
        ("new-call", "render-thumbnail"),
        ("would-dispatch", "render-thumbnail"),
        ("outcome", "run"),
    }
    with_uri = {(d.kind, d.subject) for d in by_id["rec-005"].divergences}  # retried, then on
    assert with_uri == {
        ("route", "derive-join->publish"),
        ("route", f"derive-join->{QUALITY}"),
        ("route", "publish->completed"),
        ("new-call", QUALITY),
        ("would-dispatch", QUALITY),
        ("outcome", "run"),
    }
    no_uri = {(d.kind, d.subject) for d in by_id["rec-003"].divergences}
    assert ("binding", QUALITY) in no_uri and ("would-dispatch", "@finaliser/0") in no_uri
    assert ("new-call", QUALITY) not in no_uri
    assert [d.detail for d in by_id["rec-003"].divergences if d.kind == "binding"] == [
        "binding-missing"
    ]

    # nothing was written: no run gained history, no new run exists
    store = open_store(url)
    try:
        for rid in rids:
            assert len(await store.history(rid)) == history_before[rid]
        assert len(await store.list_runs(limit=1000)) == 100
    finally:
        await store.close()

    code, cli = await _cli("workflow", "shadow", NEW.digest, "--runs", "100", "--store", url)
    assert code == 0 and cli["ok"] and cli["identical"] == 13 and cli["runs_with"]["binding"] == 25
