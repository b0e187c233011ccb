"""Invariant checks over a run's durable record and history (docs/reliability.md, I1–I7, I12).

Each check is named after the invariant it shows and raises ``AssertionError`` with the run and
the offending detail. They read only what the store holds (the record and its history) and,
where given, the effects the shell observed, so they hold for any store and any interleaving:
the stateful test calls them after every step, the crash tests after every restart.

The history is folded again step by step with the pure machine, which shows I12 (the fold ends
at the stored record) and gives every intermediate record, so I3 (the version only grows, a
fenced callback changes nothing) and I5 (nothing ordinary accepted after the intent) are checked
at the moment each event was applied, not just at the end.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from accord.engine.machine import apply
from accord.engine.machine.effects import DispatchJob, Effect, InvokeAction
from accord.engine.machine.events import event_from_json
from accord.engine.machine.state import ACTIVE_ATTEMPT, HistoryEntry, RunState
from accord.workflow.plan import Plan

__all__ = [
    "RunAuditor",
    "assert_i1_terminal",
    "assert_i2_one_effective_completion",
    "assert_i3_fencing",
    "assert_i4_no_double_release",
    "assert_i5_nothing_after_intent",
    "assert_i6_deadlines",
    "assert_i12_replay",
    "assert_run_invariants",
]

_CALLBACKS = {"stage-accepted", "heartbeat", "progress", "stage-succeeded", "stage-failed"}


def _fold(plan: Plan, history: Sequence[HistoryEntry]) -> list[RunState]:
    states: list[RunState] = []
    run: RunState | None = None
    for entry in history:
        run = apply(plan, run, event_from_json(entry.event)).run
        states.append(run)
    return states


def assert_i12_replay(plan: Plan, run: RunState, history: Sequence[HistoryEntry]) -> None:
    states = _fold(plan, history)
    assert states, f"I12: run {run.run_id} has a record but no history"
    assert states[-1] == run, f"I12: replaying run {run.run_id} does not reproduce its record"


def assert_i3_fencing(plan: Plan, run: RunState, history: Sequence[HistoryEntry]) -> None:
    seqs = [h.seq for h in history]
    assert seqs == list(range(1, len(seqs) + 1)), f"I3: run {run.run_id} seqs not growing: {seqs}"
    fences = [a.fence for s in run.stages.values() for a in s.attempts]
    dupes = [f for f, n in Counter(fences).items() if n > 1]
    assert not dupes, f"I3: run {run.run_id} issued fence(s) twice: {dupes}"
    states = _fold(plan, history)
    for before, after, entry in zip(states, states[1:], history[1:], strict=False):
        if not entry.accepted:
            same = after.to_json() | {"seq": before.seq}
            assert same == before.to_json(), (
                f"I3: refused event #{entry.seq} ({entry.reason}) changed run {run.run_id}"
            )


def assert_i2_one_effective_completion(run: RunState, history: Sequence[HistoryEntry]) -> None:
    done = Counter(
        (h.event.get("stage"), h.event.get("attempt"))
        for h in history
        if h.accepted and h.event.get("kind") == "stage-succeeded"
    )
    twice = [k for k, n in done.items() if n > 1]
    assert not twice, f"I2: run {run.run_id} accepted a completion twice for {twice}"


def assert_i4_no_double_release(run: RunState, effects: Iterable[Effect] = ()) -> None:
    twice = [e for e, n in Counter(run.released).items() if n > 1]
    assert not twice, f"I4: run {run.run_id} released edge(s) twice: {twice}"
    jobs = Counter(e.job_id for e in effects if isinstance(e, DispatchJob | InvokeAction))
    again = [j for j, n in jobs.items() if n > 1]
    assert not again, f"I4: run {run.run_id} dispatched job(s) twice: {again}"


def assert_i5_nothing_after_intent(plan: Plan, history: Sequence[HistoryEntry]) -> None:
    states = _fold(plan, history)
    for before, entry in zip(states, history[1:], strict=False):
        stage = str(entry.event.get("stage", ""))
        if before.intent is None or stage.startswith("@") or not entry.accepted:
            continue
        kind = entry.event.get("kind")
        assert kind not in _CALLBACKS, (
            f"I5: run {before.run_id} accepted {kind} for {stage!r} after intent {before.intent}"
        )


def assert_i6_deadlines(run: RunState) -> None:
    for stage in run.stages.values():
        cur = stage.current
        if cur is not None and cur.status in ACTIVE_ATTEMPT:
            assert cur.deadline_at_ms is not None, (
                f"I6: run {run.run_id} stage {stage.name!r} attempt {cur.attempt} has no deadline"
            )


def assert_i1_terminal(run: RunState) -> None:
    assert run.terminal, f"I1: run {run.run_id} is {run.status} (intent {run.intent}) after drain"


def assert_run_invariants(
    plan: Plan, run: RunState, history: Sequence[HistoryEntry], effects: Iterable[Effect] = ()
) -> None:
    """Every per-run invariant that must hold at any moment (not I1, which needs a drain)."""
    assert_i12_replay(plan, run, history)
    assert_i3_fencing(plan, run, history)
    assert_i2_one_effective_completion(run, history)
    assert_i4_no_double_release(run, effects)
    assert_i5_nothing_after_intent(plan, history)
    assert_i6_deadlines(run)


class RunAuditor:
    """Checks one run incrementally: each call folds only the history entries it has not seen,
    so calling it after every step of a long scenario costs one ``apply`` per event in total.

    After every call: the fold equals the stored record (I12), ``seq`` grows by one per entry
    (I3), a refused entry changed nothing but ``seq`` (I3), no ordinary callback was accepted
    after the intent (I5), no completion was accepted twice (I2), no edge released twice (I4),
    no fence issued twice (I3), and every live attempt has a deadline (I6).
    """

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.shadow: RunState | None = None
        self.seen = 0
        self._completions: set[tuple[object, object]] = set()

    def observe(self, run: RunState, history: Sequence[HistoryEntry]) -> None:
        for entry in history[self.seen :]:
            before = self.shadow
            after = apply(self.plan, before, event_from_json(entry.event)).run
            assert entry.seq == self.seen + 1, f"I3: run {run.run_id} seq {entry.seq} out of order"
            if before is not None and not entry.accepted:
                assert after.to_json() | {"seq": before.seq} == before.to_json(), (
                    f"I3: refused #{entry.seq} ({entry.reason}) changed run {run.run_id}"
                )
            kind, stage = entry.event.get("kind"), str(entry.event.get("stage", ""))
            if before is not None and before.intent is not None and entry.accepted:
                assert kind not in _CALLBACKS or stage.startswith("@"), (
                    f"I5: run {run.run_id} accepted {kind} for {stage!r} after the intent"
                )
            if kind == "stage-succeeded" and entry.accepted:
                key = (stage, entry.event.get("attempt"))
                assert key not in self._completions, f"I2: {run.run_id} completed {key} twice"
                self._completions.add(key)
            self.shadow, self.seen = after, self.seen + 1
        assert self.shadow == run, f"I12: replay of run {run.run_id} differs from its record"
        assert_i4_no_double_release(run)
        fences = [a.fence for s in run.stages.values() for a in s.attempts]
        assert len(fences) == len(set(fences)), f"I3: run {run.run_id} reissued a fence"
        assert_i6_deadlines(run)
