"""`accord engine`: run the durable engine process.

``accord engine run --store sqlite:///.accord/accord.db --transport sqlite:///.accord/accord.db``
reconciles first (stranded outbox entries, overdue deadlines, dead-lettered jobs), then runs the
dispatcher sweep, timer service, outcome intake, run intake (``run-requested@1`` messages on
``accord.runs``, which ``accord runs start`` and any other process publish) and periodic
reconciliation until SIGINT or SIGTERM, when it stops gracefully: loops stop, in-flight commits
finish, ports close. Several processes may run against the same store. Every
``--canary-every-ms`` (5 s) the engine promotes or aborts a running canary whose criteria decide
(as ``accord workflow promote --auto``; one decision across all engines). Ended runs are removed
once they saw no change for ``--history-retention`` (30 days; ``off`` keeps them). The platform
actions (cache lookup, catalogue, audit) are registered here unless ``--no-platform``: the engine
that starts a run or commits its next transition runs its action stages itself, so a run started
from any process finds them; an engine without a plan's actions leaves that plan's run requests
to one that has them (:mod:`accord.engine.runtime.requests`). Job payloads above the claim-check
threshold travel as ``payloadRef`` in the object store ``--claims`` names (default on the embedded
store: ``STATE/claims``; docs/protocol.md §9). ``reconcile`` runs one pass and prints its report. A
broker transport (``bullmq://``, ``amqp://``) that does not answer within ``--connect-timeout`` (30
s) is a one-line refusal, exit 1; once running, a lost broker is retried, each failure logged on one
line.
"""

from __future__ import annotations

import asyncio
import gc
import signal
from pathlib import Path
from typing import Annotated, Any

import typer

from accord.adapters import open_engine, open_store
from accord.adapters.clock import SystemClock
from accord.cli._common import LoopOpt, console, emit_json, pick_loop, usage
from accord.cli._connect import (
    DEFAULT_CONNECT_TIMEOUT,
    OneLineFailures,
    claim_store,
    connect_timeout,
    reach_or_refuse,
)
from accord.cli._redaction import (
    configure_logging,
    load_catalog_quietly,
    run_observer,
    sealing_or_exit,
    warn_unsealed,
)
from accord.cli.alerts import AlertRulesOpt, rules_or_exit
from accord.cli.telemetry import (
    MetricsOpt,
    ProjectionOpt,
    TraceSampleOpt,
    metrics_or_exit,
    observe_engine,
    projection_for,
    ratio_or_exit,
)
from accord.engine.ports import Shards
from accord.engine.runtime.holding import HOLD_MS
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.engine.runtime.retention import parse_duration
from accord.errors import StoreError, TransportError
from accord.loop import run as run_on_loop
from accord.objects.ports import ObjectStore

app = typer.Typer(help="Run the durable engine.", no_args_is_help=True)

DEFAULT_URL = "sqlite:///.accord/accord.db"
StoreOpt = Annotated[str, typer.Option("--store", envvar="ACCORD_STORE", help="store URL")]
TransportOpt = Annotated[
    str, typer.Option("--transport", envvar="ACCORD_TRANSPORT", help="transport URL")
]


ClaimsOpt = Annotated[
    str | None,
    typer.Option(
        "--claims",
        help="object store for claim checks (file:///dir, s3://…; default on the embedded "
        "store: STATE/claims; off: none)",
    ),
]


def claims_or_exit(url: str | None, store: str, state: Path) -> ObjectStore | None:
    """``--claims`` of an engine: by default ``STATE/claims`` beside the embedded SQLite store
    (:func:`~accord.cli._connect.claim_store`)."""
    return claim_store(url, state / "claims" if store.startswith("sqlite:") else None)


@app.command("run")
def run(  # noqa: PLR0917 - typer maps each option to a parameter
    store: StoreOpt = DEFAULT_URL,
    transport: TransportOpt = DEFAULT_URL,
    owner: Annotated[str | None, typer.Option(help="this process's lease owner name")] = None,
    poll_ms: Annotated[int, typer.Option(min=1, help="timer and housekeeping poll")] = 50,
    lease_ms: Annotated[int, typer.Option(min=100, help="timer and outbox lease")] = 30_000,
    grace_ms: Annotated[int, typer.Option(min=0, help="age before the sweep republishes")] = 5_000,
    shard_lease_ms: Annotated[
        int,
        typer.Option(min=200, help="shard lease: an engine silent this long loses its shards"),
    ] = 10_000,
    canary_every_ms: Annotated[
        int, typer.Option(min=0, help="how often running canaries are settled (0: never)")
    ] = 5_000,
    cache_size: Annotated[
        int, typer.Option(min=1, help="live runs of its shards the engine keeps in memory")
    ] = 4096,
    platform: Annotated[
        bool, typer.Option(help="run the platform actions (cache, catalogue, audit) here")
    ] = True,
    state: Annotated[Path, typer.Option(help="platform actions' state folder")] = Path(".accord"),
    contracts: Annotated[Path, typer.Option(help="contract sources")] = Path("schemas/contracts"),
    workflow: Annotated[
        list[str] | None, typer.Option(help="cache results of this active workflow (repeatable)")
    ] = None,
    accept_linger_ms: Annotated[
        float, typer.Option(min=0, help="how long news of an attempt may wait to share a commit")
    ] = 5.0,
    store_hold_ms: Annotated[
        int,
        typer.Option(
            min=0, help="how long an outcome waits for an unavailable store before it is nacked"
        ),
    ] = HOLD_MS,
    history_retention: Annotated[
        str,
        typer.Option(
            "--history-retention",
            help="remove ended runs after this long without change (30d, 12h; off: keep)",
        ),
    ] = "30d",
    connect_timeout_opt: Annotated[
        str,
        typer.Option(
            "--connect-timeout", help="how long to wait for the transport's broker at start"
        ),
    ] = DEFAULT_CONNECT_TIMEOUT,
    claims: ClaimsOpt = None,
    projection: ProjectionOpt = None,
    alert_rules: AlertRulesOpt = "on",
    metrics_at: MetricsOpt = None,
    trace_sample: TraceSampleOpt = None,
    loop: LoopOpt = "auto",
) -> None:
    """Run the engine until interrupted."""
    chosen_loop = pick_loop(loop)
    rules, metrics_addr = rules_or_exit(alert_rules), metrics_or_exit(metrics_at)
    ratio = ratio_or_exit(trace_sample)
    claim_store = claims_or_exit(claims, store, state)
    retention_ms = _retention(history_retention)
    connect_s = connect_timeout(connect_timeout_opt)
    catalog = load_catalog_quietly(contracts)  # which fields logs must mask
    redacting = configure_logging(catalog)
    OneLineFailures(store, transport).install()  # a lost broker or store: one line per failure
    warn_unsealed(store)
    sealing = sealing_or_exit("engine", catalog, needs_catalog=True)  # a bad key: exit 2

    async def serve() -> None:
        from accord.adapters.telemetry import otel  # noqa: PLC0415 - the SDK only when used

        search = projection_for(projection, store)  # the search projection (or none)
        engine = open_engine(
            store,
            transport,
            sink=otel.register(search.sink, ratio=ratio),  # spans when OTEL_* says so
            options=EngineOptions(
                owner=owner,
                poll_ms=poll_ms,
                lease_ms=lease_ms,
                grace_ms=grace_ms,
                shard_lease_ms=shard_lease_ms,
                cache_size=cache_size,
                canary_every_ms=canary_every_ms,
                accept_linger_ms=accept_linger_ms,
                store_hold_ms=store_hold_ms,
                retention_ms=retention_ms,
            ),
            catalog=catalog,
            sealing=sealing,
            claims=claim_store,
        )
        search.attach(engine)
        engine.observers.append(run_observer(redacting, engine, catalog))
        try:  # an unreachable broker: a bounded wait, then one line and exit 1
            await reach_or_refuse("engine", engine.transport, transport, connect_s)
        except BaseException:
            await engine.stop()
            await search.close()
            raise
        if platform:
            await _with_platform(engine, state, contracts, workflow or [])
        stop = asyncio.Event()
        running = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            running.add_signal_handler(sig, stop.set)
        await engine.start()
        observing = await observe_engine(engine, search, rules, state, metrics_addr)
        # start-up objects (modules, plans, schemas) live forever: take them out of the cyclic
        # collector's scans, which otherwise pause the loop for milliseconds mid-transition
        gc.collect()
        gc.freeze()
        keeper = engine.shards
        console.print(
            f"engine {engine.owner} running on {store} ({chosen_loop} loop; owns"
            f" {len(keeper.owned)} of {keeper.count} shards, {len(keeper.live)} engine(s) live)"
        )
        await stop.wait()
        await observing.close()
        await engine.stop()
        await search.close()
        console.print(f"engine {engine.owner} stopped after {engine.transitions} transitions")

    run_on_loop(serve(), chosen_loop)


def _retention(text: str) -> int | None:
    """``--history-retention`` in milliseconds; ``None`` for ``off`` (or ``0``): keep for ever."""
    if text.strip().lower() in ("off", "never", "forever", "0"):
        return None
    try:
        return parse_duration(text) or None
    except ValueError as exc:
        usage(f"--history-retention: {exc}; or off to keep ended runs")


async def _with_platform(
    engine: Engine, state: Path, contracts: Path, workflows: list[str]
) -> None:
    """Register the platform actions and the result contract check, as ``accord demo`` does."""
    from accord.actions import PlatformConfig, register_platform_actions  # noqa: PLC0415
    from accord.contracts.sources import find_root, load_catalog  # noqa: PLC0415
    from accord.engine.runtime.checks import contract_result_check  # noqa: PLC0415

    if not contracts.is_absolute() and not contracts.exists():
        contracts = find_root() / contracts
    catalog = load_catalog(contracts)

    async def load_run(run_id: str) -> dict[str, Any] | None:
        stored = await engine.store.load(run_id)
        return dict(stored.state) if stored else None

    config = PlatformConfig(state, catalog=catalog, load_run=load_run)
    platform = register_platform_actions(engine.registry, config)
    engine.result_checks.append(contract_result_check(catalog))
    engine.observers.append(platform.writer)
    for name in workflows:
        digest = await engine.store.get_active(name)
        if digest is None:
            raise typer.BadParameter(
                f"no active version of workflow {name!r}", param_hint="--workflow"
            )
        platform.writer.watch(await engine.plan(digest))


@app.command("shards")
def shards(
    store: StoreOpt = DEFAULT_URL,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show the store's shards: which engine owns each, at which epoch, for how much longer."""

    async def read() -> dict[str, Any]:
        opened = open_store(store)
        try:
            if not isinstance(opened, Shards):
                usage(f"store {store!r} keeps no shard leases")
            now = SystemClock().now_ms()
            leases = await opened.shard_leases()
            owners = sorted({lease.owner for lease in leases if lease.expires_at_ms > now})
            return {
                "shards": opened.shard_count,
                "engines": owners,  # the engines holding a lease now
                "leases": [
                    {
                        "shard": lease.shard,
                        "owner": lease.owner if lease.expires_at_ms > now else None,
                        "epoch": lease.epoch,
                        "expires_in_ms": max(lease.expires_at_ms - now, 0),
                    }
                    for lease in leases
                ],
            }
        finally:
            await opened.close()

    try:
        report = asyncio.run(read())
    except (StoreError, TransportError) as exc:
        usage(str(exc))
    if json_out:
        emit_json(report)
        return
    owners = ", ".join(report["engines"]) or "none"
    console.print(f"{report['shards']} shard(s); engines holding leases: {owners}")
    for row in report["leases"]:
        owner = row["owner"] or "(free)"
        console.print(
            f"  shard {row['shard']:>4}  {owner:<24} epoch {row['epoch']:<6}"
            f" expires in {row['expires_in_ms']} ms"
        )


@app.command("reconcile")
def reconcile(
    store: StoreOpt = DEFAULT_URL,
    transport: TransportOpt = DEFAULT_URL,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Run one reconciliation pass and report what was repaired or found diverging."""

    async def once() -> dict[str, object]:
        engine = open_engine(store, transport, options=EngineOptions(grace_ms=0))
        try:
            report = await engine.reconcile()
            await engine.executor.wait_idle()
            return report.to_json()
        finally:
            await engine.stop()

    try:
        report = asyncio.run(once())
    except (StoreError, TransportError) as exc:  # cannot open or reach the store or transport
        usage(str(exc))
    if json_out:
        emit_json(report)
    else:
        for key, value in report.items():
            console.print(f"{key}: {value}")
