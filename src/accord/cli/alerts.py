"""``accord alerts``: the alert records an engine raised (docs/observability.md, "Alerts").

``accord alerts list [--alerts PATH] [--open] [--json]`` reads the alert book the engine writes
(``<state>/alerts.db``, ``.accord/alerts.db`` by default) without changing it.

:data:`AlertRulesOpt` is ``--alert-rules`` of ``accord engine run`` and ``accord serve``: the
periodic evaluation they start (:func:`start_alerting`) over ``<state>/alerts.db``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from accord.cli._common import console, emit_json, refuse, usage

if TYPE_CHECKING:
    from accord.adapters.telemetry.alerts import AlertBook, Alerting, AlertRules

app = typer.Typer(help="Alerts raised by the engine's rules.", no_args_is_help=True)

DEFAULT = Path(".accord") / "alerts.db"
AlertRulesOpt = Annotated[
    str,
    typer.Option(
        "--alert-rules",
        help="evaluate the alert rules into STATE/alerts.db: on, off, or key=value pairs over "
        "the defaults (every=10s,queued=30s,lag=60s,stranded=60s,poison=3,poison-window=10m)",
    ),
]


def rules_or_exit(spec: str) -> AlertRules | None:
    """``--alert-rules`` parsed (``None``: off); a bad one is a usage error (exit 2)."""
    from accord.adapters.telemetry.alerts import parse_rules  # noqa: PLC0415

    try:
        return parse_rules(spec)
    except ValueError as exc:
        usage(f"--alert-rules: {exc}")


@dataclass(slots=True)
class Evaluating:
    """A running evaluation: the rules over one engine, recording into ``book``."""

    alerting: Alerting
    book: AlertBook
    stop: asyncio.Event
    task: asyncio.Task[None]

    async def close(self) -> None:
        self.stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self.task, 30)
        self.book.close()


def existing_book(state: Path) -> AlertBook | None:
    """``state/alerts.db`` when an engine wrote one there (``accord serve --no-engine``)."""
    from accord.adapters.telemetry.alerts import AlertBook  # noqa: PLC0415

    path = state / "alerts.db"
    return AlertBook(path) if path.is_file() else None


def start_alerting(
    engine: Any, rules: AlertRules, state: Path, *, lag_ms: Callable[[], int] | None = None
) -> Evaluating:
    """Start evaluating ``rules`` over ``engine`` every ``rules.every_ms`` (from now), recording
    into ``state/alerts.db`` and the process's metrics."""
    from accord.adapters.telemetry.alerts import AlertBook, Alerting  # noqa: PLC0415
    from accord.adapters.telemetry.metrics import metrics  # noqa: PLC0415

    book = AlertBook(state / "alerts.db")
    alerting = Alerting(engine, book, rules, lag_ms=lag_ms, metrics=metrics())
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(alerting.run(stop), name="accord-alerts")
    return Evaluating(alerting, book, stop, task)


@app.command("list")
def list_cmd(
    alerts: Annotated[Path, typer.Option("--alerts", help="The alert book (SQLite).")] = DEFAULT,
    open_only: Annotated[bool, typer.Option("--open", help="Only open alerts.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON document.")] = False,
) -> None:
    """List alerts, newest first: rule, subject, state, count, affected runs, action taken."""
    from accord.adapters.telemetry.alerts import AlertBook  # noqa: PLC0415

    if not alerts.is_file():
        refuse(f"--alerts {alerts}: no alert book there (an engine writes <state>/alerts.db)", 2)
    book = AlertBook(alerts)
    try:
        found = book.list(state="open" if open_only else None)
    finally:
        book.close()
    if json_out:
        emit_json({"ok": True, "alerts": [a.to_json() for a in found]})
        return
    if not found:
        console.print("no alerts")
    for a in found:
        console.print(
            f"{escape(a.state):8} {escape(a.alert_id)} ×{a.count}: {escape(a.detail)}",
            highlight=False, soft_wrap=True,
        )  # fmt: skip
        if a.runs:
            console.print(f"         runs: {', '.join(a.runs[:10])}", highlight=False)
        if a.action:
            console.print(f"         action: {escape(a.action)}", highlight=False)
