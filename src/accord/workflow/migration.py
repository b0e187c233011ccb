"""Governed run migration: the map between two plan versions, and when a run may move along it.

Pure functions over compiled plans and a run's recorded state (as its JSON document); no I/O.

**The map.** :func:`migration_map` pairs the stages of two plans of one workflow: a stage is
*kept* when the new plan has a stage of the same name, *renamed* when an explicit
``old=new`` entry says so (the only way a name changes: stage names are never guessed), *added*
when only the new plan has it, and *removed* when only the old one does. A map entry that names
a stage either plan lacks, or two entries that share a target, are refused
(:class:`MigrationError`, ``migration-bad-map``); so are plans of different workflows
(``migration-wrong-workflow``).

**The proof.** :func:`check_run` decides whether one run may move along the map. Each refusal
names its code and the stage it is about:

- ``migration-run-ended`` — the run has ended or has a terminal intent;
- ``migration-wrong-plan`` — the run is not pinned to the map's old plan;
- ``migration-strands-attempt`` — a stage with live work (queued, running, retry-scheduled, a
  waiting gate) is removed or renamed (its callbacks and timers name it), changes type, or is
  pinned to another capability (the worker already holds the old request);
- ``migration-removes-read-result`` — a stage the migrated run will still run reads
  ``stages[R].result`` where the run holds no result of ``R`` and ``R`` can no longer run (it was
  removed, or the new plan adds it behind the run's live work);
- ``migration-contract-incompatible`` — a stage whose result the run holds or awaits is pinned to
  a result contract the old result does not satisfy (:func:`accord.contracts.compat.diff` not
  backward compatible: the new plan reads what the old contract wrote), likewise the context
  contract; without both contracts in the catalog the change cannot be proved and is refused;
- ``migration-no-equivalent-state`` — a stage that has run changes type, a fork that released
  its branches has different branches or another join in the new plan, a join that is gathering
  branches requires different ones, or a completed stage that declares a compensation is
  removed (the failure path of the new version could not undo it).

A run that passes becomes a :class:`~accord.engine.machine.events.RunMigrated` event built from
:func:`event_fields`: the shell records it with who and why, and the machine re-pins the run.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from accord.contracts.compat import diff
from accord.contracts.model import MessageContract
from accord.errors import AccordError
from accord.workflow.cel_refs import scan
from accord.workflow.plan import (
    Binding,
    DecisionStage,
    ForkStage,
    JoinStage,
    Plan,
    Stage,
    TaskStage,
)

__all__ = [
    "LIVE",
    "MessageLookup",
    "MigrationError",
    "MigrationMap",
    "Refusal",
    "check_run",
    "event_fields",
    "migration_map",
    "parse_map",
]

LIVE = frozenset({"queued", "running", "retry-scheduled", "waiting"})
_EDGES = (
    "on_success",
    "on_failure",
    "on_evaluation_error",
    "on_approve",
    "on_reject",
    "on_timeout",
)


class MessageLookup(Protocol):
    """What the proof needs of a contract catalog."""

    def message(self, ref: str, /) -> MessageContract | None: ...


class MigrationError(AccordError):
    code = "migration-error"

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(f"{code}: {message}")


@dataclass(frozen=True, slots=True)
class Refusal:
    code: str
    stage: str  # empty when about the run as a whole
    message: str

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "stage": self.stage, "message": self.message}

    def __str__(self) -> str:
        where = f"stage {self.stage!r}: " if self.stage else ""
        return f"{self.code}: {where}{self.message}"


@dataclass(frozen=True, slots=True)
class MigrationMap:
    old: Plan
    new: Plan
    kept: tuple[str, ...]
    renamed: Mapping[str, str]  # old name → new name
    added: tuple[str, ...]
    removed: tuple[str, ...]
    _forward: Mapping[str, str] = field(default_factory=dict, repr=False)

    def new_name(self, old: str) -> str | None:
        """Where an old stage goes; ``None`` when the new plan removes it."""
        return self._forward.get(old)

    def to_json(self) -> dict[str, Any]:
        return {
            "workflow": self.old.name,
            "from": {"digest": self.old.digest, "version": self.old.version},
            "to": {"digest": self.new.digest, "version": self.new.version},
            "kept": list(self.kept),
            "renamed": dict(self.renamed),
            "added": list(self.added),
            "removed": list(self.removed),
        }


def parse_map(entries: list[str]) -> dict[str, str]:
    """``["old=new", …]`` as a dict; a malformed or repeated entry is ``migration-bad-map``."""
    out: dict[str, str] = {}
    for text in entries:
        old, sep, new = text.partition("=")
        old, new = old.strip(), new.strip()
        if not sep or not old or not new:
            raise MigrationError("migration-bad-map", f"--map {text!r}: expected OLD=NEW")
        if old in out:
            raise MigrationError("migration-bad-map", f"--map names {old!r} twice")
        out[old] = new
    return out


def migration_map(old: Plan, new: Plan, renames: Mapping[str, str] | None = None) -> MigrationMap:
    """The stage map from ``old`` to ``new`` with the explicit ``renames`` (old → new)."""
    if old.name != new.name:
        raise MigrationError(
            "migration-wrong-workflow", f"{new.digest} is a plan of {new.name}, not {old.name}"
        )
    renames = dict(renames or {})
    old_names = [s.name for s in old.stages]
    new_names = [s.name for s in new.stages]
    for o, n in renames.items():
        if o not in old_names:
            raise MigrationError(
                "migration-bad-map", f"{o}={n}: {o!r} is not a stage of {old.name} {old.version}"
            )
        if n not in new_names:
            raise MigrationError(
                "migration-bad-map", f"{o}={n}: {n!r} is not a stage of {new.name} {new.version}"
            )
    targets = list(renames.values())
    if len(set(targets)) != len(targets):
        raise MigrationError("migration-bad-map", "two --map entries name the same new stage")
    renamed = {o: n for o, n in renames.items() if o != n}
    kept = tuple(
        o for o in old_names if o not in renamed and o in new_names and o not in renamed.values()
    )
    removed = tuple(o for o in old_names if o not in kept and o not in renamed)
    taken = set(kept) | set(renamed.values())
    added = tuple(n for n in new_names if n not in taken)
    forward = {**{k: k for k in kept}, **renamed}
    return MigrationMap(old, new, kept, renamed, added, removed, forward)


# --- the plans' graphs ------------------------------------------------------------------------


def _successors(stage: Stage) -> Iterator[str]:
    for name in _EDGES:
        target = getattr(stage, name, "")
        if isinstance(target, str) and target:
            yield target
    if isinstance(stage, ForkStage):
        yield from stage.branches
    if isinstance(stage, DecisionStage):
        yield from (b.next for b in stage.branches)


def _bindings(value: Any) -> Iterator[Binding]:
    if isinstance(value, Binding):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _bindings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _bindings(v)


def _reads(stage: Stage) -> set[str]:
    """The stages whose results ``stage`` reads."""
    if isinstance(stage, TaskStage):
        return {b.stage for b in _bindings(dict(stage.input)) if b.source == "stage" and b.stage}
    if isinstance(stage, DecisionStage):
        out: set[str] = set()
        for branch in stage.branches:
            out.update(branch.references)
            try:
                _, refs = scan(branch.when)
            except ValueError:
                continue
            out.update(
                r.stage for r in refs if r.source == "stage" and r.stage and r.part == "result"
            )
        return out
    return set()


def _reachable(plan: Plan, start: set[str]) -> set[str]:
    seen: set[str] = set()
    todo = [s for s in start if plan.has_stage(s)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(t for t in _successors(plan.stage(name)) if plan.has_stage(t))
    return seen


# --- the proof ---------------------------------------------------------------------------------


def _stages(run: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {n: s for n, s in run.get("stages", {}).items() if not n.startswith("@")}


def check_run(
    run: Mapping[str, Any], mmap: MigrationMap, catalog: MessageLookup | None = None
) -> list[Refusal]:
    """Why ``run`` (a run record's JSON document) may not move along ``mmap``; empty if it may."""
    if run.get("status") in ("completed", "failed", "cancelled") or run.get("intent"):
        why = f"the run is {run.get('status')} with intent {run.get('intent')}"
        return [Refusal("migration-run-ended", "", why)]
    if run.get("plan_digest") != mmap.old.digest:
        why = f"the run is pinned to {run.get('plan_digest')}, not {mmap.old.digest}"
        return [Refusal("migration-wrong-plan", "", why)]
    stages = _stages(run)
    out: list[Refusal] = []
    out += _strands(stages, mmap)
    out += _equivalence(run, stages, mmap)
    out += _contracts(stages, mmap, catalog)
    out += _reads_lost(stages, mmap)
    return out


def _strands(stages: Mapping[str, Mapping[str, Any]], mmap: MigrationMap) -> Iterator[Refusal]:
    for name, st in stages.items():
        if st["status"] not in LIVE:
            continue
        live = f"is {st['status']}"
        target = mmap.new_name(name)
        if target is None:
            yield Refusal("migration-strands-attempt", name, f"{live} and the new plan removes it")
            continue
        if target != name:
            yield Refusal(
                "migration-strands-attempt",
                name,
                f"{live}: renaming it to {target!r} strands the work that names it",
            )
            continue
        old, new = mmap.old.stage(name), mmap.new.stage(target)
        if old.type != new.type:
            yield Refusal(
                "migration-strands-attempt",
                name,
                f"{live} as a {old.type}, the new plan has a {new.type}",
            )
        elif (
            isinstance(old, TaskStage)
            and isinstance(new, TaskStage)
            and old.capability.ref != new.capability.ref
        ):
            why = f"{live} on {old.capability.ref}; the new plan pins {new.capability.ref}"
            yield Refusal("migration-strands-attempt", name, why)


def _equivalence(
    run: Mapping[str, Any], stages: Mapping[str, Mapping[str, Any]], mmap: MigrationMap
) -> Iterator[Refusal]:
    fwd = mmap.new_name
    arrivals: Mapping[str, Any] = run.get("join_arrivals", {})
    for name, st in stages.items():
        status = st["status"]
        if status == "pending" and name not in arrivals:
            continue
        old = mmap.old.stage(name)
        target = fwd(name)
        if target is None:
            if isinstance(old, TaskStage) and old.compensate is not None and status == "completed":
                yield Refusal(
                    "migration-no-equivalent-state",
                    name,
                    f"completed with compensation {old.compensate.ref}; the new plan removes it",
                )
            continue
        new = mmap.new.stage(target)
        if old.type != new.type:
            if status not in LIVE:  # a live one is reported as stranded
                yield Refusal(
                    "migration-no-equivalent-state",
                    name,
                    f"{status} as a {old.type}; the new plan's {target!r} is a {new.type}",
                )
            continue
        if isinstance(old, ForkStage) and isinstance(new, ForkStage) and status == "completed":
            branches = {fwd(b) for b in old.branches}
            if branches != set(new.branches) or fwd(old.join) != new.join:
                yield Refusal(
                    "migration-no-equivalent-state",
                    name,
                    f"released branches {sorted(old.branches)}; the new fork has "
                    f"{sorted(new.branches)} joined at {new.join!r}",
                )
        if isinstance(old, JoinStage) and isinstance(new, JoinStage) and name in arrivals:
            required = {fwd(b) for b in old.required}
            if required != set(new.required):
                yield Refusal(
                    "migration-no-equivalent-state",
                    name,
                    f"gathering {sorted(old.required)}; the new join requires "
                    f"{sorted(new.required)}",
                )


def _contract_change(
    old_ref: str | None,
    new_ref: str | None,
    catalog: MessageLookup | None,
) -> str | None:
    """Why a reader of ``new_ref`` may not read what ``old_ref`` wrote; ``None`` if it may."""
    if old_ref == new_ref or new_ref is None:
        return None
    if old_ref is None:
        return f"the new plan requires {new_ref}, which the run was never checked against"
    if catalog is None:
        return f"{old_ref} → {new_ref} cannot be proved without the contract catalog"
    before, after = catalog.message(old_ref), catalog.message(new_ref)
    missing = [r for r, c in ((old_ref, before), (new_ref, after)) if c is None]
    if missing or before is None or after is None:
        return f"{old_ref} → {new_ref} cannot be proved: {', '.join(missing)} not in the catalog"
    report = diff(before, after)
    if report.backward_compatible:
        return None
    broken = [c.key for c in report.changes if not c.backward]
    return f"{old_ref} → {new_ref} is not backward compatible ({', '.join(broken)})"


def _contracts(
    stages: Mapping[str, Mapping[str, Any]], mmap: MigrationMap, catalog: MessageLookup | None
) -> Iterator[Refusal]:
    why = _contract_change(mmap.old.context_contract, mmap.new.context_contract, catalog)
    if why is not None:
        yield Refusal("migration-contract-incompatible", "", f"context: {why}")
    for name, st in stages.items():
        holds = st.get("result") is not None or st["status"] in LIVE
        target = mmap.new_name(name)
        if not holds or target is None:
            continue
        old, new = mmap.old.stage(name), mmap.new.stage(target)
        if not (isinstance(old, TaskStage) and isinstance(new, TaskStage)):
            continue
        a, b = old.capability, new.capability
        if a.result == b.result and a.result_digest != b.result_digest:
            why = f"{a.result} is pinned at another digest ({a.result_digest} → {b.result_digest})"
        else:
            why = _contract_change(a.result, b.result, catalog)
        if why is not None:
            yield Refusal("migration-contract-incompatible", name, f"result: {why}")


def _reads_lost(stages: Mapping[str, Mapping[str, Any]], mmap: MigrationMap) -> Iterator[Refusal]:
    after: dict[str, Mapping[str, Any]] = {}
    for name, st in stages.items():
        target = mmap.new_name(name)
        if target is not None:
            after[target] = st
    live = {n for n, st in after.items() if st["status"] in LIVE}
    ahead = _reachable(mmap.new, {t for n in live for t in _successors(mmap.new.stage(n))} | live)
    held = {n for n, st in after.items() if st.get("result") is not None}
    for name in sorted(ahead):
        if name in after and after[name]["status"] != "pending":
            continue  # already dispatched with its input bound, or done
        for read in sorted(_reads(mmap.new.stage(name))):
            status = after.get(read, {}).get("status", "pending")
            if read in held or read in live or (read in ahead and status == "pending"):
                continue
            why = f"reads stages[{read!r}].result, which the run does not hold"
            yield Refusal("migration-removes-read-result", name, why + _dropped(stages, mmap))


def _dropped(stages: Mapping[str, Mapping[str, Any]], mmap: MigrationMap) -> str:
    """What the map throws away that an explicit rename would carry over."""
    lost = [o for o in mmap.removed if o in stages and stages[o].get("result") is not None]
    if not lost:
        return " and it is behind the run's live work"
    return (
        f"; the map removes the result of {', '.join(repr(o) for o in lost)}"
        " (a --map OLD=NEW entry carries a result over)"
    )


def event_fields(run: Mapping[str, Any], mmap: MigrationMap) -> dict[str, Any]:
    """The map part of a :class:`~accord.engine.machine.events.RunMigrated` for ``run``."""
    stages = _stages(run)
    retyped = {
        name: mmap.new.stage(name).type
        for name in mmap.kept
        if name in stages and mmap.old.stage(name).type != mmap.new.stage(name).type
    }
    retyped |= {
        old: mmap.new.stage(new).type
        for old, new in mmap.renamed.items()
        if mmap.old.stage(old).type != mmap.new.stage(new).type
    }
    return {
        "from_digest": mmap.old.digest,
        "to_digest": mmap.new.digest,
        "renamed": dict(mmap.renamed),
        "added": {n: mmap.new.stage(n).type for n in mmap.added},
        "removed": tuple(n for n in mmap.removed if n in stages),
        "retyped": retyped,
        "contracts": dict(mmap.new.contracts),
        "to_version": mmap.new.version,
    }
