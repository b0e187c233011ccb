"""``accord alerts``: the alert records an engine raised (docs/observability.md, "Alerts").

``accord alerts list [--alerts PATH] [--open] [--json]`` reads the alert book the engine writes
(``<state>/alerts.db``, ``.accord/alerts.db`` by default) without changing it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from accord.cli._common import console, emit_json, refuse

app = typer.Typer(help="Alerts raised by the engine's rules.", no_args_is_help=True)

DEFAULT = Path(".accord") / "alerts.db"


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
