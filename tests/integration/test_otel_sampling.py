"""Trace sampling keeps or drops a run's trace whole, across the engine and a worker process.

The engine (this process) and one ``accord worker run`` process serving model-ingest's three
worker capabilities through the real Worker SDK both read ``OTEL_TRACES_SAMPLER=
parentbased_traceidratio`` and ``OTEL_TRACES_SAMPLER_ARG=0.5`` and export OTLP/HTTP to a loopback
receiver. Run ids are chosen so that half of the runs' trace ids fall under the ratio
(``TraceIdRatioBased``'s own test, computed here independently). Every kept run arrives whole —
root, attempts, dispatches, outcomes and each worker's execute span — and a dropped run sends
nothing from any process; the engine's span builder counts the dropped events and built no span
for them. Ratio and flag handling: ``--trace-sample`` parsing, the ``OTEL_TRACES_SAMPLER``
variables, a ``-00`` traceparent dropped by the worker, and a ratio of 0 registering no span
builder at all.
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
from engine_shell_support import wait_terminal
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from otel_fleet import _worker
from otlp_receiver import OtlpServer

from accord.actions import PlatformConfig, register_platform_actions
from accord.adapters import open_engine
from accord.adapters.telemetry import FanoutSink, otel
from accord.contracts.sources import load_catalog
from accord.engine.machine import ids
from accord.engine.runtime.checks import contract_result_check
from accord.engine.runtime.orchestrator import EngineOptions
from accord.worker import Worker
from accord.workflow.compiler import compile_workflow

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("render-thumbnail", "semantic-analysis", "technical-metadata")
RATIO = 0.5


def _fleet() -> Worker:
    """One worker serving the three worker capabilities of model-ingest."""
    worker = Worker("otel-sampled")
    for capability in ("thumbnail.render@3", "semantic.analyse@4", "metadata.extract@2"):
        one = _worker(f"otel-{capability}", capability)
        worker.bind(capability, one.bindings[capability].handler)
    return worker


fleet = _fleet()


def _kept(run_id: str, ratio: float = RATIO) -> bool:
    trace_id = int(ids.traceparent(run_id, "", 0).split("-")[1], 16)
    return trace_id & TraceIdRatioBased.TRACE_ID_LIMIT < TraceIdRatioBased.get_bound_for_rate(ratio)


def _run_ids(count: int) -> tuple[list[str], list[str]]:
    """``count`` run ids whose traces are kept at RATIO and ``count`` whose are dropped."""
    kept: list[str] = []
    dropped: list[str] = []
    while len(kept) < count or len(dropped) < count:
        run_id = f"run_{uuid.uuid4().hex[:24]}"
        pick = kept if _kept(run_id) else dropped
        if len(pick) < count:
            pick.append(run_id)
    return kept, dropped


def _env(otlp: OtlpServer, service: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
        "OTEL_SERVICE_NAME": service,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": str(RATIO),
    }


@pytest.fixture
def otlp() -> Iterator[OtlpServer]:
    server = OtlpServer()
    yield server
    server.close()


async def test_a_run_is_traced_whole_or_not_at_all_across_engine_and_worker(
    tmp_path: Path, otlp: OtlpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'accord.db'}"
    for k, v in _env(otlp, "accord-engine").items():
        monkeypatch.setenv(k, v)
    otel.reset()
    catalog = load_catalog(ROOT / "schemas" / "contracts")
    plan = compile_workflow(
        (ROOT / "workflows" / "model-ingest.yaml").read_text(), "model-ingest.yaml", catalog
    ).unwrap()
    sink = otel.register(FanoutSink())
    assert isinstance(sink, FanoutSink)
    spans = sink.get("otel")
    assert isinstance(spans, otel.OtelSink) and spans.tracing.ratio == RATIO
    engine = open_engine(url, url, options=EngineOptions(poll_ms=10), catalog=catalog, sink=sink,
                         result_checks=[contract_result_check(catalog)])  # fmt: skip

    async def load_run(run_id: str) -> dict[str, Any] | None:
        stored = await engine.store.load(run_id)
        return dict(stored.state) if stored else None

    platform = register_platform_actions(
        engine.registry, PlatformConfig(tmp_path / "state", catalog=catalog, load_run=load_run)
    )
    engine.observers.append(platform.writer)
    await engine.register_plan(plan)
    await engine.start()
    log = (tmp_path / "worker.log").open("wb")
    child = os.environ | {"PYTHONPATH": str(ROOT / "tests" / "integration")}
    child |= _env(otlp, "accord-py-worker")
    worker = subprocess.Popen(
        [sys.executable, "-c", "from accord.cli import main; main()", "worker", "run",
         "test_otel_sampling:fleet", "--transport", url, "--store", url,
         "--state", str(tmp_path / "worker")],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=child,
    )  # fmt: skip
    kept, dropped = _run_ids(3)
    try:
        for run_id in [x for pair in zip(kept, dropped, strict=True) for x in pair]:
            await engine.start_run("model-ingest", {"modelId": "m1"}, "acme", run_id)
        await wait_terminal(engine.store, [*kept, *dropped], 60)
        await engine.executor.wait_idle()
    finally:
        await engine.stop()
        await platform.writer.drain()
        platform.close()
        worker.terminate()
        worker.wait(15)
        log.close()
    spans.tracing.flush()
    wanted = (
        {"accord.run model-ingest"}
        | {
            f"accord.{kind} {stage}"
            for stage in STAGES
            for kind in ("dispatch", "execute", "outcome")
        }
        | {f"accord.attempt {stage}#1" for stage in STAGES}
    )

    def trace(run_id: str) -> list[Any]:
        return otlp.receiver.of_trace(ids.traceparent(run_id, "", 0).split("-")[1])

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(
        wanted <= {s.name for s in trace(r)} for r in kept
    ):
        await asyncio.sleep(0.1)
    for run_id in kept:
        got = trace(run_id)
        assert wanted <= {s.name for s in got}, (run_id, sorted(s.name for s in got))
        assert {s.service for s in got} == {"accord-engine", "accord-py-worker"}
    for run_id in dropped:
        assert trace(run_id) == [], f"{run_id} was sampled out, yet spans arrived"
    assert spans.dropped > 0 and spans.spans > 0
    assert (tmp_path / "worker.log").read_text().count("Traceback") == 0


def test_ratios_flags_and_the_zero_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    assert otel.parse_ratio("0.1") == 0.1 and otel.parse_ratio("10%") == 0.1
    assert otel.parse_ratio("1") == 1.0 and otel.parse_ratio("0") == 0.0
    for bad in ("1.5", "-0.1", "often", "200%"):
        with pytest.raises(ValueError, match="expected a ratio from 0 to 1"):
            otel.parse_ratio(bad)
    assert otel.sample_ratio({}) == 1.0
    assert otel.sample_ratio({"OTEL_TRACES_SAMPLER": "always_off"}) == 0.0
    assert otel.sample_ratio({"OTEL_TRACES_SAMPLER": "traceidratio",
                              "OTEL_TRACES_SAMPLER_ARG": "0.25"}) == 0.25  # fmt: skip
    assert otel.sample_ratio({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                              "OTEL_TRACES_SAMPLER_ARG": "lots"}) == 1.0  # fmt: skip

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")
    otel.reset()
    try:
        run_id = _run_ids(1)[0][0]  # a run kept at RATIO, so kept at 1.0 too
        envelope = {"traceparent": ids.traceparent(run_id, "render-thumbnail", 1),
                    "runId": run_id, "stage": "render-thumbnail", "attempt": 1}  # fmt: skip
        assert otel.worker_span(envelope, "thumbnail.render@3") is not otel._OFF
        unsampled = envelope | {"traceparent": envelope["traceparent"][:-2] + "00"}
        assert otel.worker_span(unsampled, "thumbnail.render@3") is otel._OFF
        otel.reset()
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
        assert otel.worker_span(envelope, "thumbnail.render@3") is otel._OFF
        otel.reset()
        inner = FanoutSink()
        assert otel.register(inner, ratio=0.0) is inner and inner.get("otel") is None
        otel.reset()
        assert otel.register(None, "accord-other", ratio=0.0) is None
    finally:
        otel.reset()
