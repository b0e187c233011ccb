"""`accord workflow` commands."""

from __future__ import annotations

import typer

app = typer.Typer(help="workflow commands", no_args_is_help=True)
