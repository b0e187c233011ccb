"""The engine's sampling decision travels in the jobs' trace flags, to every worker process.

The engine (this process) samples at 0.5 (``--trace-sample 0.5``, here ``otel.register(...,
ratio=0.5)``); one ``accord worker run`` process (thumbnail.render@3, semantic.analyse@4) and the
TypeScript ``metadata.extract@2`` worker on Node are both configured to keep every trace
(``OTEL_TRACES_SAMPLER=traceidratio``, ``OTEL_TRACES_SAMPLER_ARG=1.0``). Run ids are chosen so that
half of the runs fall under the engine's ratio. A kept run's jobs say ``-01`` and its trace arrives
whole from all three processes; a dropped run's jobs say ``-00`` and nothing of it arrives from any
process, although each worker's own ratio would have kept it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tests/integration is no package: reach tests.* from the root
    sys.path.insert(0, str(ROOT))
from engine_shell_support import wait_terminal  # noqa: E402
from otel_fleet import _worker  # noqa: E402
from otlp_receiver import OtlpServer  # noqa: E402
from tests.integration.ts_worker_support import NodeWorker, built_worker, cube_stl  # noqa: E402
from tests.services import REDIS_DB, ensure_redis, held_open, redis_url  # noqa: E402

from accord.actions import PlatformConfig, register_platform_actions  # noqa: E402
from accord.adapters import open_engine  # noqa: E402
from accord.adapters.telemetry import FanoutSink, otel  # noqa: E402
from accord.contracts.sources import load_catalog  # noqa: E402
from accord.engine.machine import ids  # noqa: E402
from accord.engine.runtime.checks import contract_result_check  # noqa: E402
from accord.engine.runtime.orchestrator import EngineOptions  # noqa: E402
from accord.worker import Worker  # noqa: E402
from accord.workflow.compiler import compile_workflow  # noqa: E402

pytestmark = pytest.mark.node
TENANT, MODEL, RATIO = "acme", "m1", 0.5
SERVICES = {
    "render-thumbnail": "accord-py-flags",
    "semantic-analysis": "accord-py-flags",
    "technical-metadata": "accord-ts-flags",
}


def _py_fleet() -> Worker:
    worker = Worker("otel-flags")
    for capability in ("thumbnail.render@3", "semantic.analyse@4"):
        worker.bind(capability, _worker(capability, capability).bindings[capability].handler)
    return worker


py_fleet = _py_fleet()  # served by the `accord worker run` process


def _env(otlp: OtlpServer, service: str, ratio: float) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
        "OTEL_SERVICE_NAME": service,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_TRACES_SAMPLER": "traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": str(ratio),
    }


def _run_ids(count: int) -> tuple[list[str], list[str]]:
    """``count`` run ids the engine keeps at RATIO and ``count`` it drops."""
    kept: list[str] = []
    dropped: list[str] = []
    while len(kept) < count or len(dropped) < count:
        run_id = f"run_{uuid.uuid4().hex[:24]}"
        pick = kept if ids.trace_sampled(run_id, RATIO) else dropped
        if len(pick) < count:
            pick.append(run_id)
    return kept, dropped


@pytest.fixture
def otlp() -> Iterator[OtlpServer]:
    server = OtlpServer()
    yield server
    server.close()


async def test_the_engines_decision_rides_the_trace_flags_to_python_and_typescript_workers(
    tmp_path: Path, otlp: OtlpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    ensure_redis()
    storage = tmp_path / "objects"
    (storage / TENANT / "models").mkdir(parents=True)
    (storage / TENANT / "models" / f"{MODEL}.stl").write_bytes(cube_stl(2.0, (0.0, 0.0, 0.0)))
    prefix = f"otf-{uuid.uuid4().hex[:10]}"
    store = redis_url()
    node = NodeWorker(built_worker(), prefix, storage, tmp_path / "node.log",
                      env=_env(otlp, SERVICES["technical-metadata"], 1.0))  # fmt: skip
    log = (tmp_path / "py-worker.log").open("wb")
    child = {**os.environ, "PYTHONPATH": str(ROOT / "tests" / "integration")}
    child |= _env(otlp, SERVICES["render-thumbnail"], 1.0)
    py = subprocess.Popen(
        [sys.executable, "-c", "from accord.cli import main; main()", "worker", "run",
         "test_otel_sampled_flags:py_fleet", "--transport", node.url, "--store", store,
         "--state", str(tmp_path / "py-worker"), "--heartbeat-ms", "200"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=child,
    )  # fmt: skip
    for k, v in _env(otlp, "accord-engine", RATIO).items():
        monkeypatch.setenv(k, v)
    otel.reset()
    sink = otel.register(FanoutSink(), ratio=RATIO)
    assert otel.engine_ratio() == RATIO
    catalog = load_catalog(ROOT / "schemas" / "contracts")
    plan = compile_workflow(
        (ROOT / "workflows" / "model-ingest.yaml").read_text(), "model-ingest.yaml", catalog
    ).unwrap()
    engine = open_engine(store, node.url, options=EngineOptions(poll_ms=10), catalog=catalog,
                         sink=sink, result_checks=[contract_result_check(catalog)])  # fmt: skip
    assert engine.options.trace_sample == RATIO  # taken from the process's tracing

    async def load_run(run_id: str) -> dict[str, Any] | None:
        stored = await engine.store.load(run_id)
        return dict(stored.state) if stored else None

    platform = register_platform_actions(
        engine.registry, PlatformConfig(tmp_path / "state", catalog=catalog, load_run=load_run)
    )
    engine.observers.append(platform.writer)
    kept, dropped = _run_ids(2)
    try:
        await engine.register_plan(plan)
        await engine.start()
        for run_id in [x for pair in zip(kept, dropped, strict=True) for x in pair]:
            await engine.start_run("model-ingest", {"modelId": MODEL}, TENANT, run_id)
        await wait_terminal(engine.store, [*kept, *dropped], 60)
        for run_id in [*kept, *dropped]:
            run = await engine.load(run_id)
            assert run is not None and run.status == "completed", run
            assert run.sampled is (run_id in kept)  # recorded on the run at start
    finally:
        await engine.executor.wait_idle()
        await engine.stop()
        await platform.writer.drain()
        platform.close()
        py.terminate()
        py.wait(15)
        log.close()
        node.stop()
        client = held_open(redis.Redis(port=6379, db=REDIS_DB))
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
    tracing = otel.tracing("accord-engine")
    assert tracing is not None
    tracing.flush()
    otel.reset()
    stages = tuple(SERVICES)
    wanted = (
        {"accord.run model-ingest"}
        | {f"accord.{kind} {s}" for s in stages for kind in ("dispatch", "execute", "outcome")}
        | {f"accord.attempt {s}#1" for s in stages}
    )

    def trace(run_id: str) -> list[Any]:
        return otlp.receiver.of_trace(ids.traceparent(run_id, "", 0).split("-")[1])

    deadline = time.monotonic() + 10  # the workers' exports are under way: await them
    while time.monotonic() < deadline and not all(
        wanted <= {s.name for s in trace(r)} for r in kept
    ):
        await asyncio.sleep(0.05)
    for run_id in kept:
        got = trace(run_id)
        assert wanted <= {s.name for s in got}, (run_id, sorted(s.name for s in got))
        assert {s.service for s in got} == {"accord-engine", *SERVICES.values()}
    # every process has exported the kept runs, which were started interleaved with the dropped:
    # anything a process sent of a dropped run has arrived by now
    for run_id in dropped:
        assert trace(run_id) == [], f"{run_id} was sampled out, yet spans arrived"
    assert "Traceback" not in (tmp_path / "py-worker.log").read_text()
