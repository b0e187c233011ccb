"""Shadow runs chosen by a query: ``accord workflow shadow NEW --where QUERY --limit N`` replays
the recorded runs that match the terms of ``accord runs search`` (tenant, status, version,
requester, since …), evaluated on the store's own records, and refuses a query it cannot answer
with the term named.

The 16 recorded runs (i = 0 … 15) are those of test_shadow_report.py: acme for even i, beta for
odd i; i = 14 and 15 fail in the cache lookup. By hand: the 7 completed acme runs are 0, 2, … 12,
and of them the fresh hits (i % 8 == 0: 0 and 8) replay identically; the newest 3 completed beta
runs are 13, 11 and 9; the failed runs are 14 and 15, and only 15 is beta."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.integration.test_shadow_report import NEW, OLD, _result

from accord.adapters import open_store, open_transport
from accord.adapters.clock import SystemClock
from accord.engine.machine.events import StageFailed, StageSucceeded
from accord.engine.machine.state import RunState
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.engine.runtime.shadow import parse_where, shadow
from accord.workflow.activation import stored_document

ROOT = Path(__file__).resolve().parents[2]
ACCORD = str(Path(sys.executable).with_name("accord"))


async def _record(engine: Engine, i: int, tenant: str, *, fail: bool = False) -> str:
    """A run with each live stage answered with test_shadow_report's results; with ``fail``,
    the cache lookup fails for good and the run ends ``failed`` (after its finaliser)."""
    rid = await engine.start_run(
        OLD.digest, {"modelId": f"m-{i}"}, tenant=tenant, run_id=f"rec-{i:03d}"
    )
    for _ in range(100):
        stored = await engine.store.load(rid)
        assert stored is not None
        run = RunState.from_json(stored.state)
        if run.terminal:
            assert run.status == ("failed" if fail else "completed"), run.status
            return rid
        name = min(
            n
            for n, s in run.stages.items()
            if s.current and s.current.status in ("queued", "running")
        )
        st = run.stages[name]
        ident = {"run_id": rid, "stage": name, "attempt": st.attempt, "fence": st.fence}
        if fail and name == "cache-lookup":
            await engine.deliver(StageFailed(**ident, retryable=False, code="broken"))
        else:
            await engine.deliver(StageSucceeded(**ident, result=_result(i, name)))
    raise AssertionError(f"{rid} did not end")


async def _cli(*args: str) -> tuple[int, Any]:
    proc = await asyncio.create_subprocess_exec(
        ACCORD, *args, "--json", cwd=ROOT, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=dict(os.environ),
    )  # fmt: skip
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, json.loads(out)


async def test_shadow_replays_the_runs_a_query_chooses(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shadow.db'}"
    engine = Engine(
        open_store(url), open_transport("memory://"), SystemClock(),
        options=EngineOptions(dispatch=False, canary_every_ms=0), owns_ports=True,
    )  # fmt: skip
    try:
        await engine.register_plan(OLD)
        for i in range(14):
            await _record(engine, i, "acme" if i % 2 == 0 else "beta")
        await _record(engine, 14, "acme", fail=True)
        await _record(engine, 15, "beta", fail=True)
        await engine.store.put_plan(NEW.digest, stored_document(NEW))
        now = SystemClock().now_ms() + 1  # after the last record, even within its millisecond

        acme = await shadow(engine.store, NEW, 100, where=parse_where("tenant:acme", OLD.name, now))
        assert [r.run_id for r in acme.runs] == [f"rec-{i:03d}" for i in range(0, 14, 2)]
        assert acme.recorded_digest == OLD.digest
        identical = sorted(r.run_id for r in acme.runs if not r.divergences)
        assert identical == ["rec-000", "rec-008"]

        newest = await shadow(
            engine.store,
            NEW,
            3,
            where=parse_where("workflow=model-ingest tenant=beta", OLD.name, now),
        )
        assert [r.run_id for r in newest.runs] == ["rec-009", "rec-011", "rec-013"]

        failed = await shadow(
            engine.store, NEW, 10, where=parse_where(f"status:failed version:{OLD.version}",
                                                     OLD.name, now),
        )  # fmt: skip
        assert [(r.run_id, r.recorded) for r in failed.runs] == [
            ("rec-014", "failed"), ("rec-015", "failed"),
        ]  # fmt: skip
        later = await shadow(engine.store, NEW, 10, where=parse_where("since:0ms", OLD.name, now))
        assert later.runs == ()  # nothing was updated after `now`
    finally:
        await engine.stop()

    code, doc = await _cli(
        "workflow", "shadow", NEW.digest, "--store", url, "--where", "tenant:beta status:failed",
        "--limit", "5",
    )  # fmt: skip
    assert code == 0, doc
    assert doc["where"] == "tenant:beta status:failed" and doc["replayed"] == 1
    assert [r["run_id"] for r in doc["runs"]] == ["rec-015"]
    for bad, named in (  # refused by the command, exit 2, one JSON document naming the term
        ("status:running", "status:running: only ended runs"),
        ("colour:blue", "unknown key 'colour'"),
    ):
        code, doc = await _cli("workflow", "shadow", NEW.digest, "--store", url, "--where", bad)
        assert code == 2 and not doc["ok"], doc
        assert f"--where {bad!r}" in doc["error"] and named in doc["error"], doc["error"]
    for bad, named in (
        ("workflow:other", "workflow:other: the new plan is a version of model-ingest"),
        ("publish", "'publish': free text is not a shadow query term"),
        ("since:soon", "since"),
    ):
        with pytest.raises(ValueError, match=re.escape(named)):
            parse_where(bad, OLD.name, 0)
