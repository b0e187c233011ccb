"""Metrics with bounded labels, read from a real ``accord serve`` application on a loopback port.

Runs for two tenants, each with a model id of its own, go through the API; ``GET /metrics`` must
then show the dispatches, outcomes, acceptance and execution histograms and ended runs under
the workflow, version, stage and capability labels only — and no label value may be a run id, a
tenant, a model id or any other context value (the test fails if one is). The label guard itself
refuses a label name outside the set and folds unknown outcomes and overflowing values into
``other``. ``GET /readyz`` answers 200 with every dependency reachable."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from engine_shell_support import wait_terminal
from prometheus_client.parser import text_string_to_metric_families
from test_api_support import Api, serving

from accord.adapters.telemetry import metrics as mx
from accord.adapters.telemetry.metrics import LABELS, MAX_VALUES, OUTCOMES, Metrics


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    mx.reset()
    async with serving(tmp_path) as served:
        yield served
    mx.reset()


async def _start(api: Api, workflow: str, tenant: str, model: str) -> str:
    async with api.as_("operator", tenant) as client:
        got = await client.post(
            "/v1/runs", json={"workflow": workflow, "context": {"modelId": model}}
        )
        assert got.status_code in (200, 201, 202), got.text
        run_id: str = got.json()["run_id"]
        return run_id


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, dict(s.labels), s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    ]


async def test_metrics_carry_only_bounded_labels(api: Api) -> None:
    models = {t: f"mdl{uuid.uuid4().hex[:10]}" for t in ("acme", "globex")}
    runs = []
    for tenant, model in models.items():
        for _ in range(2):
            runs.append(await _start(api, "api-flow", tenant, model))
    await wait_terminal(api.engine.store, runs, 30)
    for run_id in runs:
        done = await api.engine.load(run_id)
        assert done is not None and done.status == "completed", done
    failed_run = await _start(api, "api-fallback", "acme", models["acme"])  # first attempt fails
    async with asyncio.timeout(20):
        while True:
            fell = await api.engine.load(failed_run)
            if fell is not None and fell.stages["work"].status == "failed":
                break
            await asyncio.sleep(0.02)
    async with api.client() as client:
        got = await client.get("/metrics")
        ready = await client.get("/readyz")
        live = await client.get("/healthz")
    assert got.status_code == 200 and got.headers["content-type"].startswith("text/plain")
    samples = _samples(got.text)
    by = {(n, tuple(sorted(lb.items()))): v for n, lb, v in samples}

    def value(name: str, **labels: str) -> float:
        return sum(
            v for (n, lb), v in by.items() if n == name and labels.items() <= dict(lb).items()
        )

    flow = {"workflow": "api-flow", "version": "1.0.0", "stage": "work"}
    assert value("accord_stage_dispatches_total", **flow, capability="test.work@1") == 4
    assert value("accord_stage_outcomes_total", **flow, outcome="succeeded") == 4
    assert value("accord_dispatch_acceptance_seconds_count", **flow) == 4
    assert value("accord_execution_seconds_count", **flow) == 4
    assert value("accord_runs_ended_total", workflow="api-flow", outcome="succeeded") == 4
    fallback = {"workflow": "api-fallback", "stage": "work"}
    assert value("accord_stage_outcomes_total", **fallback, outcome="failed") >= 1, failed_run

    # the label test: names from the bounded set, values declared by the deployment or closed
    forbidden = {*runs, failed_run, *models.values(), "acme", "globex"}
    declared = {
        "api-flow", "api-fallback", "api-idle", "1.0.0", "work", "notify",
        "test.work@1", "test.notify@1", *OUTCOMES, "",
    }  # fmt: skip
    assert samples, "no metrics at all"
    for name, labels, _ in samples:
        assert set(labels) - {"le"} <= LABELS, (name, labels)
        for key, v in labels.items():
            if key == "le":
                continue
            assert v in declared, f"{name}: label {key}={v!r} is not a declared value"
            assert not any(bad in v for bad in forbidden), f"{name}: {key}={v!r} names an id"
    assert not any(bad in got.text for bad in forbidden)

    assert ready.status_code == 200, ready.text
    assert ready.json() == {"status": "ready", "checks": {"store": "ok", "transport": "ok"}}
    assert live.status_code == 200


def test_the_label_guard_refuses_unbounded_labels() -> None:
    m = Metrics("accord-test", env={})
    try:
        with pytest.raises(ValueError, match="'tenant' is not one of"):
            m.add("accord_stage_dispatches", tenant="acme")
        with pytest.raises(ValueError, match="'run_id'"):
            m.record("accord_execution_seconds", 0.1, run_id="run_1")
        assert m.labels(outcome="run_0123456789") == {"outcome": "other"}
        for i in range(MAX_VALUES + 10):
            m.add("accord_stage_dispatches", stage=f"s{i}")
        assert m.labels(stage="a-new-one") == {"stage": "other"}
        text = mx.prometheus_text(m).decode()
        stages = {lb["stage"] for _, lb, _ in _samples(text) if "stage" in lb}
        assert len(stages) == MAX_VALUES + 1 and "other" in stages
    finally:
        m.close()
