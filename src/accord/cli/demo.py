"""`accord demo`: the model-ingest workflow for real, on the embedded default with no server.

1. contracts — lint every source, diff ``thumbnail-generation-request`` 1 → 2, publish
   (idempotently: published versions are verified unchanged, never rewritten), generate bindings;
2. workflow — compile ``workflows/model-ingest.yaml`` against the contracts and activate it;
3. fleet — start the engine (SQLite store and embedded queue in ``.accord/demo/accord.db``, or
   ``--store redis://… --transport bullmq://…|amqp://…``), the platform actions and the three
   reference workers in-process, each announcing its capability;
4. ingest — copy each model of ``examples/models`` (or ``--models DIR``) into the object store
   (the state directory, or an S3 bucket with ``--objects s3://…``: :mod:`._demo_objects`, which
   puts the result cache there too) and start one run per model, showing runs and stages live;
5. report — one row per model (route, stage durations, key metadata, thumbnail path), and where
   the outputs are; with ``--serve``, the HTTP API (``accord serve``) then runs on the same store
   until stopped, and an admin key for the demo's tenant is printed once. A second ``accord
   demo`` finds every model in the cache: the decision takes the cache-hit branch straight to
   publish, and no worker runs.

Every step uses the same code paths as the other commands; a refusal stops with exit code 1.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.table import Table

from accord.cli._common import (
    EXIT_REFUSED,
    EXIT_USAGE,
    LoopOpt,
    console,
    emit_json,
    pick_loop,
    refuse,
)
from accord.cli._demo_objects import run_demo_objects
from accord.cli._demo_run import run_demo
from accord.cli._redaction import (
    configure_logging,
    load_catalog_quietly,
    sealing_from_env,
    warn_unsealed,
)
from accord.cli._registry import Workspace, workspace
from accord.cli.telemetry import ProjectionOpt, index_runs
from accord.contracts import compat
from accord.contracts.model import MessageContract
from accord.contracts.sealing import SealingError
from accord.contracts.sources import lint_paths
from accord.errors import AccordError, ContractLintError, Diagnostic
from accord.loop import run as run_on_loop

EVOLUTION = ("thumbnail-generation-request@1", "thumbnail-generation-request@2")
SUFFIXES = frozenset({".stl", ".obj", ".ply", ".glb", ".gltf", ".3mf", ".off"})


def contract_phase(ws: Workspace) -> Table:
    """Lint, diff, publish and generate; the table of what each step did (raises on refusal)."""
    steps = Table(title=f"accord demo — contracts in {ws.sources.relative_to(ws.root)}")
    for column in ("step", "result", "detail"):
        steps.add_column(column, overflow="fold")
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
    return steps


def model_files(folder: Path) -> list[tuple[str, Path]]:
    """``(modelId, file)`` for each model file in ``folder``; ids are unique and contract-safe."""
    chosen: dict[str, Path] = {}
    for path in sorted(p for p in folder.iterdir() if p.suffix.lower() in SUFFIXES):
        base = re.sub(r"[^A-Za-z0-9_-]", "-", path.stem)[:56] or "model"
        model_id, n = base, 1
        while model_id in chosen:
            n += 1
            model_id = f"{base}-{n}"
        chosen[model_id] = path
    return list(chosen.items())


def demo(
    models: Annotated[Path | None, typer.Option("--models", help="Ingest DIR's models.")] = None,
    state: Annotated[Path | None, typer.Option("--state", help="State dir (.accord/demo).")] = None,
    tenant: Annotated[str, typer.Option("--tenant", help="Tenant of the runs.")] = "demo",
    contracts_only: Annotated[bool, typer.Option("--contracts-only")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    *,
    store: Annotated[
        str | None, typer.Option("--store", help="Store URL (redis://…, postgresql://…).")
    ] = None,
    transport: Annotated[
        str | None, typer.Option("--transport", help="Transport URL (bullmq://…, amqp://…).")
    ] = None,
    loop: LoopOpt = "auto",
    serve: Annotated[
        bool, typer.Option("--serve", help="Then serve the HTTP API on its store until stopped.")
    ] = False,
    objects: Annotated[
        str | None, typer.Option("--objects", help="Objects in S3: s3://bucket?endpoint=….")
    ] = None,
    projection: ProjectionOpt = None,
) -> None:
    """Contracts, then the model-ingest workflow over real models, live; run again to hit the
    cache."""
    if serve and (json_out or contracts_only):
        _stopped("--serve runs until stopped: not with --json or --contracts-only", EXIT_USAGE)
    if transport is None and store is not None and store.lower().startswith("postgresql:"):
        transport = store  # the queue tables live in the store's own database
    if (store is None) != (transport is None):
        _stopped("--store and --transport go together", EXIT_USAGE)
    if objects is not None and not objects.startswith("s3://"):
        _stopped("--objects takes an s3://bucket[/prefix]?endpoint=… URL", EXIT_USAGE)
    chosen_loop = pick_loop(loop)
    ws = workspace()
    folder = models or ws.root / "examples" / "models"
    found: list[tuple[str, Path]] = []
    if not contracts_only:  # a bad folder is refused before anything is written
        if not folder.is_dir():
            _stopped(f"no model folder at {folder}", EXIT_USAGE)
        found = model_files(folder)
        if not found:
            kinds = ", ".join(sorted(SUFFIXES))
            _stopped(f"no model files ({kinds}) in {folder}", EXIT_USAGE)
    try:  # a bad sealing key is refused before anything is written
        sealing = sealing_from_env()
    except SealingError as exc:
        _stopped(str(exc), EXIT_USAGE)
    try:
        steps = contract_phase(ws)
    except AccordError as exc:
        _refused(exc)
    if not json_out:
        console.print(steps)
    if contracts_only:
        if json_out:
            emit_json({"ok": True, "steps": _table_rows(steps)})
        return
    configure_logging(load_catalog_quietly(ws.sources))
    embedded = (state or ws.root / ".accord" / "demo") / "accord.db"
    warn_unsealed(store or f"sqlite:///{embedded}")
    try:
        rows = run_on_loop(
            run_demo(
                ws,
                found,
                state or ws.root / ".accord" / "demo",
                tenant,
                quiet=json_out,
                store=store,
                transport=transport,
                sealing=sealing,
            )
            if objects is None
            else run_demo_objects(
                ws,
                found,
                state or ws.root / ".accord" / "demo",
                tenant,
                objects,
                quiet=json_out,
                store=store,
                transport=transport,
                sealing=sealing,
            ),
            chosen_loop,
        )
    except AccordError as exc:
        _refused(exc)
    index_runs(projection, store or f"sqlite:///{embedded}")  # the search projection, rebuilt
    if json_out:
        emit_json(rows)
    if any(r["status"] != "completed" for r in rows):
        raise typer.Exit(EXIT_REFUSED)
    if serve:  # the same store, actions' state and contracts, now behind `accord serve`
        from accord.cli.serve import serve_demo  # noqa: PLC0415 - only with --serve

        demo_state = state or ws.root / ".accord" / "demo"
        url = store or f"sqlite:///{embedded}"
        serve_demo(url, transport or url, demo_state, ws.sources, tenant, chosen_loop)


def _stopped(message: str, code: int, diagnostics: Iterable[Diagnostic] = ()) -> NoReturn:
    """Stop the demo: ``demo stopped: …`` on stderr, or one JSON document with ``--json``."""
    refuse(f"demo stopped: {message}", code, diagnostics=diagnostics)


def _refused(exc: AccordError) -> NoReturn:
    _stopped(str(exc).splitlines()[0], EXIT_REFUSED, getattr(exc, "diagnostics", ()))


def _table_rows(table: Table) -> list[dict[str, str]]:
    """A table's rows as ``{header: cell}`` (the ``--json`` form of the contract steps)."""
    headers = [str(c.header) for c in table.columns]
    rows = zip(*(c.cells for c in table.columns), strict=True)
    return [dict(zip(headers, map(str, row), strict=True)) for row in rows]
