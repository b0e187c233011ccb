"""``accord runs explain`` tells a migration specifically: from which plan digest to which (and
the new version), when, by whom and why, and the stage map it applied (kept, renamed, retyped,
added, removed); a refused migration names what the proof found. Worked on the pure machine
(three moves of one run, one refused) and through the command on a SQLite store."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.unit.engine import plans
from tests.unit.engine.migration_plans import migrate, renamed, with_quality_check
from tests.unit.engine.sim import T0, Sim

from accord.adapters import open_store, open_transport
from accord.adapters.clock import SystemClock
from accord.engine.machine.events import StageSucceeded
from accord.engine.machine.explain import explain_history, migrations
from accord.engine.runtime.migration import migrate_run
from accord.engine.runtime.orchestrator import Engine, EngineOptions

ROOT = Path(__file__).resolve().parents[2]
ACCORD = str(Path(sys.executable).with_name("accord"))
OLD = plans.model_ingest()
V24 = with_quality_check(OLD)
V25 = renamed(V24, "technical-metadata", "tech-meta", "2.5.0")
KEPT_24 = [
    "cache-lookup", "cache-route", "derive-fork", "derive-join", "publish", "render-thumbnail",
    "semantic-analysis", "technical-metadata",
]  # fmt: skip


def test_each_migration_is_explained_with_its_decision_and_stage_map() -> None:
    sim = Sim(OLD)
    sim.start()
    sim.succeed("cache-lookup", {"hit": False})  # render-thumbnail is queued now
    refused = migrate(
        sim, renamed(OLD, "render-thumbnail", "render"), {"render-thumbnail": "render"}
    )
    assert not refused.history[0].accepted
    assert migrate(sim, V24).history[0].accepted
    assert migrate(sim, V25, {"technical-metadata": "tech-meta"}).history[0].accepted

    found = migrations(sim.state, sim.history)
    assert [(m["seq"], m["accepted"]) for m in found] == [(3, False), (4, True), (5, True)]
    first, second, third = found
    assert first["refused"] == "invalid" and "kept" not in first
    assert first["problems"] == [
        "migration-strands-attempt: stage 'render-thumbnail': is queued: renaming it to 'render' "
        "strands the work that names it"
    ]
    assert (second["from"], second["to"], second["version"]) == (OLD.digest, V24.digest, "2.4.0")
    assert second["by"] == "key:author" and second["reason"] == "test"
    assert second["at_ms"] >= T0 and second["at"].startswith("2023-11-14T22:13:2")
    assert second["added"] == {"quality-check": "worker"} and second["kept"] == KEPT_24
    assert second["renamed"] == {} and second["removed"] == [] and second["retyped"] == {}
    assert third["renamed"] == {"technical-metadata": "tech-meta"}
    assert third["kept"] == sorted({*KEPT_24, "quality-check"} - {"technical-metadata"})

    lines = explain_history(sim.state, sim.history)
    at = second["at"]
    assert lines[2] == (
        f"#3 migration from {OLD.digest} to {first['to']} (version 2.5.0) at {at} by key:author: "
        f"test  -> refused: invalid ({first['problems'][0]})"
    )
    assert (
        lines[3]
        == f"#4 migration from {OLD.digest} to {V24.digest} (version 2.4.0) at {at} by key:author"
        ": test"
    )
    assert (
        lines[4]
        == f"   stage map: kept {', '.join(KEPT_24)}; added (pending) quality-check (worker)"
    )
    assert lines[6].endswith("renamed technical-metadata -> tech-meta")
    assert lines[-1] == "now running"


async def test_runs_explain_tells_a_migration_made_on_a_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'explain.db'}"
    engine = Engine(
        open_store(url), open_transport("memory://"), SystemClock(),
        options=EngineOptions(dispatch=False, canary_every_ms=0), owns_ports=True,
    )  # fmt: skip
    try:
        await engine.register_plan(OLD)
        await engine.register_plan(V24, activate=False)
        rid = await engine.start_run(OLD.digest, {"modelId": "m-1"}, tenant="acme", run_id="mv-1")
        run = await engine.load(rid)
        assert run is not None
        st = run.stages["cache-lookup"]
        await engine.deliver(StageSucceeded(run_id=rid, stage="cache-lookup", attempt=st.attempt,
                                            fence=st.fence, result={"hit": False}))  # fmt: skip
        moved = await migrate_run(engine, rid, V24.digest, by="cli:ann", reason="add the check")
        assert moved.delivered.history[0].accepted
        at_ms = moved.delivered.history[0].at_ms
    finally:
        await engine.stop()

    code, doc = await _cli("runs", "explain", "mv-1", "--store", url)
    assert code == 0, doc
    lines: list[str] = doc["explanation"]
    (head,) = [line for line in lines if " migration from " in line]
    assert head.startswith(f"#3 migration from {OLD.digest} to {V24.digest} (version 2.4.0) at ")
    assert head.endswith(" by cli:ann: add the check")
    assert f" at {_iso(at_ms)} by " in head  # when, in UTC
    assert lines[lines.index(head) + 1] == (
        f"   stage map: kept {', '.join(KEPT_24)}; added (pending) quality-check (worker)"
    )


def _iso(at_ms: int) -> str:
    return datetime.fromtimestamp(at_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _cli(*args: str) -> tuple[int, Any]:
    proc = await asyncio.create_subprocess_exec(
        ACCORD, *args, "--json", cwd=ROOT, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=dict(os.environ),
    )  # fmt: skip
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, json.loads(out)
