"""`accord runs`: read and steer runs in a store.

``start WORKFLOW --context JSON|@file [--idempotency-key K]`` asks the engines to start a run: it
publishes a ``run-requested@1`` message on ``accord.runs`` over ``--transport`` (the path any
other process takes, :mod:`accord.engine.runtime.requests`), having first checked against the
store what the engine would check (the workflow has an active plan, the context satisfies its
contract), so a request that could never start is refused here, exit 1, and never sent. The run
id is derived from the tenant and the key, so the command knows it before any engine answers,
and a repeated key starts nothing new: it answers the run the key already started. It then waits
up to ``--wait-start`` for an engine to start the run; with no engine running it reports the run
``queued`` (exit 0), and the first engine to start takes it. Admission is checked before publishing
(plan active, budgets, live workers, owner and review date where the plan declares an owner) and
again by the engine that takes the request: a refusal either way is exit 1 naming each reason's code
(the engine's is read back from the refusal it records under the run id). ``--wait`` waits for the
run's end as well (exit 1 unless it completed, or when it has not ended within ``--timeout``).
Without ``--idempotency-key`` a fresh key is made, so every call starts a new run. ``--json`` prints
one document in every outcome: ``state`` is ``started``, ``existing`` or ``queued``.

``list``, ``show``, ``history`` and ``explain`` only read. ``prune --older-than 30d`` removes
ended runs (completed, failed, cancelled) that saw no change for that long, history and all, as
the engine's retention loop does (:mod:`accord.engine.runtime.retention`). ``cancel`` and
``redrive`` commit one operator event through the engine's normal path (load → apply →
commit), and so do ``approve`` and ``reject`` (a decision on a waiting approval gate, recorded as
``cli:$USER`` with ``--comment`` and ``--form`` checked against the gate's form contract); the
outbox entries that commit writes are published by whichever engine process sweeps
next, so these commands need no transport. Every command takes ``--json``.

What they print never holds a sensitive value: the fields the run's pinned contracts mark
``sensitive`` are masked (``***``) in both forms, and every echo of their values is scrubbed
(:mod:`accord.cli._redaction`; contracts from ``--contracts``, default ``schemas/contracts`` of
the enclosing repository; a pinned contract it lacks masks the context and results whole).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer

from accord.adapters import open_store, open_transport, reach_transport
from accord.adapters.clock import SystemClock
from accord.cli._common import EXIT_OK, EXIT_USAGE, console, emit_json, refuse, usage
from accord.cli._connect import masked
from accord.cli._redaction import load_catalog_quietly, redaction_of
from accord.contracts.redact import scrub, scrub_pattern
from accord.engine.machine.events import ApprovalDecided
from accord.engine.machine.explain import explain_history, migrations, reconciliation
from accord.engine.machine.finalise import needs_reconciliation as needs_reconciliation_of
from accord.engine.machine.state import RUN_STATUSES, HistoryEntry, RunState
from accord.engine.ports import Store
from accord.engine.runtime.admission import REFUSED_STATUS, Admission, Refusal
from accord.engine.runtime.orchestrator import Delivered, Engine, EngineOptions
from accord.engine.runtime.requests import (
    RUNS_QUEUE,
    BadRequest,
    parse_request,
    request_message_id,
    request_run_id,
)
from accord.engine.runtime.retention import parse_duration, prune_all
from accord.errors import (
    Diagnostic,
    EngineError,
    Location,
    StoreError,
    TransportError,
    ValidationError,
)
from accord.workflow.kinds.approval import form_problems
from accord.workflow.plan import ApprovalStage, Plan

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
    needs_reconciliation: Annotated[
        bool,
        typer.Option(
            "--needs-reconciliation", help="only runs with a compensation that did not succeed"
        ),
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """List runs, newest first."""
    filters = {k: v for k, v in (("status", status), ("workflow", workflow), ("tenant", tenant))}
    chosen = {k: v for k, v in filters.items() if v is not None}
    stored = _with_store(store, lambda s: s.list_runs(limit, **chosen))
    runs = [
        (RunState.from_json(s.state), s.version)
        for s in stored
        if s.state.get("status") in RUN_STATUSES
    ]
    if needs_reconciliation:
        runs = [(run, version) for run, version in runs if reconciliation(run)]
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
    doc: dict[str, Any] = {
        "run_id": run.run_id,
        "status": run.status,
        "intent": run.intent,
        "workflow": run.workflow,
        "tenant": run.tenant,
        "plan_digest": run.plan_digest,
        "version": version,
    }
    undone = needs_reconciliation_of(run.stages, run.compensations)
    if undone:  # only then, so the summary of every other run keeps its form
        doc["needs_reconciliation"] = undone
    return doc


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
    history = [HistoryEntry.from_json(h) for h in entries]
    lines = [scrub(line, pattern) for line in explain_history(run, history)]
    if json_out:
        moves = scrub(migrations(run, history), pattern)
        emit_json({"run_id": run_id, "status": run.status, "explanation": lines,
                   "migrations": moves})  # fmt: skip
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


def _decide(  # noqa: PLR0917 - the shared body of approve and reject
    decision: str,
    run_id: str,
    stage: str,
    store: str,
    comment: str,
    form_text: str | None,
    contracts: Path | None,
    json_out: bool,
) -> None:
    """Record a decision on a waiting approval gate as ``cli:$USER``: whoever holds the store
    holds every role (``admin``) in the run's tenant; the gate's other rules still apply."""
    form = _json_object_arg(form_text, "--form") if form_text is not None else {}
    run = _with_store(store, lambda s: _run_or_refuse(s, run_id))

    async def gate_of(s: Store) -> ApprovalStage | None:
        found = await s.get_plan(run.plan_digest)
        if found is None:
            return None
        plan = Plan.from_json(found)
        gate = plan.stage(stage) if plan.has_stage(stage) else None
        return gate if isinstance(gate, ApprovalStage) else None

    gate = _with_store(store, gate_of)
    if gate is None:
        refuse(f"run {run_id!r} has no approval gate {stage!r}")
    problems = form_problems(gate, load_catalog_quietly(contracts), form)
    event = ApprovalDecided(
        run_id=run_id,
        stage=stage,
        decision=decision,
        by=f"cli:{os.environ.get('USER', 'operator')}",
        role="admin",
        tenants=(run.tenant,),
        comment=comment,
        form=form,
        form_problems=problems,
    )
    _report(_operate(store, lambda e: e.deliver(event)), json_out)


def _json_object_arg(text: str, where: str) -> dict[str, Any]:
    """A JSON object given inline or as ``@file``; anything else is a usage error."""
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            usage(f"{where} {text}: cannot read {str(path)!r}: {exc}")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        usage(f"{where}: not JSON: {exc}")
    if not isinstance(doc, dict):
        usage(f"{where}: must be a JSON object, not {type(doc).__name__}")
    return doc


CommentOpt = Annotated[str, typer.Option("--comment", help="recorded with the decision")]
FormOpt = Annotated[
    str | None, typer.Option("--form", help="the gate's form data: JSON, or @file holding it")
]


@app.command("approve")
def approve(  # noqa: PLR0917 - typer maps each option to a parameter
    run_id: str,
    stage: str,
    store: StoreOpt = DEFAULT_STORE,
    comment: CommentOpt = "",
    form: FormOpt = None,
    contracts: ContractsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Approve a waiting approval gate (recorded with who, when, comment and form)."""
    _decide("approve", run_id, stage, store, comment, form, contracts, json_out)


@app.command("reject")
def reject(  # noqa: PLR0917 - typer maps each option to a parameter
    run_id: str,
    stage: str,
    store: StoreOpt = DEFAULT_STORE,
    comment: CommentOpt = "",
    form: FormOpt = None,
    contracts: ContractsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Reject a waiting approval gate (recorded with who, when, comment and form)."""
    _decide("reject", run_id, stage, store, comment, form, contracts, json_out)


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


# -- start ------------------------------------------------------------------------------------


def _context_arg(text: str) -> dict[str, Any]:
    """``--context``: a JSON object, inline or ``@file``; anything else is a usage error."""
    where = "--context"
    if text.startswith("@"):
        path = Path(text[1:])
        where = f"--context {text}"
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            usage(f"{where}: cannot read {str(path)!r}: {exc}")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        usage(f"{where}: not JSON: {exc}")
    if not isinstance(doc, dict):
        refuse(f"{where}: the context must be a JSON object, not {type(doc).__name__}")
    return doc


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _refuse_admission(reasons: Sequence[Refusal], workflow: str, source: str) -> NoReturn:
    """Exit 1 naming every reason admission gave (each a diagnostic with its code)."""
    refuse(
        f"admission refused the start of {workflow!r}: "
        + "; ".join(f"{r.code}: {r.message}" for r in reasons),
        diagnostics=[Diagnostic(r.code, r.message, Location(source)) for r in reasons],
    )


async def _check_request(
    store: Store, request: dict[str, Any], run_id: str, contracts: Path | None
) -> RunState | Plan:
    """The run the request's key already started, or the plan a new run would start, after
    refusing, exit 1, what an engine would refuse: a key used for another workflow, a workflow
    with no active plan, a bad tenant, a context its plan's contract rejects, or what admission
    refuses (its in-process action check aside: the engine that takes the request has those)."""
    engine = Engine(
        store, open_transport("memory://"), SystemClock(), EngineOptions(dispatch=False),
        catalog=load_catalog_quietly(contracts),
    )  # fmt: skip
    workflow, key = request["workflow"], request["idempotencyKey"]
    existing = await engine.load(run_id)
    if existing is not None:
        if workflow not in (existing.workflow, existing.plan_digest):
            refuse(
                f"idempotency key {key!r} already started run {run_id} of workflow "
                f"{existing.workflow!r}, not {workflow!r}"
            )
        return existing
    try:
        plan = await engine.check_start(workflow, request["context"], request["tenant"])
    except (EngineError, ValidationError) as exc:
        refuse(_one_line(exc))
    admission = Admission(engine, governance="declared")
    reasons = await admission.refusals(plan, request["tenant"], request["requester"])
    reasons = [r for r in reasons if r.code != "admission-no-action"]
    if reasons:
        _refuse_admission(reasons, workflow, plan.source)
    return plan


async def _refusal_of(store: Store, workflow: str, run_id: str) -> list[Refusal] | None:
    """The reasons an engine's admission recorded for refusing ``run_id`` (``None``: none)."""
    for stored in await store.list_runs(200, status=REFUSED_STATUS, workflow=workflow):
        doc = stored.state
        if doc.get("runId") != run_id:
            continue
        said = doc.get("reasons")
        items = said if isinstance(said, list) else []
        return [
            Refusal(str(r.get("code", "")), str(r.get("message", "")))
            for r in items
            if isinstance(r, dict)
        ]
    return None


async def _publish(url: str, message_id: str, body: bytes, timeout_s: float) -> None:
    try:
        transport = open_transport(url)
    except TransportError as exc:
        refuse(masked(url, _one_line(exc)), EXIT_USAGE)
    try:
        await asyncio.wait_for(reach_transport(transport), timeout_s)
        await asyncio.wait_for(transport.publish(RUNS_QUEUE, message_id, body), timeout_s)
    except (TransportError, OSError, TimeoutError) as exc:
        why = _one_line(exc) if not isinstance(exc, TimeoutError) else "no answer"
        refuse(masked(url, f"cannot publish the run request on {url!r}: {why}"))
    finally:
        await transport.close()


async def _await_run(
    store: Store,
    run_id: str,
    timeout_s: float,
    *,
    terminal: bool,
    refused_in: tuple[str, str] | None = None,
) -> RunState | None:
    """The run once it exists (``terminal``: once it has ended), or what there is after
    ``timeout_s``; with ``refused_in`` (workflow, source), a refusal an engine's admission
    recorded for ``run_id`` meanwhile is an exit 1 with its reasons."""
    deadline = time.monotonic() + timeout_s
    pause = 0.02
    while True:
        stored = await store.load(run_id)
        run = RunState.from_json(stored.state) if stored else None
        if run is not None and (run.terminal or not terminal):
            return run
        if run is None and refused_in is not None:
            reasons = await _refusal_of(store, refused_in[0], run_id)
            if reasons is not None:
                _refuse_admission(reasons, refused_in[0], refused_in[1])
        if time.monotonic() >= deadline:
            return run
        await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 0.25)


@app.command("start")
def start(  # noqa: PLR0917 - typer maps each option to a parameter
    workflow: Annotated[str, typer.Argument(help="workflow name (its active plan) or sha256:…")],
    context: Annotated[
        str, typer.Option("--context", help="the run's context: JSON, or @file holding it")
    ] = "{}",
    idempotency_key: Annotated[
        str | None,
        typer.Option("--idempotency-key", help="names the run: asked again, it starts nothing new"),
    ] = None,
    tenant: Annotated[str, typer.Option(help="the run's tenant")] = "default",
    store: StoreOpt = DEFAULT_STORE,
    transport: Annotated[
        str,
        typer.Option("--transport", envvar="ACCORD_TRANSPORT", help="where the engines listen"),
    ] = DEFAULT_STORE,
    wait_start: Annotated[
        float,
        typer.Option("--wait-start", min=0, help="seconds to wait for an engine to start it"),
    ] = 5.0,
    wait: Annotated[bool, typer.Option("--wait", help="wait for the run to end")] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0, help="seconds --wait waits for the end")
    ] = 300.0,
    requester: Annotated[str | None, typer.Option(help="who asks (default: cli:$USER)")] = None,
    contracts: ContractsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Ask the engines to start a run, over the same queue any process uses."""
    doc = _context_arg(context)
    key = idempotency_key if idempotency_key is not None else f"cli-{secrets.token_hex(16)}"
    request: dict[str, Any] = {
        "workflow": workflow,
        "context": doc,
        "tenant": tenant,
        "idempotencyKey": key,
        "requester": (requester or f"cli:{os.environ.get('USER', 'operator')}")[:128],
        "requestedAt": _iso(SystemClock().now_ms()),
    }
    body = json.dumps(request, ensure_ascii=False, sort_keys=True).encode("utf-8")
    try:
        parse_request(body)  # the contract, as the engine will read it
    except BadRequest as exc:
        refuse(str(exc))
    run_id = request_run_id(tenant, key)

    async def go() -> tuple[str, RunState | None]:
        try:
            opened = open_store(store)
        except (ValueError, OSError) as exc:
            refuse(masked(store, f"cannot open store {store!r}: {exc}"), EXIT_USAGE)
        try:
            found = await _check_request(opened, request, run_id, contracts)
            if isinstance(found, RunState):
                state = "existing"
                run: RunState | None = found
            else:
                await _publish(transport, request_message_id(tenant, key), body, 30.0)
                run = await _await_run(
                    opened, run_id, wait_start, terminal=False,
                    refused_in=(found.name, found.source),
                )  # fmt: skip
                state = "queued" if run is None else "started"
            if wait and (run is None or not run.terminal):
                run = await _await_run(opened, run_id, timeout, terminal=True)
            return state, run
        finally:
            await opened.close()

    state, run = _store_guarded(store, go)
    status = run.status if run is not None else None
    ended = run is not None and run.terminal
    if wait and not ended:  # one document either way: the refusal says which run it waited for
        said = "never started" if run is None else f"still {status}"
        refuse(f"run {run_id} did not end within {timeout:g} s ({said})")
    if wait and status != "completed":
        refuse(f"run {run_id} ended {status}")
    if json_out:
        emit_json({
            "ok": True, "state": state, "run_id": run_id, "status": status, "ended": ended,
            "workflow": run.workflow if run is not None else workflow, "tenant": tenant,
            "idempotency_key": key, "queue": RUNS_QUEUE,
        })  # fmt: skip
    elif state == "queued":
        console.print(f"queued: run {run_id} (an engine will start it)", markup=False)
    else:
        said = "started" if state == "started" else "already started (same idempotency key)"
        console.print(f"{said}: run {run_id}  {status}  {workflow}", markup=False)


@app.command("search")
def search(
    query: Annotated[
        str,
        typer.Argument(
            help="terms such as 'workflow:model-ingest status:failed stage:publish tenant:acme "
            "since:1h' (docs/observability.md)"
        ),
    ] = "",
    store: StoreOpt = DEFAULT_STORE,
    projection: Annotated[
        str | None,
        typer.Option("--projection", envvar="ACCORD_PROJECTION", help="search projection URL"),
    ] = None,
    limit: Annotated[int, typer.Option(min=0, max=10_000)] = 50,
    json_out: JsonOpt = False,
) -> None:
    """Search runs in the search projection (a derived index; it says how far it lags)."""
    from accord.cli.telemetry import run_search  # noqa: PLC0415

    run_search(query, store, projection, limit, json_out)
