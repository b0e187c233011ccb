"""`accord workflow check|compile|graph|activate|versions|rollback|show`.

Thin commands over :mod:`accord.workflow`: the compiler needs the contract catalog (default
``schemas/contracts``), activation needs a store (default ``sqlite:///.accord/accord.db``).
Exit codes: 0 accepted, 1 refused (the definition, a file that is not UTF-8, the activation or
the rollback), 2 usage (unreadable file, bad option, unknown store URL). ``--json`` prints one
JSON document on stdout in every outcome.
"""

from __future__ import annotations

import asyncio
import codecs
import shutil
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from accord._files import atomic_write
from accord.cli._common import EXIT_REFUSED, emit_json, print_diagnostics, refuse, usage
from accord.contracts.catalog import Catalog
from accord.contracts.sources import load_catalog
from accord.errors import AccordError, ContractLintError, Diagnostic, Location, StoreError
from accord.workflow import activation
from accord.workflow.compiler import CompileResult, compile_workflow
from accord.workflow.plan import Plan
from accord.workflow.render import to_dot, to_mermaid

__all__ = ["app", "compile_file"]

app = typer.Typer(help="Check, compile, render and activate workflows.", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document for scripts.")]
ContractsOpt = Annotated[Path, typer.Option("--contracts", help="Contract sources directory.")]
StoreOpt = Annotated[str, typer.Option("--store", help="Store URL (memory://, sqlite:///path).")]
DEFAULT_CONTRACTS = Path("schemas/contracts")
DEFAULT_STORE = "sqlite:///.accord/accord.db"
T = TypeVar("T")


_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),  # before UTF-16 LE, whose mark starts it
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


def compile_file(path: Path, catalog: Catalog) -> CompileResult:
    """Read ``path`` and compile it (the workflow package itself never touches files).

    This is where workflow files are read. A file that is not UTF-8 is refused like any bad
    definition, with one ``workflow-encoding`` diagnostic at the first bad byte; a file that
    cannot be read at all raises :class:`OSError`."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return CompileResult(None, (_not_utf8(str(path), data, exc),))
    return compile_workflow(text, str(path), catalog)


def _not_utf8(name: str, data: bytes, exc: UnicodeDecodeError) -> Diagnostic:
    at = exc.start
    line = data.count(b"\n", 0, at) + 1
    column = at - (data.rfind(b"\n", 0, at) + 1) + 1  # in bytes: the text has no characters yet
    message = f"not UTF-8 text: byte {at} (0x{data[at]:02x}): {exc.reason}"
    bom = next((label for mark, label in _BOMS if data.startswith(mark)), None)
    if bom:
        message += f"; the file starts with a {bom} byte-order mark, save it as UTF-8"
    return Diagnostic("workflow-encoding", message, Location(name, line, column))


def _catalog(directory: Path) -> Catalog:
    if not directory.is_dir():
        usage(f"contract directory {directory} does not exist")
    try:
        return load_catalog(directory)
    except ContractLintError as exc:
        refuse(f"the contracts in {directory} do not lint", diagnostics=exc.diagnostics)


def _compiled(file: Path, contracts: Path, json: bool) -> Plan:
    try:
        result = compile_file(file, _catalog(contracts))
    except OSError as exc:
        usage(f"cannot read {file}: {exc.strerror or exc}")
    if result.plan is None:
        if json:
            message = f"{file}: refused, {len(result.errors)} error(s)"
            refuse(message, diagnostics=result.diagnostics, as_json=True)
        else:
            print_diagnostics(result.diagnostics)
            typer.echo(f"{file}: refused, {len(result.errors)} error(s)")
        raise typer.Exit(EXIT_REFUSED)
    if not json:
        print_diagnostics(result.warnings)
    return result.plan


def _with_store(url: str, action: Callable[[Any], Awaitable[T]]) -> T:
    from accord.adapters import open_store  # noqa: PLC0415 — only store commands need adapters

    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        target = url.removeprefix("sqlite:///").split("?")[0]
        if target and target != ":memory:":
            try:
                Path(target).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                usage(f"cannot create the store's folder for {url!r}: {exc.strerror or exc}")

    async def run() -> T:
        store = open_store(url)
        try:
            return await action(store)
        finally:
            await store.close()

    try:
        return asyncio.run(run())
    except activation.ActivationError as exc:
        refuse(str(exc))
    except StoreError as exc:
        usage(str(exc))
    except AccordError as exc:
        refuse(str(exc))


@app.command()
def check(file: Path, contracts: ContractsOpt = DEFAULT_CONTRACTS, json: JsonOpt = False) -> None:
    """Check a definition through every layer; exit 1 when it is refused."""
    plan = _compiled(file, contracts, json)
    if json:
        warnings = [d.as_dict() for d in compile_file(file, _catalog(contracts)).warnings]
        emit_json({"ok": True, "digest": plan.digest, "diagnostics": warnings})
    else:
        typer.echo(f"{file}: ok {plan.name} {plan.version} {plan.digest}")


@app.command("compile")
def compile_(
    file: Path,
    contracts: ContractsOpt = DEFAULT_CONTRACTS,
    out: Annotated[Path | None, typer.Option("--out", help="Write the plan JSON here.")] = None,
    json: JsonOpt = False,
) -> None:
    """Compile to the canonical plan; print its digest (and the plan with --json)."""
    plan = _compiled(file, contracts, json)
    if out is not None:
        try:
            atomic_write(out, plan.canonical_bytes().decode("utf-8") + "\n")
        except OSError as exc:
            usage(f"cannot write {out}: {exc.strerror or exc}")
    if json:
        emit_json({"digest": plan.digest, "plan": plan.to_json()})
    else:
        typer.echo(plan.digest)


@app.command()
def graph(
    file: Path,
    contracts: ContractsOpt = DEFAULT_CONTRACTS,
    svg: Annotated[Path | None, typer.Option("--svg", help="Also render SVG (needs dot).")] = None,
) -> None:
    """Print the plan as Mermaid; with --svg also write an SVG through Graphviz `dot`."""
    plan = _compiled(file, contracts, False)
    typer.echo(to_mermaid(plan), nl=False)
    if svg is not None:
        dot = shutil.which("dot")
        if dot is None:
            refuse("SVG needs Graphviz `dot`, which is not installed; Mermaid was printed")
        done = subprocess.run(
            [dot, "-Tsvg"], input=to_dot(plan).encode(), capture_output=True, check=False
        )
        if done.returncode != 0:
            refuse(f"dot failed: {done.stderr.decode(errors='replace')}")
        atomic_write(svg, done.stdout.decode("utf-8"))


@app.command("activate")
def activate_(  # noqa: PLR0917 - typer maps each option to a parameter
    file: Path,
    contracts: ContractsOpt = DEFAULT_CONTRACTS,
    store: StoreOpt = DEFAULT_STORE,
    json: JsonOpt = False,
    canary: Annotated[
        str | None, typer.Option("--canary", help="send this share of new runs to it (10%)")
    ] = None,
    max_increase: Annotated[
        float | None, typer.Option(help="canary: failure-rate points above stable, at most")
    ] = None,
    min_runs: Annotated[
        int | None, typer.Option(help="canary: ended runs before a verdict")
    ] = None,
    reason: Annotated[str, typer.Option(help="canary: why (recorded)")] = "",
) -> None:
    """Store the compiled plan as an immutable version and make it active for new runs (with
    --canary, for that share of new runs until promoted or aborted)."""
    plan = _compiled(file, contracts, json)
    if canary is not None:
        from accord.cli.migration import activate_canary  # noqa: PLC0415 - it imports this module

        activate_canary(plan, canary, store, max_increase=max_increase, min_runs=min_runs,
                        reason=reason, json_out=json)  # fmt: skip
        return
    changed = _with_store(store, lambda s: activation.activate(s, plan))
    if json:
        emit_json({"workflow": plan.name, "digest": plan.digest, "changed": changed})
    else:
        state = "activated" if changed else "already active"
        typer.echo(f"{plan.name} {plan.version} {plan.digest} {state}")


@app.command("versions")
def versions_(workflow: str, store: StoreOpt = DEFAULT_STORE, json: JsonOpt = False) -> None:
    """List the activations of a workflow, oldest first."""
    rows = _with_store(store, lambda s: activation.versions(s, workflow))
    if not rows:
        refuse(f"{workflow} has never been activated")
    if json:
        emit_json(
            [
                {
                    "digest": v.digest,
                    "version": v.version,
                    "active": v.active,
                    "activated_at_ms": v.activated_at_ms,
                }
                for v in rows
            ]
        )
        return
    for v in rows:
        typer.echo(f"{'*' if v.active else ' '} {v.version:<12} {v.digest}")


@app.command("rollback")
def rollback_(
    workflow: str,
    digest: Annotated[str | None, typer.Argument(help="Digest to activate again.")] = None,
    store: StoreOpt = DEFAULT_STORE,
    json: JsonOpt = False,
) -> None:
    """Make an earlier version active again for new runs (default: the previous one)."""
    target = _with_store(store, lambda s: activation.rollback(s, workflow, digest))
    if json:
        emit_json({"workflow": workflow, "digest": target})
    else:
        typer.echo(f"{workflow} → {target}")


@app.command("show")
def show(
    ref: Annotated[str, typer.Argument(help="Workflow name (its active plan) or a digest.")],
    store: StoreOpt = DEFAULT_STORE,
    json: JsonOpt = False,
) -> None:
    """Show a stored plan."""

    async def find(s: Any) -> Plan | None:
        digest = ref if ref.startswith("sha256:") else await s.get_active(ref)
        return await activation.load_plan(s, digest) if digest else None

    plan = _with_store(store, find)
    if plan is None:
        refuse(f"{ref}: no active plan")
    if json:
        emit_json({"digest": plan.digest, "plan": plan.to_json()})
    else:
        typer.echo(to_mermaid(plan), nl=False)
        typer.echo(f"{plan.name} {plan.version} {plan.digest}")
