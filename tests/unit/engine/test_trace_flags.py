"""The engine's trace-sampling decision, recorded on the run at start, is the sampled bit of every
job's ``traceparent`` (docs/observability.md, "Sampling"): pure, replayed exactly, and absent from
the records of sampled runs (so earlier records and golden fixtures keep their form)."""

from __future__ import annotations

from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

from accord.engine.machine import ids
from accord.engine.machine.effects import DispatchJob
from accord.engine.machine.envelope import rebuild_effect
from accord.engine.machine.events import RunStarted, event_to_json
from accord.engine.machine.replay import replay
from accord.engine.machine.state import RunState
from tests.unit.engine import plans
from tests.unit.engine.sim import Sim


def _sim(sampled: bool) -> Sim:
    sim = Sim(plans.model_ingest())
    sim.apply(RunStarted(run_id=sim.run_id, tenant="acme", workflow=sim.plan.name,
                         plan_digest=sim.plan.digest, context={"modelId": "m-1"},
                         sampled=sampled))  # fmt: skip
    sim.succeed("cache-lookup", {"hit": False})
    return sim


def test_a_dropped_run_s_jobs_say_00_and_a_kept_run_s_say_01() -> None:
    for sampled, flags in ((True, "-01"), (False, "-00")):
        sim = _sim(sampled)
        (job,) = [e for e in sim.dispatched if isinstance(e, DispatchJob)]
        tp = job.envelope["traceparent"]
        assert tp == ids.traceparent("run-1", "render-thumbnail", 1, sampled) and tp.endswith(flags)
        assert tp[:-3] == ids.traceparent("run-1", "render-thumbnail", 1)[:-3]  # same ids
        assert sim.state.sampled is sampled
        rebuilt = rebuild_effect(sim.plan, sim.state, "render-thumbnail")
        assert rebuilt is not None and rebuilt.envelope == job.envelope  # identical re-publish
        again = replay(sim.plan, sim.history)
        assert again is not None and again.canonical_text() == sim.state.canonical_text()
        assert RunState.from_json(sim.state.to_json()) == sim.state


def test_the_flag_is_written_only_when_the_run_is_dropped() -> None:
    kept, dropped = _sim(True), _sim(False)
    assert "sampled" not in kept.history[0].event and "sampled" not in kept.state.to_json()
    assert dropped.history[0].event["sampled"] is False
    assert dropped.state.to_json()["sampled"] is False
    start = RunStarted(run_id="r", tenant="t", workflow="w", plan_digest="d")
    assert "sampled" not in event_to_json(start)


def test_the_decision_is_the_sdks_trace_id_ratio_test() -> None:
    for ratio in (0.0, 0.1, 0.5, 0.9, 1.0):
        bound = TraceIdRatioBased.get_bound_for_rate(ratio)
        for n in range(200):
            run_id = f"run-{n}"
            trace_id = int(ids.traceparent(run_id, "", 0).split("-")[1], 16)
            want = trace_id & TraceIdRatioBased.TRACE_ID_LIMIT < bound
            assert ids.trace_sampled(run_id, ratio) is want, (run_id, ratio)
