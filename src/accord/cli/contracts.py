"""`accord contracts lint|diff|publish|codegen|docs|validate|show`.

Thin commands over :mod:`accord.contracts` and the artefact store. Exit codes: 0 ok, 1 the input
is refused (lint error, incompatible change, immutable artefact, invalid message, stale generated
code), 2 usage error (unknown contract, unreadable file, bad option). ``--json`` prints one JSON
document on stdout and nothing else there.
"""

from __future__ import annotations

import json as json_module
import re
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.markup import escape
from rich.table import Table

from accord._files import atomic_write
from accord.cli._common import (
    EXIT_REFUSED,
    EXIT_USAGE,
    console,
    emit_json,
    print_diagnostics,
    refuse,
    usage,
)
from accord.cli._registry import Workspace, print_report, refused_json, workspace
from accord.contracts import compat
from accord.contracts.canonical import contract_digest, contract_summary, to_canonical
from accord.contracts.catalog import Catalog
from accord.contracts.model import CapabilityContract, Contract, MessageContract
from accord.contracts.paths import join
from accord.contracts.protocol_doc import DocumentError, render_document
from accord.contracts.sources import lint_paths
from accord.errors import (
    ContractError,
    ContractLintError,
    Diagnostic,
    FieldViolation,
    IncompatibleChange,
)

app = typer.Typer(
    help="Lint, diff, publish, generate and validate contracts.", no_args_is_help=True
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document for scripts.")]


def _resolve(ws: Workspace, spec: str) -> Contract:
    try:
        return ws.resolve(spec)
    except LookupError as exc:
        usage(str(exc))
    except ContractLintError as exc:
        refuse(f"{spec} does not lint", diagnostics=exc.diagnostics)


@app.command()
def lint(
    paths: Annotated[list[Path] | None, typer.Argument(help="Files or directories.")] = None,
    json: JsonOpt = False,
) -> None:
    """Meta-validate contract sources (default: schemas/contracts/)."""
    ws = workspace()
    targets = paths or [ws.sources]
    try:
        contracts, diagnostics = lint_paths(targets)
    except ContractLintError as exc:  # a named path does not exist or cannot be read
        refuse("cannot read the sources named", EXIT_USAGE, diagnostics=exc.diagnostics)
    errors = [d for d in diagnostics if d.severity == "error"]
    if json:
        emit_json(
            {
                "ok": not errors,
                "contracts": [contract_summary(c) for c in contracts],
                "diagnostics": [d.as_dict() for d in diagnostics],
            }
        )
    else:
        print_diagnostics(diagnostics)
        console.print(f"{len(contracts)} contract(s) valid, {len(errors)} error(s)")
    raise typer.Exit(EXIT_REFUSED if errors else 0)


@app.command()
def diff(
    old: Annotated[str, typer.Argument(help="File or name@version.")],
    new: Annotated[str, typer.Argument(help="File or name@version.")],
    mode: Annotated[str, typer.Option(help="backward | forward | full")] = "backward",
    transitive: Annotated[
        bool, typer.Option(help="Also check every version of OLD's name before OLD.")
    ] = False,
    json: JsonOpt = False,
) -> None:
    """Classify every change from OLD to NEW; exit 1 when NEW is incompatible in MODE."""
    if mode not in ("backward", "forward", "full"):
        usage(f"--mode must be backward, forward or full, not {mode!r}")
    ws = workspace()
    before, after = _resolve(ws, old), _resolve(ws, new)
    if isinstance(before, MessageContract) and isinstance(after, MessageContract):
        history = [before]  # OLD as given (a file is compared as written), never left out
        if transitive:  # and the earlier versions the workspace knows (published, then sources)
            history = [
                c
                for c in ws.versions(before.name)
                if isinstance(c, MessageContract) and c.version < before.version
            ] + history
        reports = [compat.diff(h, after) for h in history]
        failures = compat.check(history, after, mode, transitive=transitive)
    elif isinstance(before, CapabilityContract) and isinstance(after, CapabilityContract):
        reports = [compat.diff_capability(before, after)]
        failures = [
            Diagnostic("compat-not-" + d, f"{c.key}: {c.message}", path=c.path)
            for c in reports[0].changes
            for d in compat.directions(mode)
            if not getattr(c, d)
        ]
    else:
        usage(f"cannot diff a {before.kind} contract against a {after.kind} contract")
    if json:
        emit_json(
            {
                "ok": not failures,
                "mode": mode,
                "transitive": transitive,
                "reports": [r.to_json() for r in reports],
                "failures": [d.as_dict() for d in failures],
            }
        )
    else:
        for report in reports:
            print_report(report)
        print_diagnostics(failures)
        verdict = "[red]incompatible[/red]" if failures else "[green]compatible[/green]"
        console.print(f"{after.name}@{after.version}: {verdict} ({mode})")
    raise typer.Exit(EXIT_REFUSED if failures else 0)


@app.command()
def publish(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Decide, write nothing.")] = False,
    json: JsonOpt = False,
) -> None:
    """Publish new contract versions as immutable artefacts under schemas/published/."""
    ws = workspace()
    try:
        contracts, diagnostics = lint_paths([ws.sources])
        if any(d.severity == "error" for d in diagnostics):
            raise ContractLintError(diagnostics, "sources do not lint")
        plan = ws.store.publish(contracts, dry_run=dry_run)
    except (ContractLintError, IncompatibleChange) as exc:
        refused_json(json, str(exc).splitlines()[0], exc.diagnostics)
    except ContractError as exc:
        refused_json(json, str(exc), ())
    rows = [("new", c) for c in plan.new] + [("unchanged", c) for c in plan.unchanged]
    rows += [("skipped (planned)", c) for c in plan.skipped]
    if json:
        emit_json(
            {
                "ok": True,
                "dryRun": dry_run,
                "contracts": [{**contract_summary(c), "outcome": o} for o, c in rows],
                "warnings": [d.as_dict() for d in plan.warnings],
            }
        )
        return
    print_diagnostics(plan.warnings)
    table = Table(title="publish" + (" (dry run)" if dry_run else ""))
    for column in ("contract", "kind", "outcome", "digest"):
        table.add_column(column)
    for outcome, c in rows:
        table.add_row(f"{c.name}@{c.version}", c.kind, outcome, contract_digest(c)[:19] + "…")
    console.print(table)


@app.command()
def codegen(
    check: Annotated[
        bool, typer.Option("--check", help="Fail if generated code is stale.")
    ] = False,
    json: JsonOpt = False,
) -> None:
    """Generate the Python and TypeScript bindings; with --check, only compare."""
    from accord.contracts.codegen import generate_all  # noqa: PLC0415 - heavy, this command only

    try:
        report = generate_all(workspace().root, check=check)
    except ContractLintError as exc:
        refused_json(json, "sources do not lint", exc.diagnostics)
    except ContractError as exc:  # e.g. the TypeScript toolchain is not installed
        refuse(str(exc))
    if json:
        emit_json(
            {
                "ok": report.ok,
                "check": check,
                "written": report.written,
                "removed": report.removed,
                "unchanged": len(report.unchanged),
            }
        )
    else:
        verb = "differ from a fresh generation" if check else "written"
        for path in report.differing:
            console.print(f"{path}: {'differs' if check else 'written'}")
        console.print(f"{len(report.differing)} file(s) {verb}, {len(report.unchanged)} unchanged")
    raise typer.Exit(0 if report.ok else EXIT_REFUSED)


@app.command()
def docs(
    check: Annotated[
        bool, typer.Option("--check", help="Fail if a generated region is stale; write nothing.")
    ] = False,
    out: Annotated[
        Path | None, typer.Option("--out", help="The document (default: docs/protocol.md).")
    ] = None,
    json: JsonOpt = False,
) -> None:
    """Regenerate the contract tables between the markers of docs/protocol.md, prose untouched."""
    ws = workspace()
    target = out if out is not None else ws.root / "docs" / "protocol.md"
    shown = target.relative_to(ws.root) if target.is_relative_to(ws.root) else target
    try:
        text = target.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        usage(f"cannot read {target}: {getattr(exc, 'strerror', None) or exc}")
    contracts, diagnostics = lint_paths([ws.sources]) if ws.sources.is_dir() else ([], [])
    if any(d.severity == "error" for d in diagnostics):
        refused_json(json, "sources do not lint", diagnostics)
    try:
        rendered = render_document(text, Catalog(contracts))
    except (DocumentError, ValueError) as exc:  # ValueError: two contracts under one name
        refuse(f"{shown}: {exc}", as_json=json)
    if not check and not rendered.ok:
        try:
            atomic_write(target, rendered.text)
        except OSError as exc:
            refuse(f"cannot write {shown}: {exc.strerror or exc}", as_json=json)
    if json:
        emit_json(
            {
                "ok": rendered.ok or not check,
                "check": check,
                "path": str(target),
                "regions": list(rendered.regions),
                "stale": list(rendered.stale),
            }
        )
    else:
        verb = "is stale" if check else "written"
        for name in rendered.stale:
            console.print(f"{shown}: region {name} {verb}")
        console.print(
            f"{len(rendered.stale)} of {len(rendered.regions)} generated region(s) "
            + ("stale" if check else "rewritten")
            + ("; run `accord contracts docs` to regenerate" if check and rendered.stale else "")
        )
    raise typer.Exit(EXIT_REFUSED if check and not rendered.ok else 0)


@app.command()
def validate(
    contract: Annotated[str, typer.Argument(help="name@version or a source file.")],
    file: Annotated[str, typer.Argument(help="JSON message file, or - for stdin.")],
    shadow: Annotated[bool, typer.Option(help="Record violations without refusing.")] = False,
    json: JsonOpt = False,
) -> None:
    """Validate one JSON message against a message contract."""
    from accord.contracts.validate import (  # noqa: PLC0415 - compiles schemas on import
        ValidationResult,
        Validator,
    )

    target = _resolve(workspace(), contract)
    if not isinstance(target, MessageContract):
        usage(f"{contract} is a {target.kind} contract; only messages are validated")
    try:
        data = sys.stdin.buffer.read() if file == "-" else Path(file).read_bytes()
    except OSError as exc:
        usage(f"cannot read {file}: {exc.strerror}")
    mode: Literal["enforce", "shadow"] = "shadow" if shadow else "enforce"
    too_long = _too_long_integer(data)  # Python cannot convert it: refused here, by its path
    if too_long is not None:
        result = ValidationResult(False, None, (too_long,), (), mode, decoded=False)
    else:
        result = Validator.for_contract(target).validate(data, mode=mode)
    violations = [{"path": v.path, "code": v.code, "message": v.message} for v in result.violations]
    if json:
        emit_json(
            {
                "ok": result.ok,
                "accepted": result.accepted,
                "mode": result.mode,
                "contract": str(target.ref),
                "violations": violations,
            }
        )
    else:
        for v in result.violations:
            line = f"{escape(v.path or '$')}[/red] {v.code}: {escape(v.message)}"
            console.print("[red]" + line, soft_wrap=True)
        state = "valid" if result.ok else ("recorded (shadow)" if result.accepted else "invalid")
        console.print(f"{target.ref}: {state}")
    raise typer.Exit(0 if result.accepted else EXIT_REFUSED)


class _LongInt(str):
    """The digits of an integer too long for ``int()`` (Python's int max str digits)."""


def _too_long_integer(data: bytes) -> FieldViolation | None:
    """The violation for the first integer in ``data`` with more digits than Python converts
    (``sys.get_int_max_str_digits``), naming its path; ``None`` when there is none, or when
    ``data`` is not JSON (the validator says why). Only data holding such a run of digits is
    decoded here, and digits inside strings are not numbers."""
    limit = sys.get_int_max_str_digits()
    if not limit or re.search(rb"[0-9]{%d}" % (limit + 1), data) is None:
        return None

    def number(text: str) -> int | _LongInt:
        return _LongInt(text) if len(text.lstrip("-")) > limit else int(text)

    try:
        value = json_module.loads(data, parse_int=number, object_pairs_hook=_Pairs)
    except ValueError:
        return None
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, _LongInt):
            digits = len(node.lstrip("-"))
            message = f"integer of {digits} digits: more than {limit} digits cannot be converted"
            return FieldViolation(path, message, "number-too-long")
        children = (
            node if isinstance(node, _Pairs) else enumerate(node) if isinstance(node, list) else ()
        )
        stack.extend((join(path, k), v) for k, v in reversed(list(children)))
    return None


class _Pairs(list[tuple[str, Any]]):
    """An object's members in order, duplicates kept (so none hides a long integer)."""


@app.command()
def show(
    name: Annotated[str, typer.Argument(help="name or name@version")],
    json: JsonOpt = False,
) -> None:
    """Show a contract: its canonical form, digest, status and known versions."""
    ws = workspace()
    if "@" in name:
        contract = _resolve(ws, name)
        versions = ws.versions(contract.name)
    else:
        versions = ws.versions(name)
        if not versions:
            usage(f"no contract named {name!r}")
        contract = versions[-1]
    published = {(c.name, c.version) for c in ws.store.published()}
    info = {
        **contract_summary(contract),
        "published": (contract.name, contract.version) in published,
        "versions": [c.version for c in versions],
        "contract": to_canonical(contract),
    }
    if json:
        emit_json(info)
        return
    console.print(
        f"[bold]{contract.kind} {contract.name}@{contract.version}[/bold] "
        f"({contract.status}, owner {contract.owner})"
    )
    console.print(
        f"digest {info['digest']}  published: {info['published']}  versions: {info['versions']}"
    )
    console.print_json(data=info["contract"])
