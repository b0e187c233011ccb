"""The real thing: workflows/model-ingest.yaml compiled against schemas/contracts, executed by the
engine on SQLite with the embedded queue, in-process actions and a worker fleet answering with
results generated from each capability's result contract. Results are validated against their
contracts by the engine's result hook; a result that breaks its contract fails the run."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from engine_shell_support import assert_drained, wait_terminal

from accord.adapters import open_engine
from accord.cli.workflow import compile_file
from accord.contracts.catalog import Catalog
from accord.contracts.fixture_values import message_of
from accord.contracts.sources import load_catalog
from accord.engine.runtime.actions import ActionContext, ActionHandler
from accord.engine.runtime.checks import contract_result_check
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.testing.workers import run_noop_worker
from accord.workflow.admission import admit
from accord.workflow.plan import Plan, TaskStage

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compiled() -> tuple[Plan, Catalog]:
    catalog = load_catalog(ROOT / "schemas" / "contracts")
    return compile_file(ROOT / "workflows" / "model-ingest.yaml", catalog).unwrap(), catalog


def _valid_result(catalog: Catalog, ref: str, **override: Any) -> dict[str, Any]:
    contract = catalog.message(ref)
    assert contract is not None, ref
    return message_of(contract.payload, full=False) | override


def _actions(plan: Plan, catalog: Catalog, hit: bool) -> dict[str, ActionHandler]:
    pins = [s.capability for s in plan.stages if isinstance(s, TaskStage) and s.type == "action"]
    handlers: dict[str, ActionHandler] = {}
    for pin in (*pins, *plan.finalisers):
        extra = (
            {"hit": hit, "outcome": "hit" if hit else "miss"} if pin.name == "cache.lookup" else {}
        )
        result = _valid_result(catalog, pin.result, **extra)

        async def handler(payload: dict[str, Any], ctx: ActionContext, r: Any = result) -> Any:
            return r

        handlers[pin.ref] = handler
    return handlers


async def _run_model_ingest(
    plan: Plan, catalog: Catalog, url: str, *, hit: bool, break_stage: str | None = None
) -> tuple[Engine, list[str]]:
    by_stage = {
        s.name: _valid_result(catalog, s.capability.result, modelId="m1")
        for s in plan.stages
        if isinstance(s, TaskStage) and s.type == "worker"
    }
    if break_stage:
        by_stage[break_stage] = {"modelId": "m1"}  # required fields missing

    async def work(envelope: Mapping[str, Any]) -> dict[str, Any]:
        return by_stage[str(envelope["stage"])]

    engine = open_engine(
        url,
        url,
        options=EngineOptions(poll_ms=10),
        actions=_actions(plan, catalog, hit),
        result_checks=[contract_result_check(catalog)],
    )
    await engine.announce(
        "fleet-1", [*sorted(_worker_refs(plan)), *engine.registry.capabilities()], 60_000
    )
    assert admit(plan, await engine.live_capabilities()) == []
    await engine.register_plan(plan)
    await engine.start()
    queues = sorted({s.queue for s in plan.stages if isinstance(s, TaskStage) and s.queue})
    stop = asyncio.Event()
    fleet = asyncio.get_running_loop().create_task(
        run_noop_worker(engine.transport, queues, handler=work, stop=stop)
    )
    runs = [await engine.start_run(plan.name, {"modelId": "m1"}, tenant="acme") for _ in range(3)]
    try:
        await wait_terminal(engine.store, runs)
        await engine.executor.wait_idle()
    finally:
        stop.set()
        await fleet
    return engine, runs


def _worker_refs(plan: Plan) -> set[str]:
    return {
        s.capability.ref for s in plan.stages if isinstance(s, TaskStage) and s.type == "worker"
    }


@pytest.mark.parametrize("hit", [False, True])
async def test_model_ingest_completes_on_sqlite(
    compiled: tuple[Plan, Catalog], tmp_path: Path, hit: bool
) -> None:
    plan, catalog = compiled
    engine, runs = await _run_model_ingest(
        plan, catalog, f"sqlite:///{tmp_path / 'mi.db'}", hit=hit
    )
    try:
        queues = ("rendering", "analysis", "metadata")
        done = await assert_drained(engine, plan, runs, queues)
        assert {r.status for r in done} == {"completed"}
        render = {r.stages["render-thumbnail"].status for r in done}
        assert render == ({"skipped"} if hit else {"completed"})  # a cache hit skips the workers
        assert all(r.finalisers == ("completed",) for r in done)
    finally:
        await engine.stop()


async def test_result_breaking_its_contract_fails_the_run(
    compiled: tuple[Plan, Catalog], tmp_path: Path
) -> None:
    plan, catalog = compiled
    engine, runs = await _run_model_ingest(
        plan, catalog, f"sqlite:///{tmp_path / 'bad.db'}", hit=False, break_stage="render-thumbnail"
    )
    try:
        done = await assert_drained(engine, plan, runs, ("rendering", "analysis", "metadata"))
        for run in done:
            assert run.status == "failed"
            error = run.stages["render-thumbnail"].error
            assert error is not None and error["code"] == "invalid-result"
            assert "previews" in str(error)
    finally:
        await engine.stop()
