"""Governed run migration in the engine: prove, then record the move as one machine event.

:func:`migrate_run` loads the run and both plans, computes the map
(:func:`accord.workflow.migration.migration_map`, with the operator's explicit renames) and the
proof (:func:`~accord.workflow.migration.check_run`, contracts from the engine's catalog), and
delivers a :class:`~accord.engine.machine.events.RunMigrated` through the engine's one path
(load → apply → commit). A run the proof refuses gets the same event carrying the refusals, which
the machine refuses: the attempt is in the run's history either way, with who asked and why. The
machine re-checks live work against the map at commit time, so a stage that started between the
proof and the commit still refuses the move.

:func:`candidates` answers which live runs of the old version could move (for ``accord workflow
migration-plan``), reading the newest ``limit`` runs of the workflow from the store.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from accord.engine.machine.events import RunMigrated
from accord.engine.ports import Store
from accord.engine.runtime.orchestrator import Delivered, Engine
from accord.workflow.activation import ActivationError, load_plan
from accord.workflow.migration import (
    MessageLookup,
    MigrationError,
    MigrationMap,
    Refusal,
    check_run,
    event_fields,
    migration_map,
)

__all__ = ["Candidate", "Migrated", "candidates", "map_between", "migrate_run"]

_ENDED = ("completed", "failed", "cancelled")


@dataclass(frozen=True, slots=True)
class Migrated:
    run_id: str
    map: MigrationMap
    refusals: tuple[Refusal, ...]
    delivered: Delivered

    @property
    def moved(self) -> bool:
        return not self.refusals and all(h.accepted for h in self.delivered.history)

    def to_json(self) -> dict[str, Any]:
        refused = [h for h in self.delivered.history if not h.accepted]
        return {
            "run_id": self.run_id,
            "migrated": self.moved,
            "map": self.map.to_json(),
            "refusals": [r.to_json() for r in self.refusals],
            "machine": (
                {"reason": refused[0].reason, "note": refused[0].note} if refused else None
            ),
            "seq": self.delivered.run.seq if self.delivered.run else None,
        }


@dataclass(frozen=True, slots=True)
class Candidate:
    run_id: str
    status: str
    refusals: tuple[Refusal, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "status": self.status,
            "can_move": not self.refusals,
            "refusals": [r.to_json() for r in self.refusals],
        }


async def map_between(
    store: Store, old: str, new: str, renames: Mapping[str, str] | None = None
) -> MigrationMap:
    """The map between two stored plans (by digest)."""
    try:
        before, after = await load_plan(store, old), await load_plan(store, new)
    except ActivationError as exc:
        raise MigrationError("migration-unknown-plan", str(exc)) from None
    return migration_map(before, after, renames)


async def migrate_run(
    engine: Engine,
    run_id: str,
    to_digest: str,
    *,
    renames: Mapping[str, str] | None = None,
    by: str,
    reason: str = "",
    catalog: MessageLookup | None = None,
) -> Migrated:
    stored = await engine.store.load(run_id)
    if stored is None:
        raise MigrationError("migration-unknown-run", f"run {run_id!r} not found")
    doc = stored.state
    mmap = await map_between(engine.store, str(doc["plan_digest"]), to_digest, renames)
    found = check_run(doc, mmap, catalog if catalog is not None else engine.catalog)
    event = RunMigrated(
        run_id=run_id,
        by=by,
        reason=reason,
        problems=tuple(str(r) for r in found),
        **event_fields(doc, mmap),
    )
    delivered = await engine.deliver(event)
    return Migrated(run_id, mmap, tuple(found), delivered)


async def candidates(
    store: Store, mmap: MigrationMap, catalog: MessageLookup | None = None, limit: int = 1000
) -> list[Candidate]:
    out: list[Candidate] = []
    for row in await store.list_runs(limit=limit, workflow=mmap.old.name):
        doc = row.state
        if doc.get("plan_digest") != mmap.old.digest or doc.get("status") in _ENDED:
            continue
        found = check_run(doc, mmap, catalog)
        out.append(Candidate(row.run_id, str(doc.get("status")), tuple(found)))
    out.sort(key=lambda c: c.run_id)
    return out
