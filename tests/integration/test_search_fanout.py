"""The telemetry fan-out: the projector is a required sink (its failure keeps the batch in the
outbox), span builders are best-effort ones (their failure is logged and counted)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from accord.adapters import open_store
from accord.adapters.projection import open_projection
from accord.adapters.telemetry import FanoutSink
from accord.engine.ports import JsonValue
from accord.engine.runtime.projector import Projector
from accord.errors import StoreError
from accord.testing.clock import FakeClock
from accord.testing.harness import EngineHarness
from accord.testing.plans import model_ingest_shape


class Broken:
    """A sink whose backend is gone."""

    def __init__(self) -> None:
        self.calls = 0

    async def emit(self, events: Sequence[Mapping[str, JsonValue]]) -> None:
        self.calls += 1
        raise StoreError("backend gone", retryable=True)


async def test_a_best_effort_failure_does_not_hold_the_projection(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    fan = FanoutSink()
    store = open_store(f"sqlite:///{tmp_path}/runs.db", clock=clock)
    projection = open_projection(f"sqlite:///{tmp_path}/runs.projection.db")
    async with EngineHarness(clock=clock, store=store, sink=fan) as h:
        spans = Broken()
        fan.register("spans", spans)
        fan.register("projection", Projector(h.store, projection, clock), required=True)
        with pytest.raises(ValueError, match="registered already"):
            fan.register("spans", spans)
        await h.register(model_ingest_shape(name="model-ingest"))
        run = await h.start_run("model-ingest", {"modelId": "m1"}, tenant="acme")
        events = [dict(e.payload) for e in await h.outbox() if e.topic == "telemetry"]
        with caplog.at_level("WARNING", logger="accord.adapters.telemetry"):
            await fan.emit(events)
        assert await projection.get(run) is not None
        assert fan.failures() == {"spans": 1, "projection": 0}
        assert "telemetry sink spans failed" in caplog.text

        required = FanoutSink()
        required.register("projection", Broken(), required=True)
        later = Broken()
        required.register("spans", later)
        with pytest.raises(StoreError, match="backend gone"):
            await required.emit(events)
        assert later.calls == 1  # the others had their turn first
    await projection.close()
