"""Run migration: the transition that moves a live run to another plan version.

:class:`~accord.engine.machine.events.RunMigrated` is applied with the plan the run is pinned to
(``from_digest``); it re-pins the run to ``to_digest`` and renames, adds and drops stage records
by the map the event carries. The shell proves the move safe first
(:func:`accord.workflow.migration.check_run`) and records the decision — who, why, from, to and
the map — as the event itself, so replaying the history needs nothing but the history and the
plans it names (:func:`accord.engine.machine.replay.replay_across`).

The machine re-checks what it can see without the new plan, and refuses (recorded, changing
nothing but ``seq``):

- ``late`` — the run has ended or has a terminal intent (its compensations and finalisers belong
  to the version that set the intent);
- ``invalid`` — the run is not pinned to ``from_digest``, the shell's proof found ``problems``
  (:mod:`accord.workflow.migration` refusals, recorded here), ``to_digest`` is the same version, a
  renamed, removed or retyped stage is not a stage of the run, a stage with live work (queued,
  running, retry-scheduled, waiting) would be renamed, removed or retyped (its callbacks and
  timers name it), or an added name collides with a stage the run keeps.

An accepted migration changes no status and dispatches nothing: live attempts keep their stage,
attempt and fence, so their callbacks and timers are judged by the new plan from the next event
on. Released edges, completion order, join arrivals and branch states follow the renames; a
removed stage leaves the completion order (there is nothing left to compensate it with). The run
deadline stays as armed at the start.
"""

from __future__ import annotations

from collections.abc import Mapping

from accord.engine.machine.draft import Draft
from accord.engine.machine.events import RunMigrated
from accord.engine.machine.outcomes import Refusal
from accord.engine.machine.state import (
    ACTIVE_STAGE,
    WAITING,
    StageState,
    evolve,
)

__all__ = ["LIVE", "on_migrated"]

LIVE = ACTIVE_STAGE | {WAITING}  # a stage with work that names it: attempts, timers, a gate


def _pseudo(name: str) -> bool:
    return name.startswith("@")


def _check(d: Draft, ev: RunMigrated) -> Refusal | None:
    run = d.base
    if run.terminal or d.intent is not None:
        return Refusal("late", f"run is {run.status} with intent {d.intent}: it cannot move")
    if ev.from_digest != run.plan_digest:
        return Refusal("invalid", f"run is pinned to {run.plan_digest}, not {ev.from_digest}")
    if ev.problems:
        return Refusal("invalid", "; ".join(ev.problems))
    if ev.to_digest == run.plan_digest:
        return Refusal("invalid", "the run is already on that version")
    touched = [*ev.renamed, *ev.removed, *ev.retyped]
    for name in touched:
        st = d.stages.get(name)
        if st is None or _pseudo(name):
            return Refusal("invalid", f"{name!r} is not a stage of the run")
        if st.status in LIVE:
            return Refusal("invalid", f"stage {name!r} is {st.status}: moving it strands its work")
    kept = [n for n in d.stages if n not in ev.removed]
    after = {ev.renamed.get(n, n) for n in kept}
    if len(after) != len(kept):
        return Refusal("invalid", "two stages would share one name after the renames")
    clash = sorted(after & set(ev.added))
    if clash:
        return Refusal("invalid", f"added stage {clash[0]!r} is a stage the run keeps")
    return None


def _edge(edge: str, renamed: Mapping[str, str]) -> str:
    source, _, target = edge.partition("->")
    return f"{renamed.get(source, source)}->{renamed.get(target, target)}"


def on_migrated(d: Draft, ev: RunMigrated) -> Refusal | None:
    refusal = _check(d, ev)
    if refusal is not None:
        return refusal
    rn = ev.renamed
    stages: dict[str, StageState] = {}
    for name, old in d.stages.items():
        if name in ev.removed:
            continue
        new = rn.get(name, name)
        st = old if new == name else evolve(old, name=new)
        if name in ev.retyped:
            st = evolve(st, kind=ev.retyped[name])
        stages[new] = st
    for name, kind in ev.added.items():
        stages[name] = StageState(name=name, kind=kind)
    d.stages = stages
    d.released = [_edge(e, rn) for e in d.released]
    d.completion_order = tuple(rn.get(n, n) for n in d.completion_order if n not in ev.removed)
    d.join_arrivals = {
        rn.get(j, j): tuple(rn.get(b, b) for b in arrived)
        for j, arrived in d.join_arrivals.items()
        if j not in ev.removed
    }
    d.branch_states = {rn.get(b, b): s for b, s in d.branch_states.items() if b not in ev.removed}
    contracts = dict(ev.contracts) if ev.contracts else d.base.contracts
    d.base = evolve(d.base, plan_digest=ev.to_digest, contracts=contracts)
    d.notes.append(f"migrated from {ev.from_digest} to {ev.to_digest} by {ev.by}")
    d.telemetry(
        "run.migrated",
        fromDigest=ev.from_digest,
        toDigest=ev.to_digest,
        version=ev.to_version,
        by=ev.by,
    )
    return None
