"""`accord serve`: the HTTP control plane (REST under ``/v1``, OpenAPI at ``/openapi.json``).

``accord serve`` on its own is the embedded default in one command: the API, the engine (the
same loops as ``accord engine run``: reconcile, dispatch, timers, outcome and run intake) and the
platform actions in one process over ``sqlite:///.accord/accord.db``. With ``--no-engine`` it
runs beside engines started with ``accord engine run``: runs are started by publishing
``run-requested@1`` on the transport, cancellations and re-drives are committed to the store and
published by the engines' sweep, exactly as ``accord runs`` does.

Principals authenticate with bearer API keys (``accord keys create``), kept with the audit log
and idempotency claims in the control file (:mod:`accord.adapters.ingress.control`; beside a
SQLite store by default, ``--control`` otherwise); with ``--jwks FILE`` JWTs signed by those
keys are accepted too (``--issuer``, ``--audience``). ``--port 0`` takes a free port; the line
``serving on http://HOST:PORT`` names the one bound. SIGINT or SIGTERM stop the server (requests
in hand finish), then the engine, gracefully.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from accord.cli._common import LoopOpt, console, pick_loop, refuse, usage
from accord.cli._connect import (
    DEFAULT_CONNECT_TIMEOUT,
    OneLineFailures,
    connect_timeout,
    reach_or_refuse,
)
from accord.cli._redaction import (
    configure_logging,
    redaction_of,
    run_observer,
    sealing_or_exit,
    warn_unsealed,
)
from accord.cli.alerts import AlertRulesOpt, existing_book, rules_or_exit
from accord.cli.telemetry import (
    Observing,
    ProjectionOpt,
    TraceSampleOpt,
    observe_engine,
    projection_for,
    ratio_or_exit,
)
from accord.contracts.catalog import Catalog
from accord.contracts.redact import scrub_pattern
from accord.engine.machine.state import RunState
from accord.engine.ports import Store
from accord.errors import AccordError, ContractLintError
from accord.loop import run as run_on_loop

__all__ = ["serve", "serve_forever"]

DEFAULT_URL = "sqlite:///.accord/accord.db"


def _catalog(contracts: Path) -> tuple[Catalog | None, Path | None]:
    """The catalog workflows compile against and the repository root contracts are shown from
    (``None`` for either when there is none)."""
    from accord.contracts.sources import find_root, load_catalog  # noqa: PLC0415

    folder = contracts
    if not folder.is_absolute() and not folder.exists():
        folder = find_root() / contracts
    if not folder.is_dir():
        return None, None
    try:
        catalog = load_catalog(folder)
    except ContractLintError as exc:
        refuse(f"the contracts in {folder} do not lint", diagnostics=exc.diagnostics)
    root = folder.parent.parent if folder.parent.name == "schemas" else None
    return catalog, root


if TYPE_CHECKING:
    from accord.adapters.ingress.ui import Objects


def _view(catalog: Catalog | None) -> Any:
    """How the API shows a run: the CLI's redaction (sensitive fields masked, echoes scrubbed)."""

    async def view(
        store: Store, run: RunState, history: list[dict[str, Any]]
    ) -> tuple[dict[str, Any], list[dict[str, Any]], re.Pattern[str] | None]:
        redaction = await redaction_of(store.get_plan, run, catalog)
        pattern = scrub_pattern(redaction.values(run, history))
        shown = [redaction.entry_json(h, pattern) for h in history]
        return redaction.run_json(run, pattern), shown, pattern

    return view


class _Server:
    """uvicorn's server, told to stop by our signal handlers (uvicorn's own re-raise the signal
    once it has stopped, which would end the process before the engine stops)."""

    def __init__(self, app: Any, host: str, port: int, log_level: str) -> None:
        import uvicorn  # noqa: PLC0415 - only `accord serve` needs it

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield  # the caller's handlers set should_exit

        config = uvicorn.Config(
            app, host=host, port=port, log_level=log_level, lifespan="off", access_log=False,
            timeout_graceful_shutdown=5,
        )  # fmt: skip
        self.server = Server(config)

    def stop(self) -> None:
        self.server.should_exit = True

    def bound(self) -> str:
        for server in getattr(self.server, "servers", []):
            for sock in server.sockets:
                host, port = sock.getsockname()[:2]
                return f"http://{host}:{port}"
        return "?"


REMOTE_ANNOUNCE_MS = 30_000  # how long one announcement of the configured remotes lasts


async def _announce_remotes(engine: Any, capabilities: list[str]) -> None:
    """Announce the capabilities the remote-worker file names, as a worker ``remote-workers``,
    for as long as the server runs: admission takes them as live (a remote that is down only
    fails its deliveries, which the dispatcher retries until the attempt's queue deadline)."""
    while True:
        await engine.announce("remote-workers", capabilities, REMOTE_ANNOUNCE_MS)
        await asyncio.sleep(REMOTE_ANNOUNCE_MS / 3000)


async def serve_forever(
    store: str,
    transport: str,
    host: str,
    port: int,
    *,
    engine_here: bool = True,
    platform: bool = True,
    state: Path = Path(".accord"),
    contracts: Path = Path("schemas/contracts"),
    control: str | None = None,
    jwks: Path | None = None,
    issuer: str | None = None,
    audience: str | None = None,
    rate: float = 50.0,
    burst: int = 100,
    max_body: int = 1_048_576,
    connect_s: float = 30.0,
    log_level: str = "warning",
    announce: str = "",
    remote_workers: Path | None = None,
    trigger_sources: Path | None = None,
    claims: str | None = None,
    projection: str | None = None,
    alert_rules: str = "on",
    trace_sample: float | None = None,
    objects: Path | None = None,
) -> None:
    """Run the API (and, with ``engine_here``, the engine) until SIGINT or SIGTERM."""
    from accord.adapters import open_engine  # noqa: PLC0415
    from accord.adapters.ingress.app import create_app  # noqa: PLC0415
    from accord.adapters.ingress.auth import JwtVerifier  # noqa: PLC0415
    from accord.adapters.ingress.control import ControlStore, control_path  # noqa: PLC0415
    from accord.adapters.ingress.limits import ApiLimits  # noqa: PLC0415
    from accord.adapters.telemetry import otel  # noqa: PLC0415
    from accord.cli.engine import _with_platform, claims_or_exit  # noqa: PLC0415
    from accord.engine.runtime.orchestrator import EngineOptions  # noqa: PLC0415

    rules = rules_or_exit(alert_rules) if engine_here else None  # evaluated where the engine is
    catalog, root = _catalog(contracts)
    redacting = configure_logging(catalog)
    OneLineFailures(store, transport).install()
    warn_unsealed(store)
    sealing = sealing_or_exit("server", catalog, needs_catalog=True)
    verifier = None
    if jwks is not None:
        try:
            verifier = JwtVerifier(jwks, issuer=issuer, audience=audience)
        except ValueError as exc:
            usage(str(exc))
    remote = None
    if remote_workers is not None:
        from accord.adapters.ingress.remote import load_remote_config  # noqa: PLC0415

        try:
            remote = load_remote_config(remote_workers)
        except AccordError as exc:
            usage(str(exc))
    where = control_path(store, control)
    try:
        controls = ControlStore(where)
    except AccordError as exc:
        usage(str(exc))
    search = projection_for(projection, store, writes=engine_here)  # read here, written by engines
    engine = open_engine(
        store, transport, options=EngineOptions(dispatch=engine_here), catalog=catalog,
        sealing=sealing, remote=remote, claims=claims_or_exit(claims, store, state),
        sink=otel.register(search.sink, ratio=trace_sample),  # spans when OTEL_* says so
    )  # fmt: skip
    search.attach(engine)
    callbacks = None
    if remote is not None:
        from accord.adapters.ingress.callbacks import CallbackIntake  # noqa: PLC0415
        from accord.adapters.ingress.webhooks import SqliteReplayStore  # noqa: PLC0415

        # webhook-ids seen, beside the control file: every API process on it shares them
        replay = SqliteReplayStore(where.with_name(where.name + ".replay"))
        callbacks = CallbackIntake.from_config(remote, engine.transport, replay=replay)
    engine.observers.append(run_observer(redacting, engine, catalog))
    announcing: asyncio.Task[None] | None = None
    observing = Observing()  # the alert evaluation, once the engine runs
    triggers_here = None  # webhook intake, schedules and message triggers (docs/triggers.md)
    try:
        await reach_or_refuse("server", engine.transport, transport, connect_s)
        if platform:  # also without the engine here: admission counts these actions as live
            await _with_platform(engine, state, contracts, [])
        # remote HTTP workers answer with signed callbacks on POST /v1/callbacks
        app = create_app(
            engine,
            controls,
            starts="engine" if engine_here else "queue",
            catalog=catalog,
            root=root,
            view=_view(catalog),
            jwt=verifier,
            limits=ApiLimits(max_body_bytes=max_body, rate_per_s=rate, burst=burst),
            callbacks=callbacks,
        )
        app.state.projection = search.projection  # GET /v1/search
        app.state.objects = _object_map(objects, state)  # GET /v1/runs/{id}/objects
        if trigger_sources is not None:
            from accord.adapters.ingress import triggers as trig  # noqa: PLC0415

            try:
                triggers_here = await trig.mount_triggers(app, engine, trigger_sources,
                                                          run=engine_here)  # fmt: skip
            except trig.SourcesError as exc:
                usage(str(exc))
        server = _Server(app, host, port, log_level)
        running = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            running.add_signal_handler(sig, server.stop)
        if engine_here:
            await engine.start()
            observing = await observe_engine(engine, search, rules, state, None, exposed=True)
        app.state.alerts = observing.book or existing_book(state)  # GET /v1/alerts
        if remote is not None and (
            named := sorted({r.capability for r in remote.remotes.values() if r.capability})
        ):
            announcing = running.create_task(_announce_remotes(engine, named))
        gc.collect()
        gc.freeze()
        task = running.create_task(server.server.serve())
        while not server.server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.server.started:
            mode = "with the engine" if engine_here else "beside the engines"
            console.print(
                f"serving on {server.bound()} ({mode}, store {store})", markup=False, soft_wrap=True
            )
            if announce:
                console.print(announce, markup=False, soft_wrap=True)
        await task
    finally:
        if announcing is not None:
            announcing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await announcing
        if triggers_here is not None:
            await triggers_here.stop()
        await observing.close()
        await engine.stop()
        await search.close()
        controls.close()
        if callbacks is not None:
            await callbacks.verifier.replay.close()


def _object_map(objects: Path | None, state: Path) -> Objects | None:
    """The objects the UI's previews are read from: ``--objects``, else ``STATE/objects`` when
    that folder exists, else none (``/v1/runs/{id}/objects`` answers ``404 no-object-store``)."""
    from accord.worker.storage import StorageMap  # noqa: PLC0415

    chosen = objects if objects is not None else state / "objects"
    return StorageMap.local(chosen) if chosen.is_dir() else None


def serve(  # noqa: PLR0917 - typer maps each option to a parameter
    store: Annotated[str, typer.Option("--store", envvar="ACCORD_STORE")] = DEFAULT_URL,
    transport: Annotated[str, typer.Option("--transport", envvar="ACCORD_TRANSPORT")] = DEFAULT_URL,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="0: a free port")] = 8420,
    no_engine: Annotated[
        bool, typer.Option("--no-engine", help="run beside `accord engine run` processes")
    ] = False,
    platform: Annotated[
        bool, typer.Option(help="register the platform actions (cache, catalogue, audit)")
    ] = True,
    state: Annotated[Path, typer.Option(help="platform actions' state folder")] = Path(".accord"),
    contracts: Annotated[Path, typer.Option(help="contract sources")] = Path("schemas/contracts"),
    control: Annotated[
        str | None,
        typer.Option(help="control file (keys, audit); default beside a SQLite store"),
    ] = None,
    jwks: Annotated[
        Path | None, typer.Option(help="accept JWT bearer tokens signed by this JWKS's keys")
    ] = None,
    issuer: Annotated[str | None, typer.Option(help="the iss a JWT must carry")] = None,
    audience: Annotated[str | None, typer.Option(help="the aud a JWT must carry")] = None,
    rate: Annotated[
        float, typer.Option(min=0, help="requests per second per principal (0: no limit)")
    ] = 50.0,
    burst: Annotated[int, typer.Option(min=1, help="requests a principal may burst")] = 100,
    max_body: Annotated[
        int, typer.Option("--max-body", min=1, help="largest request body in bytes")
    ] = 1_048_576,
    connect_timeout_opt: Annotated[
        str, typer.Option("--connect-timeout", help="how long to wait for the broker at start")
    ] = DEFAULT_CONNECT_TIMEOUT,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level")] = "warning",
    remote_workers: Annotated[
        Path | None,
        typer.Option(
            "--remote-workers",
            help="queues served by remote HTTP workers (docs/remote-workers.md); "
            "mounts POST /v1/callbacks",
        ),
    ] = None,
    trigger_sources: Annotated[
        Path | None,
        typer.Option(
            "--trigger-sources",
            help="webhook sources, and the workflows whose triggers run here (docs/triggers.md); "
            "mounts POST /v1/triggers/{workflow}/{trigger}",
        ),
    ] = None,
    claims: Annotated[
        str | None,
        typer.Option(
            "--claims",
            help="object store for claim checks (file:///dir, s3://…; default on the embedded "
            "store: STATE/claims; off: none)",
        ),
    ] = None,
    projection: ProjectionOpt = None,
    alert_rules: AlertRulesOpt = "on",
    trace_sample: TraceSampleOpt = None,
    objects: Annotated[
        Path | None,
        typer.Option(
            "--objects",
            help="object folder the UI's previews are read from (default: STATE/objects, if any)",
        ),
    ] = None,
    loop: LoopOpt = "auto",
) -> None:
    """Serve the HTTP control plane (with the engine in this process unless --no-engine)."""
    chosen_loop = pick_loop(loop)
    connect_s = connect_timeout(connect_timeout_opt)
    if jwks is not None and not jwks.is_file():
        usage(f"--jwks {jwks}: no such file")
    if remote_workers is not None and not remote_workers.is_file():
        usage(f"--remote-workers {remote_workers}: no such file")
    if trigger_sources is not None and not trigger_sources.is_file():
        usage(f"--trigger-sources {trigger_sources}: no such file")
    if objects is not None and not objects.is_dir():
        usage(f"--objects {objects}: no such folder")
    run_on_loop(
        serve_forever(
            store, transport, host, port, engine_here=not no_engine, platform=platform,
            state=state, contracts=contracts, control=control, jwks=jwks, issuer=issuer,
            audience=audience, rate=rate, burst=burst, max_body=max_body, connect_s=connect_s,
            log_level=log_level, remote_workers=remote_workers, trigger_sources=trigger_sources,
            claims=claims, projection=projection, alert_rules=alert_rules,
            trace_sample=ratio_or_exit(trace_sample), objects=objects,
        ),
        chosen_loop,
    )  # fmt: skip


def serve_demo(  # noqa: PLR0917 - what `accord demo --serve` hands over
    store: str, transport: str, state: Path, contracts: Path, tenant: str, loop: str
) -> None:
    """`accord demo --serve`: an admin key for the demo's tenant (printed once), then the API
    with the engine on the demo's store until SIGINT or SIGTERM."""
    from accord.adapters.ingress.control import ControlStore, control_path  # noqa: PLC0415

    controls = ControlStore(control_path(store))
    try:
        secret, key = controls.create_key("admin", [tenant], name="accord demo --serve")
        controls.audit("cli:demo", tenant, "demo-serve", action="key.create", target=key.key_id,
                       detail={"role": "admin"})  # fmt: skip
    finally:
        controls.close()
    said = f"admin key for tenant {tenant} (shown once): {secret}"
    run_on_loop(
        serve_forever(store, transport, "127.0.0.1", 8420, state=state, contracts=contracts,
                      announce=said),
        loop,
    )  # fmt: skip
