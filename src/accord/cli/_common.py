"""Shared CLI plumbing: exit codes, JSON output, rendering diagnostics, refusals.

Every refusal goes through :func:`refuse`: with ``--json`` anywhere on the command line it prints
one JSON document on stdout (:func:`refusal`), otherwise the diagnostics and a one-line error on
stderr; the exit code is the same either way. :class:`AccordGroup`, the root ``accord`` group,
notes whether ``--json`` was asked for and answers what escapes a command the same way: typer's
usage errors (exit 2) and any :class:`~accord.errors.AccordError` (exit 1).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from contextvars import ContextVar
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from accord.errors import AccordError, Diagnostic
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


JSON_FLAG = "--json"
_JSON_META = "accord.json"
_json_out: ContextVar[bool] = ContextVar("accord_json_out", default=False)


def json_requested() -> bool:
    """Whether this invocation asked for ``--json`` (noted by :class:`AccordGroup`)."""
    return _json_out.get()


def refusal(message: str, code: int, diagnostics: Iterable[Diagnostic] = ()) -> dict[str, Any]:
    """The JSON document of a refusal or usage error: ``error`` is one line, ``exit`` the code."""
    return {
        "ok": False,
        "error": message,
        "exit": code,
        "diagnostics": [d.as_dict() for d in diagnostics],
    }


def refuse(
    message: str,
    code: int = EXIT_REFUSED,
    *,
    diagnostics: Iterable[Diagnostic] = (),
    as_json: bool | None = None,
) -> NoReturn:
    """Report a refusal and exit ``code``: with ``--json`` (or ``as_json``) one JSON document on
    stdout, else ``diagnostics`` and ``error: message`` on stderr."""
    found = tuple(diagnostics)
    if json_requested() if as_json is None else as_json:
        emit_json(refusal(message, code, found))
    else:
        print_diagnostics(found)
        err_console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
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


class AccordGroup(TyperGroup):
    """The root ``accord`` group: ``--json`` on the command line makes every outcome one JSON
    document, including what escapes a command. Typer's usage errors (bad option, missing
    argument, an option the command does not have) exit 2 and an :class:`AccordError` exits 1,
    as :func:`refuse` reports them; anything else is a bug and keeps its traceback, after a JSON
    document when one was asked for."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        head = args[: args.index("--")] if "--" in args else args
        ctx.meta[_JSON_META] = JSON_FLAG in head
        try:
            return super().parse_args(ctx, args)
        except typer.TyperException as exc:
            _usage_error(exc, JSON_FLAG in head)

    def invoke(self, ctx: Any) -> Any:
        wanted = bool(ctx.meta.get(_JSON_META))
        token = _json_out.set(wanted)
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort):
            raise
        except typer.TyperException as exc:
            _usage_error(exc, wanted)
        except AccordError as exc:
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            refuse(message, diagnostics=getattr(exc, "diagnostics", ()))
        except Exception as exc:
            if wanted:
                emit_json(refusal(f"internal error: {type(exc).__name__}: {exc}", EXIT_REFUSED))
            raise
        finally:
            _json_out.reset(token)


def _usage_error(exc: typer.TyperException, as_json: bool) -> NoReturn:
    """Typer's own parse errors: unchanged without ``--json``, else one JSON document."""
    if not as_json:
        raise exc
    emit_json(refusal(exc.format_message(), exc.exit_code))
    raise typer.Exit(exc.exit_code) from exc
