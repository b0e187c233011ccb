"""Migration, shadow runs and canaries on the command line (registered on ``accord runs`` and
``accord workflow``).

- ``accord runs migrate RUN --to REF [--map OLD=NEW …] [--reason TEXT]`` moves a live run to
  another plan version when :mod:`accord.workflow.migration` proves it safe, recorded in the run's
  history as ``cli:$USER`` with the reason; a refused move is recorded too, and exits 1 listing
  each refusal (code, stage, message).
- ``accord workflow migration-plan OLD NEW [--map …]`` prints the stage map and, for every live
  run of OLD, whether it could move and why not.
- ``accord workflow shadow NEW --runs N`` replays the newest N completed runs of the active
  version through NEW with every effect off and reports the divergences; ``--where QUERY``
  (the terms of ``accord runs search``, e.g. ``'status:failed since:7d'``) chooses the runs.
- ``accord workflow activate FILE --canary 10%`` (on ``activate``) sends that share of new runs
  to the new version; ``accord workflow canary NAME`` shows the split, both versions' recorded
  outcomes and the criteria's verdict; ``promote NAME`` and ``abort NAME`` decide by hand, and
  ``promote NAME --auto`` applies the verdict (promote, abort, or nothing yet).

A plan REF is a digest (``sha256:…``, stored), a workflow name (its active version) or a
workflow file (compiled against ``--contracts`` and stored, not activated). Every command takes
``--json`` and prints one document in every outcome.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from accord.adapters import open_store, open_transport
from accord.adapters.clock import SystemClock
from accord.cli import runs, workflow
from accord.cli._common import EXIT_REFUSED, emit_json, json_requested, refuse, usage
from accord.cli._connect import masked
from accord.cli._redaction import load_catalog_quietly
from accord.engine.ports import Store
from accord.engine.runtime import canary as canaries
from accord.engine.runtime.migration import Migrated, candidates, map_between, migrate_run
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.engine.runtime.shadow import parse_where
from accord.engine.runtime.shadow import shadow as shadow_runs
from accord.errors import AccordError, EngineError, StoreError
from accord.workflow.activation import stored_document
from accord.workflow.canary import Criteria, Split, parse_share, share_text
from accord.workflow.migration import MigrationError, parse_map
from accord.workflow.plan import Plan

__all__ = ["activate_canary"]

T = TypeVar("T")
StoreOpt = Annotated[
    str, typer.Option("--store", envvar="ACCORD_STORE", help="store URL (sqlite:///path)")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]
ContractsOpt = Annotated[
    Path, typer.Option("--contracts", help="contract sources (workflow files, the proof)")
]
MapOpt = Annotated[
    list[str] | None, typer.Option("--map", help="OLD=NEW: an explicit stage rename (repeatable)")
]
ReasonOpt = Annotated[str, typer.Option("--reason", help="why: recorded with the decision")]
DEFAULT_CONTRACTS = Path("schemas/contracts")


def _who() -> str:
    return f"cli:{os.environ.get('USER', 'operator')}"


def _store_run(url: str, body: Callable[[Store], Awaitable[T]]) -> T:
    async def go() -> T:
        try:
            store = open_store(url)
        except (ValueError, OSError) as exc:
            usage(masked(url, f"cannot open store {url!r}: {exc}"))
        try:
            return await body(store)
        finally:
            await store.close()

    try:
        return asyncio.run(go())
    except MigrationError as exc:
        refuse(str(exc), 2 if exc.code == "migration-bad-map" else EXIT_REFUSED)
    except StoreError as exc:
        usage(masked(url, str(exc)))
    except (AccordError, EngineError) as exc:
        refuse(str(exc))


def _renames(entries: list[str] | None) -> dict[str, str]:
    try:
        return parse_map(entries or [])
    except MigrationError as exc:
        usage(str(exc))


async def _plan_ref(store: Store, ref: str, contracts: Path) -> Plan:
    """A stored plan by digest, the active plan of a workflow, or a compiled file (stored)."""
    if ref.startswith("sha256:"):
        doc = await store.get_plan(ref)
        if doc is None:
            raise MigrationError("migration-unknown-plan", f"no stored plan {ref}")
        return Plan.from_json(doc)
    path = Path(ref)
    if path.suffix in (".yaml", ".yml") or path.exists():
        plan = workflow._compiled(path, contracts, json_requested())
        await store.put_plan(plan.digest, stored_document(plan))
        return plan
    digest = await store.get_active(ref)
    if digest is None:
        raise MigrationError("migration-unknown-plan", f"{ref}: no active version, no such file")
    return Plan.from_json(await store.get_plan(digest) or {})


# --- runs migrate --------------------------------------------------------------------------------


@runs.app.command("migrate")
def migrate(  # noqa: PLR0917 - typer maps each option to a parameter
    run_id: str,
    to: Annotated[str, typer.Option("--to", help="target plan: digest, workflow name or file")],
    mapping: MapOpt = None,
    reason: ReasonOpt = "",
    store: StoreOpt = runs.DEFAULT_STORE,
    contracts: ContractsOpt = DEFAULT_CONTRACTS,
    json_out: JsonOpt = False,
) -> None:
    """Move a live run to another plan version, where the migration is proved safe."""
    renames = _renames(mapping)
    catalog = load_catalog_quietly(contracts)

    async def go(s: Store) -> Migrated:
        target = await _plan_ref(s, to, contracts)
        engine = Engine(
            s, open_transport("memory://"), SystemClock(), options=EngineOptions(dispatch=False)
        )
        try:
            return await migrate_run(
                engine,
                run_id,
                target.digest,
                renames=renames,
                by=_who(),
                reason=reason,
                catalog=catalog,
            )
        finally:
            await engine.stop()

    done = _store_run(store, go)
    doc = done.to_json()
    if json_out:
        emit_json({"ok": done.moved, **doc})
    elif done.moved:
        m = doc["map"]
        typer.echo(
            f"{run_id}: migrated {m['from']['version']} → {m['to']['version']} "
            f"({m['to']['digest']})"
        )
    else:
        for r in done.refusals:
            typer.echo(f"refused: {r}", err=True)
        machine = doc["machine"]
        if machine and not done.refusals:
            typer.echo(f"refused ({machine['reason']}): {machine['note']}", err=True)
    if not done.moved:
        raise typer.Exit(EXIT_REFUSED)


# --- workflow migration-plan ---------------------------------------------------------------------


@workflow.app.command("migration-plan")
def migration_plan(  # noqa: PLR0917 - typer maps each option to a parameter
    old: str,
    new: str,
    mapping: MapOpt = None,
    store: StoreOpt = workflow.DEFAULT_STORE,
    contracts: ContractsOpt = DEFAULT_CONTRACTS,
    json_out: JsonOpt = False,
) -> None:
    """Show the stage map between two versions and which live runs of OLD could move."""
    renames = _renames(mapping)
    catalog = load_catalog_quietly(contracts)

    async def go(s: Store) -> dict[str, Any]:
        before, after = await _plan_ref(s, old, contracts), await _plan_ref(s, new, contracts)
        mmap = await map_between(s, before.digest, after.digest, renames)
        found = await candidates(s, mmap, catalog)
        return {"map": mmap.to_json(), "runs": [c.to_json() for c in found]}

    doc = _store_run(store, go)
    if json_out:
        emit_json({"ok": True, **doc})
        return
    m = doc["map"]
    typer.echo(f"{m['workflow']} {m['from']['version']} → {m['to']['version']}")
    typer.echo(f"  kept:    {', '.join(m['kept']) or '-'}")
    renamed = ", ".join(f"{a} → {b}" for a, b in m["renamed"].items())
    typer.echo(f"  renamed: {renamed or '-'}")
    typer.echo(f"  added:   {', '.join(m['added']) or '-'}")
    typer.echo(f"  removed: {', '.join(m['removed']) or '-'}")
    movable = [r for r in doc["runs"] if r["can_move"]]
    typer.echo(f"live runs: {len(doc['runs'])}, can move: {len(movable)}")
    for r in doc["runs"]:
        mark = "ok" if r["can_move"] else "refused"
        typer.echo(f"  {r['run_id']} {r['status']} {mark}")
        for x in r["refusals"]:
            where = f" {x['stage']}" if x["stage"] else ""
            typer.echo(f"    {x['code']}{where}: {x['message']}")


# --- workflow shadow -----------------------------------------------------------------------------


@workflow.app.command("shadow")
def shadow(  # noqa: PLR0917 - typer maps each option to a parameter
    new: str,
    runs_n: Annotated[
        int, typer.Option("--runs", "--limit", min=1, help="how many recorded runs to replay")
    ] = 100,
    where: Annotated[
        str | None,
        typer.Option(
            "--where",
            help="which recorded runs, in the terms of `accord runs search` "
            "('status:failed tenant:acme since:7d'; default: completed runs of the active version)",
        ),
    ] = None,
    store: StoreOpt = workflow.DEFAULT_STORE,
    contracts: ContractsOpt = DEFAULT_CONTRACTS,
    json_out: JsonOpt = False,
) -> None:
    """Replay recorded runs through NEW with every effect off; report divergences."""

    async def go(s: Store) -> dict[str, Any]:
        plan = await _plan_ref(s, new, contracts)
        query = None
        if where is not None:
            try:
                query = parse_where(where, plan.name, SystemClock().now_ms())
            except ValueError as exc:
                usage(f"--where {where!r}: {exc}")
        doc = (await shadow_runs(s, plan, runs_n, where=query)).to_json()
        return {**doc, "where": where} if where is not None else doc

    doc = _store_run(store, go)
    if json_out:
        emit_json({"ok": True, **doc})
        return
    typer.echo(f"{doc['workflow']}: replayed {doc['replayed']} runs of {doc['recorded_digest']}")
    typer.echo(f"  identical {doc['identical']}, diverged {doc['diverged']}")
    for kind, n in doc["runs_with"].items():
        typer.echo(f"  runs with {kind}: {n}")
    typer.echo(f"  shadow outcomes: {doc['shadow_outcomes']}")
    for r in doc["runs"]:
        for d in r["divergences"]:
            typer.echo(f"  {r['run_id']} {d['kind']} {d['subject']}: {d['detail']}")


# --- canaries ------------------------------------------------------------------------------------


def _split_json(split: Split) -> dict[str, Any]:
    return {**split.to_json(), "share": share_text(split.share), "criteria": str(split.criteria)}


def activate_canary(
    plan: Plan,
    share_text_: str,
    store: str,
    *,
    max_increase: float | None,
    min_runs: int | None,
    reason: str,
    json_out: bool,
) -> None:
    """``accord workflow activate FILE --canary N%``: begin a canary of ``plan``."""
    try:
        share = parse_share(share_text_)
    except AccordError as exc:
        usage(str(exc))
    criteria = None
    if max_increase is not None or min_runs is not None:
        base = Criteria()
        criteria = Criteria(
            base.max_increase if max_increase is None else max_increase / 100,
            base.min_runs if min_runs is None else min_runs,
        )

    async def go(s: Store) -> Split:
        return await canaries.begin(
            s,
            plan,
            share,
            criteria=criteria,
            by=_who(),
            reason=reason,
            now_ms=SystemClock().now_ms(),
        )

    split = _store_run(store, go)
    if json_out:
        emit_json(
            {"ok": True, "workflow": plan.name, "digest": plan.digest, "canary": _split_json(split)}
        )
    else:
        typer.echo(
            f"{plan.name} {plan.version} {plan.digest} canary at {share_text(share)} "
            f"(stable {split.stable}; {split.criteria})"
        )


@workflow.app.command("canary")
def canary_status(
    name: str, store: StoreOpt = workflow.DEFAULT_STORE, json_out: JsonOpt = False
) -> None:
    """Show a workflow's canary: the split, both versions' outcomes and the verdict."""
    split, stable, new, found = _store_run(store, lambda s: canaries.status(s, name))
    doc = {
        "canary": _split_json(split),
        "stable_outcomes": stable.to_json(),
        "canary_outcomes": new.to_json(),
        "verdict": {"decision": found.decision, "why": found.why},
    }
    if json_out:
        emit_json({"ok": True, **doc})
        return
    typer.echo(f"{name}: canary {split.canary} at {share_text(split.share)}, {split.state}")
    typer.echo(f"  stable {stable.to_json()}  canary {new.to_json()}")
    typer.echo(f"  verdict: {found.decision} ({found.why})")


def _decide(name: str, action: str, store: str, reason: str, json_out: bool) -> None:
    async def go(s: Store) -> tuple[Split, str]:
        now = SystemClock().now_ms()
        if action == "auto":
            split, found = await canaries.settle(s, name, by=_who(), now_ms=now)
            return split, found.decision
        act = canaries.promote if action == "promote" else canaries.abort
        why = reason or f"{action} by hand"
        return await act(s, name, by=_who(), why=why, now_ms=now), action

    split, decision = _store_run(store, go)
    if json_out:
        emit_json({"ok": True, "decision": decision, "canary": _split_json(split)})
        return
    if decision == "wait":
        typer.echo(f"{name}: canary still running ({split.criteria})")
    else:
        active = split.canary if split.state == "promoted" else split.stable
        typer.echo(f"{name}: canary {split.state}; active {active} ({split.decision})")


@workflow.app.command("promote")
def promote(
    name: str,
    auto: Annotated[bool, typer.Option("--auto", help="decide by the promotion criteria")] = False,
    reason: ReasonOpt = "",
    store: StoreOpt = workflow.DEFAULT_STORE,
    json_out: JsonOpt = False,
) -> None:
    """Make a workflow's canary its active version (or, with --auto, apply the criteria)."""
    _decide(name, "auto" if auto else "promote", store, reason, json_out)


@workflow.app.command("abort")
def abort(
    name: str,
    reason: ReasonOpt = "",
    store: StoreOpt = workflow.DEFAULT_STORE,
    json_out: JsonOpt = False,
) -> None:
    """Stop a workflow's canary; the stable version stays active."""
    _decide(name, "abort", store, reason, json_out)
