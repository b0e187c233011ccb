"""`accord runs`: read and steer runs in a store.

``list``, ``show``, ``history`` and ``explain`` only read. ``prune --older-than 30d`` removes
ended runs (completed, failed, cancelled) that saw no change for that long, history and all, as
the engine's retention loop does (:mod:`accord.engine.runtime.retention`). ``cancel`` and
``redrive`` commit one operator event through the engine's normal path (load → apply →
commit); the outbox entries that commit writes are published by whichever engine process sweeps
next, so these commands need no transport. Every command takes ``--json``.

What they print never holds a sensitive value: the fields the run's pinned contracts mark
``sensitive`` are masked (``***``) in both forms, and every echo of their values is scrubbed
(:mod:`accord.cli._redaction`; contracts from ``--contracts``, default ``schemas/contracts`` of
the enclosing repository; a pinned contract it lacks masks the context and results whole).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from accord.adapters import open_store, open_transport
from accord.adapters.clock import SystemClock
from accord.cli._common import EXIT_OK, EXIT_USAGE, console, emit_json, refuse, usage
from accord.cli._connect import masked
from accord.cli._redaction import load_catalog_quietly, redaction_of
from accord.contracts.redact import scrub, scrub_pattern
from accord.engine.machine.explain import explain_history
from accord.engine.machine.state import HistoryEntry, RunState
from accord.engine.ports import Store
from accord.engine.runtime.orchestrator import Delivered, Engine, EngineOptions
from accord.engine.runtime.retention import parse_duration, prune_all
from accord.errors import StoreError

app = typer.Typer(help="Inspect, cancel and re-drive runs.", no_args_is_help=True)

DEFAULT_STORE = "sqlite:///.accord/accord.db"
StoreOpt = Annotated[
    str, typer.Option("--store", envvar="ACCORD_STORE", help="store URL (sqlite:///path)")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]
ContractsOpt = Annotated[
    Path | None,
    typer.Option("--contracts", envvar="ACCORD_CONTRACTS", help="contract sources (redaction)"),
]
T = TypeVar("T")


def _with_store(url: str, body: Callable[[Store], Awaitable[T]]) -> T:
    async def go() -> T:
        try:
            store = open_store(url)
        except (ValueError, OSError) as exc:
            refuse(masked(url, f"cannot open store {url!r}: {exc}"), 2)
        try:
            return await body(store)
        finally:
            await store.close()

    return _store_guarded(url, go)


def _store_guarded(url: str, go: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run(go())``; a store that cannot be opened or read is a usage error (exit 2)."""
    try:
        return asyncio.run(go())
    except StoreError as exc:
        said = str(exc) if url in str(exc) else f"store {url!r}: {exc}"
        refuse(masked(url, said), EXIT_USAGE)  # the password never printed


def _iso(ms: int) -> str:
    """Epoch milliseconds as ISO-8601 UTC to the millisecond (``2026-12-01T10:17:10.123Z``)."""
    return f"{datetime.fromtimestamp(ms // 1000, tz=UTC):%Y-%m-%dT%H:%M:%S}.{ms % 1000:03d}Z"


def _since(ms: int | None, start_ms: int) -> str:
    """``ms`` as signed seconds after ``start_ms`` (``+1.250s``); ``-`` when there is none."""
    if ms is None:
        return "-"
    delta = ms - start_ms
    return f"{'-' if delta < 0 else '+'}{abs(delta) // 1000}.{abs(delta) % 1000:03d}s"


async def _run_or_refuse(store: Store, run_id: str) -> RunState:
    stored = await store.load(run_id)
    if stored is None:
        refuse(f"run {run_id!r} not found")
    return RunState.from_json(stored.state)


async def _redacted(
    store: Store, run_id: str, contracts: Path | None
) -> tuple[RunState, dict[str, Any], list[dict[str, Any]], re.Pattern[str] | None]:
    """The run, its record and its history as an operator may see them (sensitive values
    masked), and the pattern of those values for scrubbing what is printed from them."""
    run = await _run_or_refuse(store, run_id)
    entries = await store.history(run_id)
    redaction = await redaction_of(store.get_plan, run, load_catalog_quietly(contracts))
    pattern = scrub_pattern(redaction.values(run, entries))
    shown = [redaction.entry_json(h, pattern) for h in entries]
    return run, redaction.run_json(run, pattern), shown, pattern


@app.command("list")
def list_runs(  # noqa: PLR0917 - typer maps each option to a parameter
    store: StoreOpt = DEFAULT_STORE,
    status: Annotated[str | None, typer.Option(help="only runs with this status")] = None,
    workflow: Annotated[str | None, typer.Option(help="only runs of this workflow")] = None,
    tenant: Annotated[str | None, typer.Option(help="only runs of this tenant")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 100,
    json_out: JsonOpt = False,
) -> None:
    """List runs, newest first."""
    filters = {k: v for k, v in (("status", status), ("workflow", workflow), ("tenant", tenant))}
    chosen = {k: v for k, v in filters.items() if v is not None}
    stored = _with_store(store, lambda s: s.list_runs(limit, **chosen))
    runs = [(RunState.from_json(s.state), s.version) for s in stored]
    if json_out:
        emit_json([_summary(run, version) for run, version in runs])
        return
    for run, _ in runs:
        started = _iso(run.started_at_ms) if run.started_at_ms else "-"
        console.print(
            f"{run.run_id}  {started}  {run.status:<10} {run.workflow}  tenant={run.tenant}",
            markup=False,
        )
    raise typer.Exit(EXIT_OK)


def _summary(run: RunState, version: int) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "status": run.status,
        "intent": run.intent,
        "workflow": run.workflow,
        "tenant": run.tenant,
        "plan_digest": run.plan_digest,
        "version": version,
    }


@app.command("show")
def show(
    run_id: str,
    store: StoreOpt = DEFAULT_STORE,
    json_out: JsonOpt = False,
    contracts: ContractsOpt = None,
) -> None:
    """Show a run's record: status, intent, and every stage."""
    run, doc, _, _ = _with_store(store, lambda s: _redacted(s, run_id, contracts))
    if json_out:
        emit_json(doc)
        return
    started = _iso(run.started_at_ms) if run.started_at_ms else "-"
    console.print(
        f"run {run.run_id}  {run.status}  intent={run.intent}  {run.workflow}  started {started}",
        markup=False,
    )
    for stage in run.stages.values():
        line = f"  {stage.name:<28} {stage.status:<16} attempt={stage.attempt}"
        if (cur := stage.current) is not None:  # times since the run started
            line += f"  dispatched={_since(cur.dispatched_at_ms, run.started_at_ms)}"
            line += f"  finished={_since(cur.finished_at_ms, run.started_at_ms)}"
        console.print(line, markup=False)


@app.command("history")
def history(
    run_id: str,
    store: StoreOpt = DEFAULT_STORE,
    json_out: JsonOpt = False,
    contracts: ContractsOpt = None,
) -> None:
    """Print a run's history: every accepted and rejected event, in order."""
    run, _, entries, pattern = _with_store(store, lambda s: _redacted(s, run_id, contracts))
    if json_out:
        emit_json(entries)  # at_ms stays epoch milliseconds here
        return
    history = [HistoryEntry.from_json(doc) for doc in entries]
    start = run.started_at_ms or (history[0].at_ms if history else 0)
    for h in history:  # ISO-8601 UTC, then the time since the run started
        verdict = "accepted" if h.accepted else f"rejected ({h.reason})"
        stage = f" {h.event['stage']}" if h.event.get("stage") else ""
        when = f"{_iso(h.at_ms)} {_since(h.at_ms, start):>9}"
        line = f"{h.seq:>4} {when} {h.event.get('kind')}{stage} {verdict}"
        console.print(scrub(line, pattern), markup=False)


@app.command("explain")
def explain(
    run_id: str,
    store: StoreOpt = DEFAULT_STORE,
    json_out: JsonOpt = False,
    contracts: ContractsOpt = None,
) -> None:
    """Explain, from its history alone, how a run reached its current state."""
    run, _, entries, pattern = _with_store(store, lambda s: _redacted(s, run_id, contracts))
    told = explain_history(run, [HistoryEntry.from_json(h) for h in entries])
    lines = [scrub(line, pattern) for line in told]
    if json_out:
        emit_json({"run_id": run_id, "status": run.status, "explanation": lines})
        return
    for line in lines:
        console.print(line, markup=False)


@app.command("prune")
def prune(
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than",
            help="remove ended runs that saw no change for this long (30d, 12h, 15m)",
        ),
    ],
    store: StoreOpt = DEFAULT_STORE,
    json_out: JsonOpt = False,
) -> None:
    """Remove ended runs older than --older-than, with their history; live runs stay."""
    try:
        age_ms = parse_duration(older_than)
    except ValueError as exc:
        usage(f"--older-than: {exc}")
    cutoff = max(0, SystemClock().now_ms() - age_ms)
    removed = _with_store(store, lambda s: prune_all(s, cutoff))
    if json_out:
        emit_json({"ok": True, "removed": removed, "ended_before_ms": cutoff,
                   "ended_before": _iso(cutoff)})  # fmt: skip
        return
    console.print(f"removed {removed} ended runs last changed before {_iso(cutoff)}", markup=False)


def _operate(store: str, op: Callable[[Engine], Awaitable[Delivered]]) -> Delivered:
    async def go() -> Delivered:
        engine = Engine(
            open_store(store),
            open_transport("memory://"),
            SystemClock(),
            options=EngineOptions(dispatch=False),
            owns_ports=True,
        )
        try:
            return await op(engine)
        finally:
            await engine.stop()

    return _store_guarded(store, go)


@app.command("cancel")
def cancel(
    run_id: str,
    store: StoreOpt = DEFAULT_STORE,
    reason: Annotated[str, typer.Option(help="recorded in the history")] = "",
    json_out: JsonOpt = False,
) -> None:
    """Request cancellation of a run (recorded; active attempts are fenced)."""
    _with_store(store, lambda s: _run_or_refuse(s, run_id))
    by = os.environ.get("USER", "operator")
    _report(_operate(store, lambda e: e.cancel(run_id, reason, by)), json_out)


@app.command("redrive")
def redrive(
    run_id: str, stage: str, store: StoreOpt = DEFAULT_STORE, json_out: JsonOpt = False
) -> None:
    """Re-drive a failed, timed-out or quarantined stage: a new fenced attempt."""
    before = _with_store(store, lambda s: _run_or_refuse(s, run_id))
    if stage not in before.stages:
        refuse(f"run {run_id!r} has no stage {stage!r}")
    by = os.environ.get("USER", "operator")
    _report(_operate(store, lambda e: e.redrive(run_id, stage, by)), json_out)


def _report(done: Delivered, json_out: bool) -> None:
    run = done.run
    refused = [h for h in done.history if not h.accepted]
    if run is None or refused:
        reason = refused[0].reason if refused else "no such run"
        refuse(f"refused by the run's rules: {reason} ({refused[0].note if refused else ''})")
    if json_out:
        emit_json(_summary(run, done.version))
    else:
        console.print(f"run {run.run_id}: {run.status} (intent {run.intent})")
