"""`accord store`: operate on a store's own schema.

``migrate`` applies the PostgreSQL store's pending schema migrations (numbered, recorded in the
schema's ``accord_schema`` table, each applied once under an advisory lock, all in one
transaction) and reports the version before and after. A schema migrated by a newer accord is
refused with both versions named and exit 1, as is a server that does not answer. The other
stores keep their own schema (SQLite creates its tables on open, Redis has none): for them there
is nothing to apply. ``--json`` prints one JSON document in every outcome.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from accord.cli._common import EXIT_OK, console, emit_json, refuse
from accord.errors import StoreError
from accord.loop import run as run_loop

app = typer.Typer(help="Operate on a store's schema.", no_args_is_help=True)

StoreOpt = Annotated[str, typer.Option("--store", help="store URL, e.g. postgresql://…/db")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document")]


@app.command()
def migrate(store: StoreOpt, as_json: JsonOpt = False) -> None:
    """Apply pending schema migrations (PostgreSQL); refuse a schema newer than this code."""
    if not store.lower().startswith("postgresql:"):
        scheme = store.split(":", 1)[0] or "(none)"
        report: dict[str, Any] = {
            "ok": True, "store": store, "applied": [],
            "note": f"{scheme} stores keep their own schema: nothing to migrate",
        }  # fmt: skip
        _print(report, as_json)
        return
    from accord.adapters.stores.postgres._db import ensure_schema, parse_url  # noqa: PLC0415
    from accord.adapters.stores.postgres._schema import SCHEMA_VERSION  # noqa: PLC0415

    try:
        target = parse_url(store)
    except ValueError as exc:
        refuse(f"store URL {store!r}: {exc}", as_json=as_json)

    async def apply() -> tuple[int, list[int]]:
        from accord.adapters.stores.postgres._db import errors  # noqa: PLC0415

        with errors("migrate", "store", target.key):
            return await ensure_schema(target, migrate=True)

    try:
        before, applied = run_loop(apply())
    except StoreError as exc:
        refuse(str(exc).splitlines()[0], as_json=as_json)
    report = {
        "ok": True, "store": target.key, "schema": target.schema, "version_before": before,
        "version": SCHEMA_VERSION, "applied": applied,
    }  # fmt: skip
    _print(report, as_json)


def _print(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit_json(report)
    elif "note" in report:
        console.print(report["note"], markup=False)
    elif report["applied"]:
        applied = ", ".join(str(v) for v in report["applied"])
        console.print(
            f"schema {report['schema']!r}: version {report['version_before']} →"
            f" {report['version']} (applied {applied})",
            markup=False,
        )
    else:
        console.print(
            f"schema {report['schema']!r} is at version {report['version']}: up to date",
            markup=False,
        )
    raise typer.Exit(EXIT_OK)
