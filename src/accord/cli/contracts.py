"""`accord contracts` commands."""

from __future__ import annotations

import typer

app = typer.Typer(help="contracts commands", no_args_is_help=True)
