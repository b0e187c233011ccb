"""The kept canonical text of a run record is always exactly ``canonical_json(to_json())``.

Stage records keep their canonical text once computed and :func:`evolve` must drop it from the
copy it changes; random event streams (the same moves as the property suite) check that no stale
text ever survives a transition, a reload from JSON, or a context with awkward keys.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accord.canonical import canonical_json
from accord.engine.machine.encoding import EncodedDoc
from accord.engine.machine.state import RunState, evolve
from tests.unit.engine.sim import Sim
from tests.unit.engine.test_properties import BUILT, PLANS, _step, moves


def _check(run: RunState) -> None:
    expected = canonical_json(run.to_json()).decode("utf-8")
    assert run.canonical_text() == expected
    doc = run.encoded()
    assert isinstance(doc, EncodedDoc) and doc == run.to_json() and doc.canonical == expected


contexts = st.dictionaries(
    st.text(max_size=6), st.one_of(st.integers(), st.text(max_size=8), st.none()), max_size=4
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(PLANS)), steps=moves, seed=st.integers(0, 2**16), ctx=contexts)
def test_kept_text_matches_a_fresh_encoding_after_every_transition(
    name: str, steps: list[tuple[str, int, bool]], seed: int, ctx: dict[str, object]
) -> None:
    sim = Sim(BUILT[name], seed=seed)
    sim.start(modelId="m-1", **{f"k{k}": v for k, v in ctx.items()})
    _check(sim.state)
    for op, pick, flag in steps:
        _step(sim, op, pick, flag)
        _check(sim.state)


def test_evolve_drops_the_kept_text_of_the_record_it_copies() -> None:
    sim = Sim(BUILT[sorted(PLANS)[0]], seed=1)
    sim.start(modelId="m-1")
    name, stage = next(iter(sim.state.stages.items()))
    before = stage.canonical_text()
    changed = evolve(stage, status="running" if stage.status != "running" else "queued")
    assert changed.canonical_text() != before
    assert changed.canonical_text() == canonical_json(changed.to_json()).decode("utf-8")
    assert stage.canonical_text() == before  # the original keeps its own
    reloaded = RunState.from_json(json.loads(sim.state.canonical_text()))
    assert reloaded == sim.state and reloaded.canonical_text() == sim.state.canonical_text()
    assert name in reloaded.stages


def test_context_text_is_encoded_once_per_run_and_again_only_for_a_new_context() -> None:
    sim = Sim(BUILT[sorted(PLANS)[0]], seed=3)
    sim.start(modelId="m-1", big={f"k{i}": "v" * 20 for i in range(200)})
    run = sim.state
    _check(run)
    later = evolve(run, seq=run.seq + 1)
    kept = run.__dict__["_canonical_kept"]
    _check(later)
    assert later.__dict__["_canonical_kept"] is kept  # shared, not encoded again
    changed = evolve(run, context={"modelId": "m-2"})  # a new object: encoded afresh
    _check(changed)
    assert changed.__dict__["_canonical_kept"] is not kept
    assert '"context":{"modelId":"m-2"}' in changed.canonical_text()
