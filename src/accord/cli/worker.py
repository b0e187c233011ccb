"""`accord worker run MODULE[:ATTR]`: serve a :class:`~accord.worker.Worker` against any transport.

``MODULE[:ATTR]`` names the worker object (``ATTR`` defaults to ``worker``), for example
``accord_worker_thumbnail_render.handler:worker``. The transport is any URL the adapters open
(``sqlite:///…``, ``bullmq://…``, ``amqp://…``, ``memory://``); with ``--store`` the worker
announces its capabilities there with a TTL, which is what admission checks, and reads a job's run
record there before running it: a job whose attempt the engine superseded is not run. Requests and
results are validated against the contracts in ``schemas/contracts`` of the enclosing repository
(or ``--contracts DIR``). SIGINT/SIGTERM shut down gracefully: stop consuming, finish in-flight
jobs. ``--claims URL`` is the object store a ``payloadRef`` job is checked out of and verified
against (default on the embedded SQLite transport: ``.accord/claims``, where the engine checks
payloads in; a tampered object is the terminal ``corrupt-payload``). ``--connections FILE`` is the
connection registry ``storageConnectionRef`` names resolve in (docs/objects.md). A broker
transport that does not answer within ``--connect-timeout`` (30 s), or a ``--store``
that cannot be read, is a one-line refusal, exit 1; once running, a lost broker is retried, each
failure logged on one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import re
import signal
from pathlib import Path
from typing import Annotated

import typer

from accord.cli._common import LoopOpt, console, pick_loop, refuse, usage
from accord.cli._connect import (
    DEFAULT_CONNECT_TIMEOUT,
    OneLineFailures,
    claim_store,
    connect_timeout,
    masked,
    reach_or_refuse,
)
from accord.cli._redaction import configure_logging, note_requests, sealing_or_exit
from accord.contracts.sources import find_root, load_catalog
from accord.errors import AccordError
from accord.loop import run as run_on_loop
from accord.objects.ports import ObjectStore

STATE = Path(".accord/worker")
CLAIMS = Path(".accord/claims")  # the engine's default claim store on the embedded default
app = typer.Typer(help="Run workers built with the Worker SDK.", no_args_is_help=True)


def load_worker(spec: str) -> object:
    """The object named by ``MODULE[:ATTR]``; ``typer.Exit(2)`` with a clear message otherwise."""
    from accord.worker import Worker  # noqa: PLC0415 - keep `accord --help` light

    module_name, _, attr = spec.partition(":")
    if not _DOTTED.fullmatch(module_name) or not _ATTR.fullmatch(attr):
        usage(
            f"MODULE[:ATTR] {spec!r} is not a module name: expected dotted Python identifiers, "
            "optionally ':' and an attribute (e.g. my_worker.handler:worker)"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        usage(f"MODULE[:ATTR] {spec!r}: cannot import {module_name!r}: {exc}")
    except Exception as exc:  # the module itself failed while being imported
        usage(f"MODULE[:ATTR] {spec!r}: importing {module_name!r} failed: {_one_line(exc)}")
    found = getattr(module, attr or "worker", None)
    if not isinstance(found, Worker):
        got = "nothing" if found is None else f"a {type(found).__name__}"
        usage(f"MODULE[:ATTR] {spec!r} is not a Worker: {module_name}.{attr or 'worker'} is {got}")
    return found


_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = re.compile(rf"{_IDENT}(?:\.{_IDENT})*")
_ATTR = re.compile(rf"(?:{_IDENT})?")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _claims(url: str | None, transport: str) -> ObjectStore | None:
    """``--claims`` of a worker: by default ``.accord/claims`` (where ``accord engine run``
    checks payloads in on the embedded default) when the transport is the embedded queue."""
    return claim_store(url, CLAIMS if transport.startswith("sqlite:") else None)


def _storage(path: Path) -> object:
    """``--connections FILE``: a :class:`~accord.worker.storage.StorageMap` over the registry
    the file describes (``local``, unless the file names a connection of that name, stays the
    default folder); a file that cannot be read or is malformed is a one-line refusal naming the
    file and the field, exit 1."""
    from accord.adapters.objects.connections import (  # noqa: PLC0415
        ConnectionRegistry,
        RegistryError,
    )
    from accord.worker.storage import DEFAULT_REF, StorageMap  # noqa: PLC0415

    try:
        registry = ConnectionRegistry.from_file(path)
    except RegistryError as exc:
        refuse(f"worker not started: --connections: {exc}")
    roots = {} if DEFAULT_REF in registry else StorageMap.local().roots
    return StorageMap(roots=roots, registry=registry)


@app.command("run")
def run(
    spec: Annotated[str, typer.Argument(metavar="MODULE[:ATTR]", help="The Worker to serve.")],
    transport: Annotated[str, typer.Option("--transport", help="Transport URL.")],
    *,
    store: Annotated[str | None, typer.Option("--store", help="Store URL to announce in.")] = None,
    contracts: Annotated[Path | None, typer.Option("--contracts", help="Contract sources.")] = None,
    state: Annotated[Path, typer.Option("--state", help="Acceptance records.")] = STATE,
    slots: Annotated[int, typer.Option("--slots", min=1, help="Handlers at once.")] = 4,
    heartbeat_ms: Annotated[int, typer.Option("--heartbeat-ms", min=10)] = 5_000,
    connect_timeout_opt: Annotated[
        str,
        typer.Option(
            "--connect-timeout", help="how long to wait for the transport's broker at start"
        ),
    ] = DEFAULT_CONNECT_TIMEOUT,
    claims: Annotated[
        str | None,
        typer.Option(
            "--claims",
            help="object store payloadRef jobs are checked out of (file:///dir, s3://…; "
            "default on an embedded transport: .accord/claims; off: none)",
        ),
    ] = None,
    connections: Annotated[
        Path | None,
        typer.Option(
            "--connections",
            help="connection registry (JSON) that storageConnectionRef names resolve in",
        ),
    ] = None,
    loop: LoopOpt = "auto",
) -> None:
    """Serve MODULE[:ATTR] until interrupted."""
    chosen_loop = pick_loop(loop)
    connect_s = connect_timeout(connect_timeout_opt)
    from accord.adapters import open_store, open_transport  # noqa: PLC0415
    from accord.worker import AcceptanceLog, Runtime, Worker, store_announcer  # noqa: PLC0415
    from accord.worker.superseded import store_current  # noqa: PLC0415

    worker = load_worker(spec)
    assert isinstance(worker, Worker)
    claim_store = _claims(claims, transport)
    if connections is not None:
        worker.services["storage"] = _storage(connections)
    try:
        catalog = load_catalog(contracts or find_root() / "schemas" / "contracts")
        port = open_transport(transport)
        store_port = open_store(store) if store else None
        announcer = store_announcer(store_port) if store_port else None
        current = store_current(store_port) if store_port else None
    except AccordError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        refuse(f"worker not started: {first}", diagnostics=getattr(exc, "diagnostics", ()))
    note_requests(worker, configure_logging(catalog), catalog)  # logs mask sensitive values
    OneLineFailures(transport, store or "").install()  # a lost broker: one line per failure
    sealing = sealing_or_exit("worker")  # opens sealed requests, seals sensitive results
    log = AcceptanceLog(state / f"{worker.name}.acceptance.db")
    runtime = Runtime(worker, port, catalog=catalog, acceptance=log, announce=announcer,
                      slots=slots, heartbeat_ms=heartbeat_ms, sealing=sealing,
                      current=current, claims=claim_store)  # fmt: skip
    console.print(
        f"serving {', '.join(worker.capabilities)} on {', '.join(runtime.queues)} "
        f"as {runtime.worker_id} ({chosen_loop} loop)"
    )

    async def serve() -> None:
        stop = asyncio.Event()
        running = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                running.add_signal_handler(sig, stop.set)
        try:
            if store_port is not None:  # an unreachable store is a refusal, not a retry loop
                try:
                    await store_port.live_capabilities(0)
                except AccordError as exc:
                    why = " ".join(str(exc).split())
                    refuse(masked(store or "", f"worker not started: {why}"))
            await reach_or_refuse("worker", port, transport, connect_s)
            await runtime.run(stop)
        finally:
            await port.close()
            if store_port is not None:
                await store_port.close()
            log.close()

    run_on_loop(serve(), chosen_loop)
    console.print(f"stopped after {runtime.stats['served']} jobs")
