"""Shared CLI plumbing: exit codes, JSON output, rendering diagnostics."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from accord.errors import Diagnostic
from accord.loop import LoopUnavailable, chosen

LoopOpt = Annotated[
    str,
    typer.Option(
        "--loop",
        envvar="ACCORD_LOOP",
        help="Event loop: auto (uvloop if installed), uvloop, asyncio.",
    ),
]

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2

console = Console(stderr=False, highlight=False)
err_console = Console(stderr=True, highlight=False)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def print_diagnostics(diagnostics: Iterable[Diagnostic]) -> None:
    for d in diagnostics:
        style = "red" if d.severity == "error" else "yellow"
        err_console.print(f"[{style}]{escape(str(d))}[/{style}]", markup=True, soft_wrap=True)


def refuse(message: str, code: int = EXIT_REFUSED) -> NoReturn:
    err_console.print(f"[red]error:[/red] {message}", soft_wrap=True)
    raise typer.Exit(code)


def usage(message: str) -> NoReturn:
    refuse(message, EXIT_USAGE)


def pick_loop(loop: str) -> str:
    """The event loop ``loop`` comes to (``uvloop`` or ``asyncio``, :mod:`accord.loop`); one that
    cannot be had here is a usage error, before anything starts."""
    try:
        return chosen(loop)
    except LoopUnavailable as exc:
        usage(str(exc))
