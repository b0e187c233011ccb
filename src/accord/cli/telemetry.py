"""`accord telemetry`: the search projection of durable history (docs/observability.md).

``rebuild`` replaces the projection with documents rebuilt from every run in the store (the same
documents the live projector writes). ``verify`` compares all of the projection (or ``--sample
N`` recent runs) with the store and reports each divergence; exit 1 when any is found.
``failures`` lists the documents the projector could not index after its retries, ``redrive``
indexes their runs again. ``status`` says how far the projection has got.

``--projection`` names the projection (``sqlite:///…``, ``postgresql://…``); by default it is the
SQLite file beside a SQLite store (``accord.db`` → ``accord.projection.db``). The same option on
``accord engine run``, ``accord serve`` and ``accord demo`` turns the live projector on (``off``
turns it off; any store other than SQLite has no default).

:func:`observe_engine` is what a serving engine process adds beside the projector: the alert
evaluation (``--alert-rules``, :mod:`accord.cli.alerts`) and, with ``--metrics [HOST:]PORT`` on
``accord engine run``, the engine's metrics served as Prometheus text on ``/metrics`` (loopback
unless a host is named; ``accord serve`` has ``/metrics`` on its API already).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from accord.adapters import open_store
from accord.adapters.clock import SystemClock
from accord.adapters.projection import default_projection_url, open_projection
from accord.adapters.telemetry import FanoutSink
from accord.cli._common import EXIT_OK, EXIT_REFUSED, console, emit_json, refuse, usage
from accord.engine.ports import Projection, SearchQuery, SearchResult, Store
from accord.engine.runtime.projector import Projector, rebuild, verify
from accord.errors import StoreError

__all__ = [
    "Attached",
    "MetricsOpt",
    "Observing",
    "ProjectionOpt",
    "TraceSampleOpt",
    "app",
    "describe",
    "freshness",
    "metrics_or_exit",
    "observe_engine",
    "projection_for",
    "ratio_or_exit",
    "resolve_projection",
]  # fmt: skip

app = typer.Typer(help="The search projection: rebuild, verify, failures.", no_args_is_help=True)

DEFAULT_STORE = "sqlite:///.accord/accord.db"
StoreOpt = Annotated[
    str, typer.Option("--store", envvar="ACCORD_STORE", help="store URL (sqlite:///path)")
]
ProjectionOpt = Annotated[
    str | None,
    typer.Option(
        "--projection",
        envvar="ACCORD_PROJECTION",
        help="search projection URL (sqlite:///…, postgresql://…); default: beside a SQLite "
        "store; off: none",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]
MetricsOpt = Annotated[
    str | None,
    typer.Option(
        "--metrics",
        help="serve the engine's metrics (Prometheus text) on http://[HOST:]PORT/metrics; "
        "PORT alone listens on 127.0.0.1; 0 takes a free port",
    ),
]
T = TypeVar("T")
LINGER_MS = 100  # a serving engine's projector: least time between batches (coalescing)


def freshness(result: SearchResult, now_ms: int) -> dict[str, Any]:
    """What a reader is told of a search: it comes from a derived index, and how far behind.
    ``lag_ms`` is how old the newest event was when the projector last wrote;
    ``last_write_ms_ago`` how long ago that was (``None``: never written)."""
    through, at = result.indexed_through_ms, result.projected_at_ms
    return {
        "source": "derived index (the search projection; the store is the truth)",
        "indexed_through_ms": through,
        "projected_at_ms": at,
        "lag_ms": max(0, at - through) if at and through else None,
        "last_write_ms_ago": max(0, now_ms - at) if at else None,
    }


def describe(fresh: dict[str, Any]) -> str:
    if not fresh["projected_at_ms"] or fresh["last_write_ms_ago"] is None:
        return "from the derived index, never written"
    return (f"from the derived index: {fresh['lag_ms'] or 0} ms behind its newest event, "
            f"last written {fresh['last_write_ms_ago'] / 1000:.1f} s ago")  # fmt: skip


def resolve_projection(option: str | None, store_url: str) -> str | None:
    """The projection URL ``--projection`` comes to (``None``: off)."""
    if option is not None and option.strip().lower() in ("off", "none", ""):
        return None
    return option if option is not None else default_projection_url(store_url)


@dataclass(slots=True)
class Attached:
    """A projection opened for a process, and the sink an engine there hands telemetry to."""

    url: str | None
    projection: Projection | None
    sink: FanoutSink | None
    projector: Projector | None = None

    def attach(self, engine: Any) -> Projector | None:
        """Register the projector for ``engine`` (an :class:`Engine`) in the sink."""
        if self.projection is None or self.sink is None:
            return None
        self.projector = Projector(engine.store, self.projection, engine.clock, linger_ms=LINGER_MS)
        self.sink.register("projection", self.projector, required=True)
        engine.observers.append(self.projector)  # commits of ended runs with no telemetry
        return self.projector

    async def close(self) -> None:
        if self.projector is not None:
            await self.projector.drain()
        if self.projection is not None:
            await self.projection.close()


def projection_for(option: str | None, store_url: str, *, writes: bool = True) -> Attached:
    """Open the projection ``--projection`` names for a serving process (a bad URL is a usage
    error, exit 2); ``writes`` gives it a :class:`FanoutSink` for the engine to take."""
    url = resolve_projection(option, store_url)
    if url is None:
        return Attached(None, None, None)
    try:
        projection = open_projection(url)
    except (StoreError, OSError) as exc:
        if option is not None:
            usage(f"--projection {url}: {exc}")
        # the default beside the store: a derived index is never worth refusing to start for
        # (and a store URL that cannot be opened is refused by the store itself, naming why)
        logging.getLogger("accord.projection").warning(
            "no search projection: %s cannot be opened (%s)", url, exc
        )
        return Attached(None, None, None)
    return Attached(url, projection, FanoutSink() if writes else None)


TraceSampleOpt = Annotated[
    str | None,
    typer.Option(
        "--trace-sample",
        help="share of runs traced, 0 to 1 (0.1, 10%); default: OTEL_TRACES_SAMPLER(_ARG), else 1",
    ),
]


def ratio_or_exit(option: str | None) -> float | None:
    """``--trace-sample`` as a ratio (``None``: as the ``OTEL_TRACES_SAMPLER`` variables say)."""
    if option is None:
        return None
    from accord.adapters.telemetry.otel import parse_ratio  # noqa: PLC0415

    try:
        return parse_ratio(option)
    except ValueError as exc:
        usage(f"--trace-sample {exc}")


def metrics_or_exit(option: str | None) -> tuple[str, int] | None:
    """``--metrics`` as (host, port), ``None`` when not given; a bad one is exit 2."""
    if option is None or option.strip().lower() in ("off", "none", ""):
        return None
    from accord.adapters.telemetry.metrics import metrics_address  # noqa: PLC0415

    try:
        return metrics_address(option)
    except ValueError as exc:
        usage(f"--metrics {exc}")


@dataclass(slots=True)
class Observing:
    """What :func:`observe_engine` started; :meth:`close` stops it."""

    alerts: Any = None  # accord.cli.alerts.Evaluating
    server: asyncio.Server | None = None

    @property
    def book(self) -> Any:
        return None if self.alerts is None else self.alerts.book

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        if self.alerts is not None:
            await self.alerts.close()


async def observe_engine(
    engine: Any,
    search: Attached,
    rules: Any,
    state: Path,
    metrics_at: tuple[str, int] | None,
    *,
    exposed: bool = False,
) -> Observing:
    """Start the alert evaluation (``rules``; ``None``: none) and, with ``metrics_at``, the
    engine's metrics observer and their ``/metrics`` endpoint; the line ``metrics on URL``
    names the address bound. ``exposed``: the process serves ``/metrics`` already (the API),
    so the projector's lag gauge is reported there."""
    from accord.cli.alerts import start_alerting  # noqa: PLC0415

    projector = search.projector
    lag = None if projector is None else (lambda: projector.lag_ms)
    out = Observing()
    if metrics_at is not None or exposed:
        from accord.adapters.telemetry import metrics as mx  # noqa: PLC0415

        if not any(isinstance(o, mx.EngineMetrics) for o in engine.observers):
            mx.EngineMetrics.attach(engine)
        if lag is not None:
            mx.watch_lag(lag)
    if metrics_at is not None:
        try:
            out.server = await mx.serve_metrics(*metrics_at)
        except OSError as exc:
            usage(f"--metrics {metrics_at[0]}:{metrics_at[1]}: {exc.strerror or exc}")
        host, port = out.server.sockets[0].getsockname()[:2]
        console.print(f"metrics on http://{host}:{port}/metrics", markup=False, soft_wrap=True)
    if rules is not None:
        out.alerts = start_alerting(engine, rules, state, lag_ms=lag)
    return out


def _with_both(
    store_url: str, option: str | None, body: Callable[[Store, Projector], Awaitable[T]]
) -> T:
    url = resolve_projection(option, store_url)
    if url is None:
        usage("no projection: name one with --projection (the default needs a SQLite store)")

    async def go() -> T:
        store = open_store(store_url)
        try:
            projection = open_projection(url)
        except BaseException:
            await store.close()
            raise
        try:
            return await body(store, Projector(store, projection, SystemClock()))
        finally:
            await projection.close()
            await store.close()

    try:
        return asyncio.run(go())
    except (StoreError, OSError, ValueError) as exc:
        refuse(f"{exc}", 2)


@app.command("rebuild")
def rebuild_cmd(
    store: StoreOpt = DEFAULT_STORE, projection: ProjectionOpt = None, json_out: JsonOpt = False
) -> None:
    """Replace the projection with documents rebuilt from every run in the store."""

    async def go(s: Store, p: Projector) -> dict[str, Any]:
        runs = await rebuild(s, p)
        return {"ok": True, "runs": runs, "documents": p.stats.indexed,
                "failed": p.stats.failed}  # fmt: skip

    report = _with_both(store, projection, go)
    if json_out:
        emit_json(report)
    else:
        console.print(
            f"rebuilt {report['runs']} run(s): {report['documents']} document(s), "
            f"{report['failed']} failed",
            markup=False,
        )
    raise typer.Exit(EXIT_OK if not report["failed"] else EXIT_REFUSED)


@app.command("verify")
def verify_cmd(
    store: StoreOpt = DEFAULT_STORE,
    projection: ProjectionOpt = None,
    sample: Annotated[
        int | None, typer.Option(min=1, help="check the N most recent runs (default: all)")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Compare the projection with the store; exit 1 when they diverge."""

    async def go(s: Store, p: Projector) -> dict[str, Any]:
        checked, found = await verify(s, p, sample=sample)
        return {"ok": not found, "checked": checked,
                "divergences": [d.as_json() for d in found]}  # fmt: skip

    report = _with_both(store, projection, go)
    if json_out:
        emit_json(report)
    else:
        for d in report["divergences"]:
            console.print(f"{d['run_id']}  {d['problem']}  {d['detail']}", markup=False)
        console.print(
            f"checked {report['checked']} run(s): {len(report['divergences'])} divergence(s)",
            markup=False,
        )
    raise typer.Exit(EXIT_OK if report["ok"] else EXIT_REFUSED)


@app.command("failures")
def failures_cmd(
    store: StoreOpt = DEFAULT_STORE,
    projection: ProjectionOpt = None,
    limit: Annotated[int, typer.Option(min=1, max=100_000)] = 1000,
    json_out: JsonOpt = False,
) -> None:
    """The documents the projector could not index (kept until re-driven)."""

    async def go(_s: Store, p: Projector) -> list[dict[str, Any]]:
        return [
            {"doc_id": f.doc_id, "run_id": f.run_id, "error": f.error, "attempts": f.attempts,
             "failed_at_ms": f.failed_at_ms}
            for f in await p.projection.failures(limit)
        ]  # fmt: skip

    found = _with_both(store, projection, go)
    if json_out:
        emit_json({"ok": True, "failures": found})
        return
    for f in found:
        console.print(f"{f['doc_id']}  attempts={f['attempts']}  {f['error']}", markup=False)
    console.print(f"{len(found)} failure(s)", markup=False)


@app.command("redrive")
def redrive_cmd(
    store: StoreOpt = DEFAULT_STORE, projection: ProjectionOpt = None, json_out: JsonOpt = False
) -> None:
    """Index the runs of the recorded failures again; exit 1 if some still fail."""

    async def go(_s: Store, p: Projector) -> dict[str, Any]:
        redriven, still = await p.redrive(100_000)
        return {"ok": still == 0, "redriven": redriven, "still_failing": still}

    report = _with_both(store, projection, go)
    if json_out:
        emit_json(report)
    else:
        console.print(
            f"re-drove {report['redriven']} failure(s); {report['still_failing']} still failing",
            markup=False,
        )
    raise typer.Exit(EXIT_OK if report["ok"] else EXIT_REFUSED)


@app.command("status")
def status_cmd(
    store: StoreOpt = DEFAULT_STORE, projection: ProjectionOpt = None, json_out: JsonOpt = False
) -> None:
    """How far the projection has got: the newest event it holds and when it last wrote."""

    async def go(_s: Store, p: Projector) -> dict[str, Any]:
        result = await p.projection.search(SearchQuery(limit=0))
        return {"ok": True, "runs": result.total, **freshness(result, p.clock.now_ms()),
                "failures": len(await p.projection.failures(100_000))}  # fmt: skip

    report = _with_both(store, projection, go)
    if json_out:
        emit_json(report)
        return
    console.print(f"{report['runs']} run(s) indexed; {describe(report)}; "
                  f"{report['failures']} failure(s)", markup=False)  # fmt: skip


def run_search(query: str, store_url: str, option: str | None, limit: int, json_out: bool) -> None:
    """The body of ``accord runs search``: every tenant (an operator's view, as ``runs list``)."""
    from accord.engine.runtime.projector import parse_query  # noqa: PLC0415

    clock = SystemClock()
    try:
        parsed = parse_query(query, clock.now_ms(), limit=limit)
    except ValueError as exc:
        usage(f"search: {exc}")

    async def go(_s: Store, p: Projector) -> dict[str, Any]:
        try:
            result = await p.projection.search(parsed)
        except ValueError as exc:
            usage(f"search: {exc}")
        return {"ok": True, "query": query, "total": result.total, "runs": result.runs,
                "facets": result.facets, **freshness(result, clock.now_ms())}  # fmt: skip

    report = _with_both(store_url, option, go)
    if json_out:
        emit_json(report)
        return
    for run in report["runs"]:
        failed = ",".join(run.get("failed_stages") or []) or "-"
        console.print(
            f"{run['run_id']}  {run['status']:<10} {run['workflow_version']}  "
            f"tenant={run['tenant']}  failed={failed}",
            markup=False,
        )
    facets = report["facets"]
    by_status = " ".join(f"{k}={v}" for k, v in sorted(facets["status"].items()))
    by_version = " ".join(f"{k}={v}" for k, v in sorted(facets["version"].items()))
    console.print(f"{report['total']} match(es)  status: {by_status or '-'}  "
                  f"version: {by_version or '-'}", markup=False)  # fmt: skip
    console.print(describe(report), markup=False)


def index_runs(option: str | None, store_url: str) -> int | None:
    """Rebuild the projection ``--projection`` names from ``store_url`` (what ``accord demo``
    does once its runs ended); how many runs it holds, ``None`` when the projection is off."""
    if resolve_projection(option, store_url) is None:
        return None

    async def go(s: Store, p: Projector) -> int:
        return await rebuild(s, p)

    return _with_both(store_url, option, go)
