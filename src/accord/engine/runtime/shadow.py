"""Shadow runs: replay the recorded inputs of completed runs through a new plan, every effect off.

For each recorded run, :func:`shadow_run` first folds its history through the plans it ran on,
noting every call the machine asked for (stage, capability, bound input) and the outcome each
attempt reported. It then starts the same run — same context, tenant and requester — on the new
plan with the pure machine alone: nothing is published, invoked or stored. Each call the new plan
makes is answered from the recorded outcomes when the same stage called the same capability
(name and version) with the same input, attempt by attempt (so recorded retries replay as
retries, their retry timers fired at their due time); a recorded approval gate's decisions are
given again to the gate of the same name. Any other call is *would dispatch*: it stays
unanswered, and the shadow run goes on only where it does not wait for it. The result is a
:class:`~accord.workflow.shadow.Trace` of each side and their divergences
(:func:`accord.workflow.shadow.compare`).

:func:`shadow` does this for the newest ``runs`` completed runs of the workflow's active version
in a store and returns the :class:`~accord.workflow.shadow.Report`. Given a query
(:func:`parse_where`: the terms of ``accord runs search``, e.g. ``status:failed tenant:acme
since:7d``, ``workflow:NAME@VERSION``; ``key=value`` is read as ``key:value``), it shadows the
newest ``runs`` ended runs of the workflow that match it instead, evaluated on the store's own
records (the run document the search projection would index), so no projection is needed. A
query without ``status`` means ``completed`` and without a version the active one; a query
naming another workflow, a live status or free text is refused with the term named.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from accord.canonical import canonical_json
from accord.engine.machine import apply
from accord.engine.machine.effects import DispatchJob, Effect, InvokeAction, ScheduleTimer
from accord.engine.machine.events import (
    ApprovalDecided,
    Event,
    PoisonReported,
    RunStarted,
    StageFailed,
    StageSucceeded,
    TimerFired,
    event_from_json,
)
from accord.engine.machine.state import RUN_TERMINAL, RunState
from accord.engine.ports import SearchQuery, Store
from accord.engine.runtime.projector import KEYS, parse_query, run_document
from accord.errors import EngineError
from accord.workflow.activation import load_plan
from accord.workflow.plan import Plan
from accord.workflow.shadow import Call, Report, RunReport, Trace, compare

__all__ = ["matches", "parse_where", "shadow", "shadow_run"]

_STEPS = 2_000  # events one shadow run may take (a guard against a plan that loops)
_OUTCOMES = (StageSucceeded, StageFailed, PoisonReported)
JsonDict = dict[str, Any]


def _call(effect: DispatchJob | InvokeAction) -> tuple[Call, int, str]:
    env = effect.envelope
    call = Call(str(env["stage"]), effect.capability, canonical_json(env["payload"]).decode())
    return call, int(env["attempt"]), str(env["fence"])


def _jobs(effects: Sequence[Effect]) -> list[DispatchJob | InvokeAction]:
    return [e for e in effects if isinstance(e, DispatchJob | InvokeAction)]


def _decisions(plan: Plan, run: RunState) -> dict[str, str]:
    out: dict[str, str] = {}
    for edge in run.released:
        source, _, target = edge.partition("->")
        if plan.has_stage(source) and plan.stage(source).type == "decision":
            out[source] = target
    return out


class _Recorded:
    """What a recorded run did: its trace, each call's outcomes by attempt, gate decisions."""

    def __init__(self, plans: Mapping[str, Plan], history: Sequence[JsonDict]) -> None:
        run: RunState | None = None
        calls: list[Call] = []
        by_attempt: dict[tuple[str, int], Call] = {}
        outcomes: dict[Call, list[JsonDict]] = defaultdict(list)
        self.decided: dict[str, list[JsonDict]] = defaultdict(list)
        self.start: RunStarted | None = None
        plan: Plan | None = None
        for entry in history:
            event = event_from_json(entry["event"])
            if isinstance(event, RunStarted):
                self.start = event
            digest = run.plan_digest if run is not None else getattr(event, "plan_digest", "")
            plan = plans.get(digest)
            if plan is None:
                raise EngineError(f"plan {digest} of the recorded run is not stored")
            t = apply(plan, run, event)
            run = t.run
            if not entry["accepted"]:
                continue
            for job in _jobs(t.effects):
                call, attempt, _ = _call(job)
                calls.append(call)
                by_attempt[(call.stage, attempt)] = call
            if isinstance(event, _OUTCOMES):
                made = by_attempt.get((event.stage, event.attempt))
                if made is not None:
                    outcomes[made].append(entry["event"])
            if isinstance(event, ApprovalDecided):
                self.decided[event.stage].append(entry["event"])
        if run is None or plan is None or self.start is None:
            raise EngineError("the recorded run has no history")
        self.run = run
        self.outcomes: Mapping[Call, list[JsonDict]] = outcomes
        self.trace = Trace(
            status=run.status,
            released=frozenset(run.released),
            decisions=_decisions(plan, run),
            calls=tuple(calls),
        )

    def why_not(self, call: Call) -> str:
        same_stage = [c for c in self.outcomes if c.stage == call.stage]
        if not same_stage:
            return "the recorded run never called this stage"
        if all(c.capability != call.capability for c in same_stage):
            was = ", ".join(sorted({c.capability for c in same_stage}))
            return f"the recorded run called {was}"
        return "its input differs from the recorded call's"


def _entropy(run_id: str, n: int) -> str:
    return hashlib.sha256(f"shadow:{run_id}:{n}".encode()).hexdigest()[:32]


def shadow_run(
    new: Plan, plans: Mapping[str, Plan], history: Sequence[JsonDict]
) -> tuple[Trace, Trace]:
    """The recorded trace of one run's ``history`` and the trace of the same run on ``new``."""
    rec = _Recorded(plans, history)
    assert rec.start is not None
    start = dataclasses.replace(
        rec.start,
        plan_digest=new.digest,
        contracts=dict(new.contracts),
        admission={"digest": new.digest, "reason": "shadow"},
    )
    now = start.at_ms
    n = 0
    t = apply(new, None, start)
    run = t.run
    todo = _jobs(t.effects)
    retries: dict[str, ScheduleTimer] = {}
    calls: list[Call] = []
    unanswered: list[tuple[Call, str]] = []
    used: dict[Call, int] = defaultdict(int)
    gates_given: set[str] = set()
    _track(t.effects, retries)

    def step(event: Event) -> None:
        nonlocal run, n, now
        n += 1
        now += 1
        stamped = dataclasses.replace(event, at_ms=now, entropy=_entropy(run.run_id, n))
        tr = apply(new, run, stamped)
        run = tr.run
        _track(tr.effects, retries)
        todo.extend(_jobs(tr.effects))

    while n < _STEPS and not run.terminal:
        if todo:
            job = todo.pop(0)
            call, attempt, fence = _call(job)
            calls.append(call)
            answers = rec.outcomes.get(call)
            if not answers:
                unanswered.append((call, rec.why_not(call)))
                continue
            doc = dict(answers[min(used[call], len(answers) - 1)])
            used[call] += 1
            doc.update(attempt=attempt, fence=fence, at_ms=0, entropy="")
            step(event_from_json(doc))
            continue
        waiting = [
            g for g, s in run.stages.items() if s.status == "waiting" and g not in gates_given
        ]
        if waiting:
            gate = sorted(waiting)[0]
            gates_given.add(gate)
            for doc in rec.decided.get(gate, ()):
                step(event_from_json({**doc, "at_ms": 0, "entropy": ""}))
            continue
        if retries:
            timer = min(retries.values(), key=lambda x: x.due_at_ms)
            del retries[timer.timer_id]
            now = max(now, timer.due_at_ms)
            fired = TimerFired(
                run_id=run.run_id,
                timer=timer.timer,
                timer_id=timer.timer_id,
                stage=timer.stage,
                attempt=timer.attempt,
                fence=timer.fence,
            )
            step(fired)
            continue
        break
    binding = {
        name: str(st.error["code"])
        for name, st in run.stages.items()
        if st.error and str(st.error.get("code", "")).startswith("binding-")
    }
    shadow_trace = Trace(
        status=run.status if run.terminal else "incomplete",
        released=frozenset(run.released),
        decisions=_decisions(new, run),
        calls=tuple(calls),
        unanswered=tuple(unanswered),
        binding_errors=binding,
    )
    return rec.trace, shadow_trace


def _track(effects: Sequence[Effect], retries: dict[str, ScheduleTimer]) -> None:
    for e in effects:
        if isinstance(e, ScheduleTimer) and e.timer == "retry":
            retries[e.timer_id] = e


async def _plans_of(store: Store, history: Sequence[JsonDict], known: dict[str, Plan]) -> None:
    for entry in history:
        event = entry["event"]
        for key in ("plan_digest", "to_digest"):
            digest = event.get(key)
            if isinstance(digest, str) and digest and digest not in known:
                known[digest] = await load_plan(store, digest)


def parse_where(
    text: str, workflow: str, now_ms: int, *, tenants: tuple[str, ...] | None = None
) -> SearchQuery:
    """A shadow query for runs of ``workflow``: ``ValueError`` names the offending term.
    ``tenants`` (when not ``None``) confines it to those tenants, as :func:`parse_query` does."""
    terms = []
    for word in text.split():
        key, eq, value = word.partition("=")
        terms.append(f"{key}:{value}" if eq and ":" not in key and key in KEYS else word)
    query = parse_query(" ".join(terms), now_ms, tenants=tenants, limit=10_000)
    if query.text:
        raise ValueError(f"{query.text.split()[0]!r}: free text is not a shadow query term; "
                         f"known keys: {', '.join(KEYS)}")  # fmt: skip
    if query.workflow and query.workflow != workflow:
        raise ValueError(f"workflow:{query.workflow}: the new plan is a version of {workflow}")
    if query.status and query.status not in RUN_TERMINAL:
        raise ValueError(f"status:{query.status}: only ended runs (completed, failed, cancelled) "
                         "can be shadowed")  # fmt: skip
    return dataclasses.replace(query, workflow=workflow, status=query.status or "completed")


def matches(q: SearchQuery, body: Mapping[str, Any]) -> bool:
    """Whether a run document (:func:`~accord.engine.runtime.projector.run_document`) matches
    ``q``, as the search projection would answer it."""
    if q.tenants is not None and body.get("tenant") not in q.tenants:
        return False
    for key, want in (
        ("workflow", q.workflow), ("status", q.status), ("intent", q.intent),
        ("trigger", q.trigger), ("requester", q.requester), ("run_id", q.run_id),
    ):  # fmt: skip
        if want and body.get(key) != want:
            return False
    if q.version and not (
        body.get("version") == q.version or str(body.get("plan_digest", "")).startswith(q.version)
    ):
        return False
    updated = int(body.get("updated_at_ms") or 0)
    if (q.since_ms is not None and updated < q.since_ms) or (
        q.until_ms is not None and updated > q.until_ms
    ):
        return False
    if q.stage:
        stages = body.get("stages") or {}
        if q.stage_status == "failed":
            return q.stage in (body.get("failed_stages") or [])
        status = (stages.get(q.stage) or {}).get("status")
        if q.stage_status:
            return bool(status == q.stage_status)
        return status not in (None, "pending", "skipped")
    return True


async def shadow(
    store: Store, new: Plan, runs: int, *, where: SearchQuery | None = None, scan: int = 10_000
) -> Report:
    """Shadow the newest ``runs`` completed runs of ``new``'s workflow's active version, or the
    newest ``runs`` that match ``where`` (:func:`parse_where`)."""
    active = await store.get_active(new.name)
    if active is None and (where is None or not where.version):
        raise EngineError(f"{new.name} has no active version to shadow")
    status = where.status if where is not None else "completed"
    rows = await store.list_runs(limit=scan, workflow=new.name, status=status)
    plans: dict[str, Plan] = {new.digest: new}
    chosen: list[tuple[str, list[JsonDict]]] = []
    recorded_digests: set[str] = set()
    for row in rows:
        if len(chosen) >= runs:
            break
        digest = str(row.state.get("plan_digest", ""))
        if where is None or not where.version:
            if digest != active:
                continue
        elif not digest.startswith(where.version) and not await _is_version(
            store, digest, where.version, plans
        ):
            continue
        history = await store.history(row.run_id)
        if where is not None:
            version = (await _plan(store, digest, plans)).version
            if not matches(where, run_document(row, history, version).body):
                continue
        recorded_digests.add(digest)
        chosen.append((row.run_id, history))
    reports: list[RunReport] = []
    for run_id, history in sorted(chosen, key=lambda c: c[0]):
        await _plans_of(store, history, plans)
        recorded, shadowed = shadow_run(new, plans, history)
        divergences = tuple(compare(recorded, shadowed))
        reports.append(RunReport(run_id, recorded.status, shadowed.status, divergences))
    recorded_digest = active or ""
    if where is not None and where.version:
        recorded_digest = ", ".join(sorted(recorded_digests)) or where.version
    return Report(new.name, recorded_digest, new.digest, tuple(reports))


async def _plan(store: Store, digest: str, known: dict[str, Plan]) -> Plan:
    if digest not in known:
        known[digest] = await load_plan(store, digest)
    return known[digest]


async def _is_version(store: Store, digest: str, version: str, known: dict[str, Plan]) -> bool:
    return bool(digest) and (await _plan(store, digest, known)).version == version
