"""Shadow runs over HTTP: ``POST /v1/workflows/{name}/shadow`` compiles a pasted definition
(nothing stored) and replays the principal's tenants' recorded runs that ``where`` chooses
through it, answering the report ``accord workflow shadow --json`` prints.

Five model-ingest runs (workflows/model-ingest.yaml, 2.3.0) are recorded through the engine's own
path on the SQLite store the server then serves: ``rec-0`` (acme) a hit with outcome ``hit``,
``rec-1`` (acme) a miss, ``rec-2`` (globex) and ``rec-3`` (acme) hits with outcome ``expired``,
``rec-4`` (acme) failed in the cache lookup. The new version (2.4.0) takes the cache route only
when the outcome is ``hit``. By hand: acme's completed runs are rec-0, rec-1 and rec-3; rec-0
and rec-1 replay identically, rec-3 now decides for the render, which its recorded run never
called (decision, route, new call, would dispatch, incomplete); globex sees only rec-2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from tests.integration.test_api_support import ROOT, catalog, serving

from accord.adapters import open_store, open_transport
from accord.adapters.clock import SystemClock
from accord.engine.machine.events import StageFailed, StageSucceeded
from accord.engine.machine.state import RunState
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.workflow.compiler import compile_workflow
from accord.workflow.plan import Plan

OLD_SOURCE = (ROOT / "workflows" / "model-ingest.yaml").read_text(encoding="utf-8")
HIT = "'stages[\"cache-lookup\"].result.hit == true'"
NEW_SOURCE = OLD_SOURCE.replace(
    HIT, HIT[:-1] + ' && stages["cache-lookup"].result.outcome == "hit"\''
).replace('version: "2.3.0"', 'version: "2.4.0"')
LOOKUPS = {
    0: {"hit": True, "outcome": "hit"},
    1: {"hit": False, "outcome": "miss"},
    2: {"hit": True, "outcome": "expired"},
    3: {"hit": True, "outcome": "expired"},
}
DIVERGED = ["decision", "new-call", "outcome", "route", "would-dispatch"]


def _compiled(source: str) -> Plan:
    plan = compile_workflow(source, "model-ingest.yaml", catalog()).plan
    assert plan is not None
    return plan


async def _record(engine: Engine, plan: Plan, i: int, tenant: str) -> None:
    """Run ``rec-i`` to its end, answering each live stage (``rec-4``'s lookup fails)."""
    rid = await engine.start_run(plan.digest, {"modelId": f"m-{i}"}, tenant=tenant,
                                 run_id=f"rec-{i}")  # fmt: skip
    for _ in range(100):
        stored = await engine.store.load(rid)
        assert stored is not None
        run = RunState.from_json(stored.state)
        if run.terminal:
            assert run.status == ("failed" if i == 4 else "completed"), run.status
            return
        name = min(n for n, s in run.stages.items()
                   if s.current and s.current.status in ("queued", "running"))  # fmt: skip
        st = run.stages[name]
        ident = {"run_id": rid, "stage": name, "attempt": st.attempt, "fence": st.fence}
        if name == "cache-lookup" and i == 4:
            await engine.deliver(StageFailed(**ident, retryable=False, code="broken"))
        else:
            result = LOOKUPS[i] if name == "cache-lookup" else {"ok": True}
            await engine.deliver(StageSucceeded(**ident, result=result))
    raise AssertionError(f"{rid} did not end")


async def _recorded(tmp: Path) -> Plan:
    engine = Engine(
        open_store(f"sqlite:///{tmp / 'accord.db'}"), open_transport("memory://"), SystemClock(),
        options=EngineOptions(dispatch=False, canary_every_ms=0), owns_ports=True,
    )  # fmt: skip
    old = _compiled(OLD_SOURCE)
    try:
        await engine.register_plan(old)
        for i, tenant in enumerate(("acme", "acme", "globex", "acme", "acme")):
            await _record(engine, old, i, tenant)
    finally:
        await engine.stop()
    return old


async def _shadow(client: httpx.AsyncClient, name: str = "model-ingest", **body: Any) -> Any:
    doc = {"source": NEW_SOURCE, "filename": "new.yaml", **body}
    return await client.post(f"/v1/workflows/{name}/shadow", json=doc)


def _kinds(report: dict[str, Any]) -> dict[str, list[str]]:
    return {r["run_id"]: sorted({d["kind"] for d in r["divergences"]}) for r in report["runs"]}


async def test_shadow_runs_over_http_replay_the_tenants_recorded_runs(tmp_path: Path) -> None:
    old = await _recorded(tmp_path)
    new = _compiled(NEW_SOURCE)
    async with serving(tmp_path) as api:
        for role in ("viewer", "operator"):
            async with api.as_(role) as client:
                got = await _shadow(client)
                assert got.status_code == 403 and got.json()["needed_role"] == "author", got.text
        async with api.as_("author") as client:
            got = await _shadow(client)
            assert got.status_code == 200, got.text
            report = got.json()
            assert (report["workflow"], report["recorded_digest"], report["shadow_digest"]) == (
                "model-ingest", old.digest, new.digest)  # fmt: skip
            assert _kinds(report) == {"rec-0": [], "rec-1": [], "rec-3": DIVERGED}
            assert (report["replayed"], report["identical"], report["diverged"]) == (3, 2, 1)
            assert report["shadow_outcomes"] == {"completed": 2, "incomplete": 1}
            assert report["runs_with"]["decision"] == 1 and report["where"] is None

            got = await _shadow(client, where="status=failed", limit=5)
            assert got.status_code == 200, got.text
            assert [(r["run_id"], r["recorded"]) for r in got.json()["runs"]] == [
                ("rec-4", "failed")]  # fmt: skip
            assert got.json()["where"] == "status=failed"
            got = await _shadow(client, where="version:2.3.0 tenant:acme", limit=1)
            assert list(_kinds(got.json())) == ["rec-3"]  # the newest one

            bad = {"status:running": "status:running", "colour:red": "colour", "slow": "'slow'",
                   "workflow:other": "workflow:other"}  # fmt: skip
            for where, term in bad.items():
                got = await _shadow(client, where=where)
                assert got.status_code == 422 and got.json()["code"] == "shadow-bad-query", where
                assert term in got.json()["detail"], got.json()
            got = await _shadow(client, where="tenant:globex")
            assert got.status_code == 403 and got.json()["code"] == "tenant-forbidden"
            got = await _shadow(client, name="marketplace-publish")
            assert got.status_code == 422 and got.json()["code"] == "shadow-wrong-workflow"
            broken = NEW_SOURCE.replace("on_success:", "on_sucess:", 1)
            got = await client.post("/v1/workflows/model-ingest/shadow", json={"source": broken})
            assert got.status_code == 422 and got.json()["code"] == "workflow-refused"
            assert got.json()["diagnostics"][0]["line"]
            got = await _shadow(client, limit=0)
            assert got.status_code == 422 and got.json()["code"] == "invalid-request"
        async with api.as_("author", "globex") as client:
            got = await _shadow(client)
            assert got.status_code == 200 and _kinds(got.json()) == {"rec-2": DIVERGED}
        assert await api.engine.store.get_plan(new.digest) is None  # nothing was stored
        assert await api.engine.store.get_active("model-ingest") == old.digest
