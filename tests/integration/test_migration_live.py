"""Governed migration of live runs: workflows/model-ingest.yaml (2.3.0) runs on SQLite with the
embedded queue until its runs wait at the fork; they are moved to 2.4.0 (a new metadata check
between the join and publish) — one through the engine, the others through `accord runs
migrate` in another process — and the worker fleet then completes them on the new version. A
run still rendering cannot move to a version that renames the render: the refusal is recorded
and the command exits 1."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from engine_shell_support import wait_terminal

from accord.adapters import open_engine
from accord.cli.workflow import compile_file
from accord.contracts.catalog import Catalog
from accord.contracts.fixture_values import message_of
from accord.contracts.sources import load_catalog
from accord.engine.machine.replay import replay_across
from accord.engine.machine.state import HistoryEntry, RunState
from accord.engine.runtime.actions import ActionContext, ActionHandler
from accord.engine.runtime.checks import contract_result_check
from accord.engine.runtime.migration import migrate_run
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.testing.workers import run_noop_worker
from accord.workflow.plan import Plan, TaskStage

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "workflows" / "model-ingest.yaml"
ACCORD = str(Path(sys.executable).with_name("accord"))
CHECK = """  - name: verify-metadata
    type: worker
    queue: metadata
    worker: metadata.extract@2
    input: { modelId: "${context.modelId}" }
    on_success: publish
    on_failure: failed
"""


def _version_24(tmp: Path) -> Path:
    text = SOURCE.read_text(encoding="utf-8")
    text = text.replace('version: "2.3.0"', 'version: "2.4.0"')
    join = "    acceptable_terminal_states: [completed]\n    on_success: publish\n"
    assert join in text
    text = text.replace(join, join.replace("publish", "verify-metadata"))
    text = text.replace("  - name: publish\n", CHECK + "  - name: publish\n")
    path = tmp / "model-ingest-2.4.0.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _version_renamed(tmp: Path) -> Path:
    text = SOURCE.read_text(encoding="utf-8").replace('version: "2.3.0"', 'version: "2.5.0"')
    text = text.replace("render-thumbnail", "render")
    path = tmp / "model-ingest-2.5.0.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _result(catalog: Catalog, ref: str, **extra: Any) -> dict[str, Any]:
    contract = catalog.message(ref)
    assert contract is not None, ref
    return message_of(contract.payload, full=False) | extra


def _actions(plan: Plan, catalog: Catalog) -> dict[str, ActionHandler]:
    pins = [s.capability for s in plan.stages if isinstance(s, TaskStage) and s.type == "action"]
    handlers: dict[str, ActionHandler] = {}
    for pin in (*pins, *plan.finalisers):
        extra = {"hit": False, "outcome": "miss"} if pin.name == "cache.lookup" else {}
        result = _result(catalog, pin.result, **extra)

        async def handler(payload: dict[str, Any], ctx: ActionContext, r: Any = result) -> Any:
            return r

        handlers[pin.ref] = handler
    return handlers


async def _state(engine: Engine, rid: str) -> RunState:
    stored = await engine.store.load(rid)
    assert stored is not None
    return RunState.from_json(stored.state)


async def _wait_for(engine: Engine, rids: list[str], stages: tuple[str, ...]) -> None:
    for _ in range(1000):
        runs = [await _state(engine, r) for r in rids]
        if all(r.stages[s].status == "queued" for r in runs for s in stages):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"runs never reached {stages}")


async def _cli(*args: str) -> tuple[int, dict[str, Any]]:
    proc = await asyncio.create_subprocess_exec(
        ACCORD,
        *args,
        "--json",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "USER": "author"},
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    assert not err.strip() or proc.returncode != 0, err.decode()
    return proc.returncode, json.loads(out)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(ROOT / "schemas" / "contracts")


async def test_live_model_ingest_runs_migrate_from_2_3_0_and_complete(
    catalog: Catalog, tmp_path: Path
) -> None:
    old = compile_file(SOURCE, catalog).unwrap()
    new = compile_file(_version_24(tmp_path), catalog).unwrap()
    assert old.version == "2.3.0" and new.version == "2.4.0"
    url = f"sqlite:///{tmp_path / 'mi.db'}"
    workers = {
        s.name: _result(catalog, s.capability.result, modelId="m1")
        for plan in (old, new)
        for s in plan.stages
        if isinstance(s, TaskStage) and s.type == "worker"
    }

    async def work(envelope: Mapping[str, Any]) -> dict[str, Any]:
        return workers[str(envelope["stage"])]

    engine = open_engine(
        url,
        url,
        options=EngineOptions(poll_ms=10),
        actions=_actions(new, catalog),
        result_checks=[contract_result_check(catalog)],
    )
    await engine.register_plan(old)
    await engine.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    rendering = loop.create_task(
        run_noop_worker(engine.transport, ["rendering"], handler=work, stop=stop)
    )
    try:
        rids = [
            await engine.start_run(old.name, {"modelId": "m1"}, tenant="acme") for _ in range(3)
        ]
        await _wait_for(engine, rids, ("semantic-analysis", "technical-metadata"))
        stop.set()
        await rendering
        # the plan the CLI names by file: stored, not activated
        code, plan_doc = await _cli(
            "workflow",
            "migration-plan",
            old.digest,
            str(tmp_path / "model-ingest-2.4.0.yaml"),
            "--store",
            url,
        )
        assert code == 0, plan_doc
        assert plan_doc["map"]["added"] == ["verify-metadata"] and plan_doc["map"]["removed"] == []
        assert sorted(r["run_id"] for r in plan_doc["runs"] if r["can_move"]) == sorted(rids)

        done = await migrate_run(
            engine,
            rids[0],
            new.digest,
            by="key:author",
            reason="add the metadata check",
            catalog=catalog,
        )
        assert done.moved, done.to_json()
        for rid in rids[1:]:
            code, doc = await _cli(
                "runs",
                "migrate",
                rid,
                "--to",
                new.digest,
                "--store",
                url,
                "--reason",
                "add the metadata check",
            )
            assert code == 0 and doc["ok"] and doc["migrated"], doc
        for rid in rids:
            run = await _state(engine, rid)
            assert (
                run.plan_digest == new.digest and run.stages["verify-metadata"].status == "pending"
            )

        stop = asyncio.Event()
        fleet = loop.create_task(
            run_noop_worker(
                engine.transport, ["rendering", "analysis", "metadata"], handler=work, stop=stop
            )
        )
        try:
            await wait_terminal(engine.store, rids)
            await engine.executor.wait_idle()
        finally:
            stop.set()
            await fleet
        plans = {old.digest: old, new.digest: new}
        for rid in rids:
            run = await _state(engine, rid)
            assert run.status == "completed", (rid, run.error)
            assert run.stages["verify-metadata"].status == "completed"
            assert run.stages["publish"].status == "completed"
            history = await engine.store.history(rid)
            moved = [h for h in history if h["event"]["kind"] == "run-migrated"]
            assert len(moved) == 1 and moved[0]["accepted"]
            assert moved[0]["event"]["reason"] == "add the metadata check"
            assert moved[0]["event"]["by"] in ("key:author", "cli:author")
            assert replay_across(plans, [HistoryEntry.from_json(h) for h in history]) == run
    finally:
        await engine.stop()


async def test_a_run_still_rendering_refuses_a_version_that_renames_the_render(
    catalog: Catalog, tmp_path: Path
) -> None:
    old = compile_file(SOURCE, catalog).unwrap()
    url = f"sqlite:///{tmp_path / 'mi.db'}"
    engine = open_engine(
        url, url, options=EngineOptions(poll_ms=10), actions=_actions(old, catalog)
    )
    await engine.register_plan(old)
    await engine.start()
    try:
        rid = await engine.start_run(old.name, {"modelId": "m1"}, tenant="acme")
        await _wait_for(engine, [rid], ("render-thumbnail",))
        target = str(_version_renamed(tmp_path))
        code, doc = await _cli(
            "runs",
            "migrate",
            rid,
            "--to",
            target,
            "--store",
            url,
            "--map",
            "render-thumbnail=render",
        )
        assert code == 1 and doc["ok"] is False and doc["migrated"] is False
        (refusal,) = doc["refusals"]
        assert refusal["code"] == "migration-strands-attempt"
        assert refusal["stage"] == "render-thumbnail"
        history = await engine.store.history(rid)
        last = history[-1]
        assert last["event"]["kind"] == "run-migrated" and not last["accepted"]
        assert "migration-strands-attempt" in last["note"]
        run = await _state(engine, rid)
        assert run.plan_digest == old.digest
        code, doc = await _cli(
            "runs", "migrate", rid, "--to", target, "--store", url, "--map", "render-thumbnail"
        )
        assert code == 2 and "OLD=NEW" in doc["error"]
        code, doc = await _cli("runs", "migrate", "no-such-run", "--to", target, "--store", url)
        assert code == 1 and "not found" in doc["error"]
    finally:
        await engine.stop()
