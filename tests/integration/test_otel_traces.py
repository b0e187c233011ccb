"""One model-ingest run traced across four processes: the engine (this process, its telemetry sink
exporting OTLP), two Python workers under ``accord worker run`` and the TypeScript
``metadata.extract@2`` worker on Node, all exporting to a loopback OTLP/HTTP receiver that decodes
``ExportTraceServiceRequest`` with opentelemetry-proto. The test checks the tree: one trace per
run, a root run span, an attempt span per worker stage with the envelope's traceparent span id,
dispatch and outcome spans under it, and each worker's execute span under its attempt, with run,
stage, attempt and contract version attributes and no payload value anywhere.

Without the ``OTEL_*`` variables nothing is exported: the same run sends the receiver nothing."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tests/integration is no package: reach tests.* from the root
    sys.path.insert(0, str(ROOT))
from engine_shell_support import wait_terminal  # noqa: E402
from otlp_receiver import OtlpServer, Span  # noqa: E402
from tests.integration.ts_worker_support import NodeWorker, built_worker, cube_stl  # noqa: E402
from tests.services import REDIS_DB, ensure_redis, held_open, redis_url  # noqa: E402

from accord.actions import PlatformConfig, register_platform_actions  # noqa: E402
from accord.adapters import open_engine  # noqa: E402
from accord.adapters.telemetry import otel  # noqa: E402
from accord.contracts.sources import load_catalog  # noqa: E402
from accord.engine.machine import ids  # noqa: E402
from accord.engine.runtime.checks import contract_result_check  # noqa: E402
from accord.engine.runtime.orchestrator import Engine, EngineOptions  # noqa: E402
from accord.workflow.compiler import compile_workflow  # noqa: E402

pytestmark = pytest.mark.node
TENANT, MODEL = "acme", "m1"
WORKER_STAGES = {
    "render-thumbnail": "accord-py-thumbnails",
    "semantic-analysis": "accord-py-semantics",
    "technical-metadata": "accord-ts-metadata",
}
REQUESTS = {  # the request contract each stage's envelope names (model-ingest@2.3.0's pins)
    "render-thumbnail": "thumbnail-generation-request@2",
    "semantic-analysis": "semantic-analysis-request@1",
    "technical-metadata": "metadata-extraction-request@1",
}


@pytest.fixture(scope="module")
def otlp() -> Iterator[OtlpServer]:
    server = OtlpServer()
    yield server
    server.close()


def _env(otlp: OtlpServer, service: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
        "OTEL_SERVICE_NAME": service,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }


class PyWorker:
    def __init__(self, spec: str, transport: str, store: str, state: Path, env: dict[str, str]):
        self.log = state / f"{spec.replace(':', '-')}.log"
        state.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-c", "from accord.cli import main; main()", "worker", "run", spec,
               "--transport", transport, "--store", store, "--state", str(state),
               "--heartbeat-ms", "200"]  # fmt: skip
        child = {**os.environ, "PYTHONPATH": str(ROOT / "tests" / "integration"), **env}
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                         env=child)  # fmt: skip

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, otlp: OtlpServer) -> Iterator[dict[str, Any]]:
    ensure_redis()
    root = tmp_path_factory.mktemp("otel")
    storage = root / "objects"
    (storage / TENANT / "models").mkdir(parents=True)
    (storage / TENANT / "models" / f"{MODEL}.stl").write_bytes(cube_stl(2.0, (0.0, 0.0, 0.0)))
    prefix = f"otl-{uuid.uuid4().hex[:10]}"
    store = redis_url()
    node = NodeWorker(built_worker(), prefix, storage, root / "node.log",
                      env=_env(otlp, WORKER_STAGES["technical-metadata"]))  # fmt: skip
    py = [
        PyWorker("otel_fleet:thumbnails", node.url, store, root / "thumbs",
                 _env(otlp, WORKER_STAGES["render-thumbnail"])),
        PyWorker("otel_fleet:semantics", node.url, store, root / "semantics",
                 _env(otlp, WORKER_STAGES["semantic-analysis"])),
    ]  # fmt: skip
    try:
        yield {"transport": node.url, "store": store, "state": root / "engine", "node": node}
    finally:
        for w in py:
            w.stop()
        node.stop()
        client = held_open(redis.Redis(port=6379, db=REDIS_DB))
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)


@pytest.fixture
async def traced_engine(
    fleet: dict[str, Any], otlp: OtlpServer, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Engine, otel.OtelSink]]:
    for k, v in _env(otlp, "accord-engine").items():
        monkeypatch.setenv(k, v)
    otel.reset()
    tracing = otel.tracing("accord-engine")
    assert tracing is not None
    sink = otel.OtelSink(tracing)
    async with _Engine(fleet, sink) as eng:
        yield eng, sink
    tracing.flush()
    otel.reset()


class _Engine:
    def __init__(self, fleet: dict[str, Any], sink: Any) -> None:
        self.fleet, self.sink = fleet, sink

    async def __aenter__(self) -> Engine:
        catalog = load_catalog(ROOT / "schemas" / "contracts")
        source = (ROOT / "workflows" / "model-ingest.yaml").read_text()
        plan = compile_workflow(source, "model-ingest.yaml", catalog).unwrap()
        eng = open_engine(
            self.fleet["store"], self.fleet["transport"], options=EngineOptions(poll_ms=10),
            result_checks=[contract_result_check(catalog)], catalog=catalog, sink=self.sink,
        )  # fmt: skip

        async def load_run(run_id: str) -> dict[str, Any] | None:
            stored = await eng.store.load(run_id)
            return dict(stored.state) if stored else None

        self.platform = register_platform_actions(
            eng.registry, PlatformConfig(self.fleet["state"], catalog=catalog, load_run=load_run)
        )
        self.platform.writer.watch(plan)
        eng.observers.append(self.platform.writer)
        await eng.register_plan(plan)
        await eng.start()
        self.engine = eng
        return eng

    async def __aexit__(self, *exc: object) -> None:
        await self.engine.executor.wait_idle()
        await self.engine.stop()
        await self.platform.writer.drain()
        self.platform.close()


async def _one_run(engine: Engine, model: str) -> str:
    run_id = await engine.start_run("model-ingest", {"modelId": model}, tenant=TENANT)
    await wait_terminal(engine.store, [run_id], 60)
    run = await engine.load(run_id)
    assert run is not None and run.status == "completed", run
    return run_id


def _wait_for(
    otlp: OtlpServer, trace_id: str, names: set[str], timeout_s: float = 20
) -> list[Span]:
    """The trace's spans, once every name in ``names`` has arrived (or the time is up)."""
    deadline = time.monotonic() + timeout_s
    spans = otlp.receiver.of_trace(trace_id)
    while not names <= {s.name for s in spans} and time.monotonic() < deadline:
        time.sleep(0.1)
        spans = otlp.receiver.of_trace(trace_id)
    return spans


async def test_one_model_ingest_run_is_one_trace_across_engine_and_three_workers(
    traced_engine: tuple[Engine, otel.OtelSink], otlp: OtlpServer
) -> None:
    engine, _sink = traced_engine
    run_id = await _one_run(engine, MODEL)
    trace_id = ids.traceparent(run_id, "", 0).split("-")[1]
    # the engine's spans leave once the sink has the terminal event: wait for its root span
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(
        s.name.startswith("accord.run ") for s in otlp.receiver.of_trace(trace_id)
    ):
        otel.tracing("accord-engine").flush()  # type: ignore[union-attr]
        await asyncio.sleep(0.1)
    executes = {f"accord.execute {stage}" for stage in WORKER_STAGES}
    spans = await asyncio.to_thread(_wait_for, otlp, trace_id, executes)
    by_id = {s.span_id: s for s in spans}
    roots = [s for s in spans if not s.parent]
    assert [r.name for r in roots] == ["accord.run model-ingest"], [s.name for s in spans]
    root = roots[0]
    assert root.span_id == otel.run_span_id(run_id)
    assert (root.service, root.attributes["accord.run_id"]) == ("accord-engine", run_id)
    for stage, service in WORKER_STAGES.items():
        attempt_id = ids.traceparent(run_id, stage, 1).split("-")[2]
        attempt = by_id.get(attempt_id)
        assert attempt is not None, f"no attempt span for {stage}: {[s.name for s in spans]}"
        assert (attempt.name, attempt.parent) == (f"accord.attempt {stage}#1", root.span_id)
        assert attempt.attributes["accord.stage"] == stage
        assert attempt.attributes["accord.attempt"] == 1
        children = {s.name: s for s in spans if s.parent == attempt_id}
        assert set(children) == {
            f"accord.dispatch {stage}",
            f"accord.execute {stage}",
            f"accord.outcome {stage}",
        }, children
        execute = children[f"accord.execute {stage}"]
        assert execute.service == service  # continued in the worker's own process
        assert execute.attributes["accord.run_id"] == run_id
        assert execute.attributes["accord.attempt"] == 1
        assert execute.attributes["accord.contract"] == REQUESTS[stage]
        assert children[f"accord.outcome {stage}"].attributes["accord.outcome"] == "succeeded"
    ts = [s for s in spans if s.service == "accord-ts-metadata"]
    assert ts and ts[0].encoding == "json"  # the Node worker's own exporter
    assert {s.encoding for s in spans if s.service != "accord-ts-metadata"} == {"protobuf"}
    # attributes name the run, never a payload value (the model id is the context's only field)
    for s in spans:
        assert MODEL not in {str(v) for v in s.attributes.values()}, s


async def test_without_otel_variables_nothing_is_exported(
    fleet: dict[str, Any], otlp: OtlpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(k, raising=False)
    otel.reset()
    assert otel.tracing("accord-engine") is None
    assert otel.worker_span({"traceparent": ids.traceparent("r", "s", 1)}, "x@1") is otel._OFF
    async with _Engine(fleet, None) as eng:
        before = len(otlp.receiver.spans)
        run_id = await _one_run(eng, MODEL)
    trace_id = ids.traceparent(run_id, "", 0).split("-")[1]
    await asyncio.sleep(0.5)
    engine_spans = [s for s in otlp.receiver.of_trace(trace_id) if s.service == "accord-engine"]
    assert engine_spans == []
    assert len(otlp.receiver.spans) >= before
