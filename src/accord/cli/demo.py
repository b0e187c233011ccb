"""`accord demo`: the contract pipeline end to end on the bundled model-ingest contracts.

Lint every source, diff the published evolution ``thumbnail-generation-request`` 1 → 2, publish
(idempotently: already-published versions are verified unchanged, never rewritten) and generate
the Python and TypeScript bindings, then print one table of what each step did. Every step uses
the same code paths as ``accord contracts …``; a refusal stops the demo with exit code 1.
"""

from __future__ import annotations

import typer
from rich.table import Table

from accord.cli._common import EXIT_REFUSED, console, print_diagnostics
from accord.cli._registry import workspace
from accord.contracts import compat
from accord.contracts.model import MessageContract
from accord.contracts.sources import lint_paths
from accord.errors import AccordError, ContractLintError

EVOLUTION = ("thumbnail-generation-request@1", "thumbnail-generation-request@2")


def demo() -> None:
    """Lint, diff, publish and generate the bundled contracts, and show what happened."""
    ws = workspace()
    steps = Table(title=f"accord demo — contracts in {ws.sources.relative_to(ws.root)}")
    for column in ("step", "result", "detail"):
        steps.add_column(column, overflow="fold")
    try:
        contracts, diagnostics = lint_paths([ws.sources])
        if any(d.severity == "error" for d in diagnostics):
            raise ContractLintError(diagnostics, "the bundled contracts do not lint")
        kinds = sorted({c.kind for c in contracts})
        counts = ", ".join(f"{sum(c.kind == k for c in contracts)} {k}" for k in kinds)
        steps.add_row("lint", "ok", f"{len(contracts)} contracts ({counts})")

        old, new = (ws.resolve(ref) for ref in EVOLUTION)
        assert isinstance(old, MessageContract) and isinstance(new, MessageContract)
        report = compat.diff(old, new)
        gate = compat.check_publish([old], new)
        verdict = "refused" if any(d.severity == "error" for d in gate) else "accepted"
        changes = "; ".join(f"{c.key} ({c.action})" for c in report.changes)
        steps.add_row(f"diff {EVOLUTION[0]} → {new.version}", verdict, changes)

        plan = ws.store.publish(contracts)
        steps.add_row(
            "publish",
            "ok",
            f"{len(plan.new)} new, {len(plan.unchanged)} unchanged (verified by digest), "
            f"{len(plan.skipped)} planned skipped → {ws.store.root.relative_to(ws.root)}",
        )

        from accord.contracts.codegen import generate_all  # noqa: PLC0415 - heavy import

        generated = generate_all(ws.root, check=False)
        steps.add_row(
            "codegen",
            "ok",
            f"{len(generated.written)} written, {len(generated.removed)} removed, "
            f"{len(generated.unchanged)} unchanged (Python + TypeScript bindings)",
        )
    except AccordError as exc:
        console.print(steps)
        print_diagnostics(getattr(exc, "diagnostics", ()))
        console.print(f"[red]demo stopped:[/red] {str(exc).splitlines()[0]}")
        raise typer.Exit(EXIT_REFUSED) from exc
    console.print(steps)
