"""Reports that arrive after a run ended reach the search projection without a rebuild.

A real engine (SQLite store and embedded queue, its dispatcher's telemetry loop feeding the
projector as ``accord engine run`` wires it) runs a model-ingest-shaped run to ``completed``. Then
a late result for one of its stages (refused ``late``: the machine writes a ``callback.rejected``
event) and a duplicate of the run's start (refused ``duplicate``: a commit with no telemetry
event at all, which the projector learns of as an engine observer) are committed. Each must show
in the run's document — its refusal counts, the store version it was read at — while the run's
end and duration stay those of its last accepted entry, and ``verify`` must find the projection
equal to documents built from the store.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from accord.adapters import open_engine
from accord.cli.telemetry import projection_for
from accord.engine.machine.events import StageAccepted, StageSucceeded
from accord.engine.ports import Document, Projection
from accord.engine.runtime.orchestrator import Delivered, EngineOptions
from accord.engine.runtime.projector import verify
from accord.testing.plans import model_ingest_shape

STAGES = ("render", "analyse", "metadata", "publish")


async def _until(
    projection: Projection, run_id: str, ok: Callable[[Document], bool], timeout_s: float = 10
) -> Document:
    deadline = time.monotonic() + timeout_s
    doc = await projection.get(run_id)
    while (doc is None or not ok(doc)) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        doc = await projection.get(run_id)
    assert doc is not None and ok(doc), doc and doc.body
    return doc


async def test_late_and_duplicate_reports_after_the_end_reach_the_projection(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'accord.db'}"
    search = projection_for(None, url)
    assert search.projection is not None
    engine = open_engine(url, url, sink=search.sink,
                         options=EngineOptions(poll_ms=10, grace_ms=0))  # fmt: skip
    projector = search.attach(engine)
    assert projector is not None
    jobs: dict[str, dict[str, Any]] = {}

    def envelopes(done: Delivered) -> None:
        for effect in done.effects:
            envelope = getattr(effect, "envelope", None)
            if envelope:
                jobs[str(envelope["stage"])] = envelope

    engine.observers.append(envelopes)
    await engine.register_plan(model_ingest_shape(name="model-ingest"))
    await engine.start()
    try:
        run_id = await engine.start_run("model-ingest", {"modelId": "m1"}, "acme", "run_late1")
        for stage in STAGES:
            async with asyncio.timeout(10):
                while stage not in jobs:
                    await asyncio.sleep(0.01)
            env = jobs[stage]
            ident = {"run_id": run_id, "stage": stage, "attempt": env["attempt"],
                     "fence": env["fence"]}  # fmt: skip
            await engine.deliver(StageAccepted(**ident))
            await engine.deliver(StageSucceeded(**ident, result={"ok": True}))
        ended = await _until(search.projection, run_id, lambda d: d.body["status"] == "completed")
        assert ended.body["counts"]["late"] == 0 and ended.body["ended_at_ms"] is not None

        render = jobs["render"]
        late = await engine.deliver(StageSucceeded(
            run_id=run_id, stage="render", attempt=render["attempt"], fence=render["fence"],
            result={"ok": True}, at_ms=engine.clock.now_ms() + 5,
        ))  # fmt: skip
        assert late.history[0].reason == "late"
        after_late = await _until(search.projection, run_id, lambda d: d.seq == late.version)
        assert after_late.body["counts"]["late"] == 1

        again = await engine.start_run("model-ingest", {"modelId": "m1"}, "acme", "run_late1")
        assert again == run_id
        stored = await engine.store.load(run_id)
        assert stored is not None and stored.version == late.version + 1
        history = await engine.store.history(run_id)
        assert (history[-1]["accepted"], history[-1]["reason"]) == (False, "duplicate")
        doc = await _until(search.projection, run_id, lambda d: d.seq == stored.version)
        assert doc.body["counts"]["duplicate"] == 1 and doc.body["counts"]["late"] == 1
        assert doc.body["status"] == "completed"
        # the end is the last accepted entry's: later refusals do not move it
        assert doc.body["ended_at_ms"] == ended.body["ended_at_ms"]
        assert doc.body["duration_ms"] == ended.body["duration_ms"]
        assert doc.body["updated_at_ms"] >= doc.body["ended_at_ms"]
        checked, divergences = await verify(engine.store, projector)
        assert (checked, divergences) == (1, [])
    finally:
        await engine.stop()
        await search.close()
