"""Random event streams: duplicates, stale fences, reorderings, timer firings, poison, cancels
and re-drives. The simulator checks I2–I7 and growing versions after every step; here we add
replay (I12) and that draining what is left always ends the run (I1)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from accord.canonical import canonical_json
from accord.engine.machine.events import (
    CancelRequested,
    ProgressReported,
    RedriveRequested,
    StageSucceeded,
)
from accord.engine.machine.replay import replay_across
from accord.engine.machine.state import RunState
from accord.workflow.plan import Plan, RetryPolicy, Timeouts
from tests.unit.engine import invariants as inv
from tests.unit.engine import plans
from tests.unit.engine.migration_plans import QUALITY, migrate, renamed, with_quality_check
from tests.unit.engine.sim import Sim

REDRIVABLE = ("failed", "timed-out", "quarantined", "cancelled")
OPS = (
    "succeed", "succeed", "succeed", "fail", "accept", "heartbeat", "duplicate", "duplicate",
    "stale", "timer", "timer", "poison", "cancel", "redrive", "wait", "progress", "reload",
    "approve", "reject", "decide",
)  # fmt: skip
# who decides a gate in "decide": eligible or not, by role, tenant and being the requester
DECIDERS = (
    ("key:approver", "operator", ("acme",)),
    ("key:other", "admin", ("acme", "beta")),
    ("key:requester", "admin", ("acme",)),
    ("key:viewer", "viewer", ("acme",)),
    ("key:outsider", "operator", ("beta",)),
)


def _heartbeat_linear() -> Plan:
    retry = RetryPolicy(max_attempts=3, initial_backoff_ms=100, retry_on=("retryable", "timeout"))
    return plans.linear(retry=retry, timeouts=Timeouts(1_000, 5_000, 500), deadline_ms=60_000)


PLANS: dict[str, Callable[[], Plan]] = {**plans.ALL_PLANS, "heartbeat-linear": _heartbeat_linear}
BUILT = {name: build() for name, build in PLANS.items()}

moves = st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 1_000), st.booleans()), max_size=50)


def _step(sim: Sim, op: str, pick: int, flag: bool) -> None:
    live = sim.live()
    target = live[pick % len(live)] if live else None
    if op == "succeed" and target:
        sim.succeed(target, {"hit": flag, "uri": "s3://m"} if flag or pick % 3 else {"hit": False})
    elif op == "fail" and target:
        sim.fail(target, retryable=flag, code="retryable" if flag else "terminal")
    elif op == "accept" and target:
        sim.accept(target)
    elif op == "heartbeat" and target:
        sim.heartbeat(target)
    elif op == "progress" and target:
        sim.apply(ProgressReported(**sim.ident(target), progress=(pick % 11) / 10))
    elif op == "poison" and target:
        sim.poison(target, count=pick % 9)
    elif op == "duplicate" and sim.callbacks:
        sim.apply(sim.callbacks[pick % len(sim.callbacks)])
    elif op == "stale" and sim.callbacks:
        old = sim.callbacks[pick % len(sim.callbacks)]
        forged = StageSucceeded(
            run_id=old.run_id, stage=old.stage, attempt=old.attempt, fence=old.fence[::-1],  # type: ignore[union-attr]
            result={"forged": True},
        )  # fmt: skip
        sim.apply(forged if flag else dataclasses.replace(old, at_ms=0, entropy=""))
    elif op == "timer" and sim.all_timers:
        sim.fire(sim.all_timers[pick % len(sim.all_timers)])
    elif op == "cancel" and pick % 4 == 0:
        sim.apply(CancelRequested(run_id=sim.run_id, reason="property"))
    elif op == "redrive":
        failed = [n for n, s in sim.state.stages.items() if s.status in REDRIVABLE]
        names = sorted(failed if flag and failed else sim.state.stages)
        sim.apply(RedriveRequested(run_id=sim.run_id, stage=names[pick % len(names)]))
    elif op in ("approve", "reject") and sim.waiting():
        gates = sim.waiting()
        sim.decide(gates[pick % len(gates)], op, by=f"key:p{pick % 3}")
    elif op == "decide":
        by, role, tenants = DECIDERS[pick % len(DECIDERS)]
        gates = sorted(n for n, s in sim.plan._index.items() if s.type == "approval") or ["a"]
        sim.decide(gates[pick % len(gates)], "approve" if flag else "reject", by=by, role=role,
                   tenants=tenants)  # fmt: skip
    elif op == "wait":
        sim.now += pick * 7
    elif op == "reload":  # the shell crashed: the record comes back from the store as JSON
        sim.run = RunState.from_json(json.loads(canonical_json(sim.state.to_json())))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(PLANS)), steps=moves, seed=st.integers(0, 2**16))
def test_random_event_streams_keep_every_invariant_and_replay_exactly(
    name: str, steps: list[tuple[str, int, bool]], seed: int
) -> None:
    sim = Sim(BUILT[name], seed=seed)
    sim.start(modelId="m-1")
    for op, pick, flag in steps:
        _step(sim, op, pick, flag)
    inv.assert_i12_replay(sim.plan, sim.history, sim.state)
    for h in sim.history:
        event(f"{h.event['kind']}: {h.reason or 'accepted'}")
    run = sim.drain(results={"cache-lookup": {"hit": False}, "first": {"uri": "s3://m"}}, limit=200)
    inv.assert_i1_terminal(run)
    inv.assert_i12_replay(sim.plan, sim.history, run)
    event(f"ended {run.status}")


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(PLANS)), hit=st.booleans(), seed=st.integers(0, 2**16))
def test_drain_delivering_happy_outcomes_ends_completed(name: str, hit: bool, seed: int) -> None:
    sim = Sim(BUILT[name], seed=seed)
    sim.start(modelId="m-1")
    run = sim.drain(results={"cache-lookup": {"hit": hit}, "first": {"uri": "s3://m"}})
    inv.assert_i1_terminal(run)
    assert run.status == "completed" and run.intent == "completed"
    assert all(f == "completed" for f in run.finalisers)
    assert len(run.finalisers) == len(sim.plan.finalisers)


FAILURE_OPS = (
    "fail",
    "poison",
    "redrive",
    "redrive",
    "succeed",
    "timer",
    "duplicate",
    "stale",
    "reload",
)
FAILURE_PLANS = ("fallback", "tolerant-fork", "heartbeat-linear", "saga")


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(FAILURE_PLANS),
    steps=st.lists(st.tuples(st.sampled_from(FAILURE_OPS), st.integers(0, 1_000)), max_size=50),
    seed=st.integers(0, 2**16),
)
def test_failures_poison_and_redrives_keep_every_invariant(
    name: str, steps: list[tuple[str, int]], seed: int
) -> None:
    sim = Sim(BUILT[name], seed=seed)
    sim.start(modelId="m-1")
    for op, pick in steps:
        _step(sim, op, pick, True)
    inv.assert_i12_replay(sim.plan, sim.history, sim.state)
    run = sim.drain(limit=200)
    inv.assert_i1_terminal(run)
    inv.assert_i12_replay(sim.plan, sim.history, run)
    redrives = [h for h in sim.history if h.accepted and h.event["kind"] == "redrive-requested"]
    event(f"re-drives accepted: {len(redrives)}")


# plans with migrations: (from, to, explicit renames); the run moves to ``to`` at a random step
# when the proof allows it (a refused move is recorded), and keeps every invariant either way
_MI = plans.model_ingest()
_GATED = plans.gated()
MIGRATIONS: dict[str, tuple[Plan, Plan, dict[str, str]]] = {
    "model-ingest+stage": (_MI, with_quality_check(_MI), {}),
    "model-ingest+rename": (
        _MI,
        renamed(_MI, "render-thumbnail", "render"),
        {"render-thumbnail": "render"},
    ),
    "model-ingest+unmapped-rename": (_MI, renamed(_MI, "technical-metadata", "tech"), {}),
    "saga+rename": (plans.saga(), renamed(plans.saga(), "ship", "dispatch"), {"ship": "dispatch"}),
    "gated+rename": (_GATED, renamed(_GATED, "a", "first"), {"a": "first"}),
}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(MIGRATIONS)),
    steps=moves,
    at=st.integers(0, 50),
    seed=st.integers(0, 2**16),
)
def test_random_streams_with_a_migration_keep_every_invariant_and_replay_exactly(
    name: str, steps: list[tuple[str, int, bool]], at: int, seed: int
) -> None:
    old, new, renames = MIGRATIONS[name]
    sim = Sim(old, seed=seed)
    sim.start(modelId="m-1")
    moved = False
    when = at % (len(steps) + 1)  # the move is always tried, before any step or after the last
    for i, (op, pick, flag) in enumerate([*steps, ("wait", 0, False)]):
        if i == when:
            tr = migrate(sim, new, renames)
            moved = tr.history[0].accepted
            event(f"migration: {tr.history[0].reason or 'accepted'}")
        _step(sim, op, pick, flag)
    both = {old.digest: old, new.digest: new}
    stored = [json.loads(canonical_json(h.to_json())) for h in sim.history]
    assert replay_across(both, stored) == sim.state
    results = {"cache-lookup": {"hit": False}, "first": {"uri": "s3://m"}, QUALITY: {"score": 1}}
    run = sim.drain(results=results, limit=200)
    inv.assert_i1_terminal(run)
    stored = [json.loads(canonical_json(h.to_json())) for h in sim.history]
    assert replay_across(both, stored) == run
    assert run.plan_digest == (new.digest if moved else old.digest)
    event(f"ended {run.status} on {'new' if moved else 'old'}")
