"""`accord demo`: the model-ingest workflow for real, on the embedded default with no server.

1. contracts — lint every source, diff ``thumbnail-generation-request`` 1 → 2, publish
   (idempotently: published versions are verified unchanged, never rewritten), generate bindings;
2. workflow — compile ``workflows/model-ingest.yaml`` against the contracts and activate it;
3. fleet — start the engine (SQLite store and embedded queue in ``.accord/demo/accord.db``, or
   ``--store redis://… --transport bullmq://…|amqp://…``), the platform actions and the three
   reference workers in-process, each announcing its capability;
4. ingest — copy each model of ``examples/models`` (or ``--models DIR``) into the object store
   and start one run per model, showing runs and stages live;
5. report — one row per model (route, stage durations, key metadata, thumbnail path), and where
   the outputs are. A second ``accord demo`` finds every model in the cache: the decision takes
   the cache-hit branch straight to publish, and no worker runs.

Every step uses the same code paths as the other commands; a refusal stops with exit code 1.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from accord.cli._common import (
    EXIT_REFUSED,
    EXIT_USAGE,
    LoopOpt,
    console,
    emit_json,
    pick_loop,
    print_diagnostics,
)
from accord.cli._registry import Workspace, workspace
from accord.contracts import compat
from accord.contracts.model import MessageContract
from accord.contracts.sources import lint_paths
from accord.errors import AccordError, ContractLintError
from accord.loop import run as run_on_loop

EVOLUTION = ("thumbnail-generation-request@1", "thumbnail-generation-request@2")
WORKERS = (
    ("thumbnail-render", "accord_worker_thumbnail_render.handler"),
    ("semantic-analyse", "accord_worker_semantic_analyse.handler"),
    ("metadata-extract", "accord_worker_metadata_extract.handler"),
)
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


def reference_workers(root: Path) -> list[Any]:
    """The three reference workers; from ``workers/*/src`` when they are not installed."""
    found = []
    for folder, module_name in WORKERS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            for base in (root, Path(__file__).resolve().parents[3]):  # workspace, then checkout
                sys.path.insert(0, str(base / "workers" / folder / "src"))
            module = importlib.import_module(module_name)
        found.append(module.worker)
    return found


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
    store: Annotated[str | None, typer.Option("--store", help="Store URL (redis://…).")] = None,
    transport: Annotated[
        str | None, typer.Option("--transport", help="Transport URL (bullmq://…, amqp://…).")
    ] = None,
    loop: LoopOpt = "auto",
) -> None:
    """Contracts, then the model-ingest workflow over real models, live; run again to hit the
    cache."""
    if (store is None) != (transport is None):
        console.print("[red]demo stopped:[/red] --store and --transport go together")
        raise typer.Exit(EXIT_USAGE)
    chosen_loop = pick_loop(loop)
    ws = workspace()
    folder = models or ws.root / "examples" / "models"
    found: list[tuple[str, Path]] = []
    if not contracts_only:  # a bad folder is refused before anything is written
        if not folder.is_dir():
            console.print(f"[red]demo stopped:[/red] no model folder at {folder}")
            raise typer.Exit(EXIT_USAGE)
        found = model_files(folder)
        if not found:
            kinds = ", ".join(sorted(SUFFIXES))
            console.print(f"[red]demo stopped:[/red] no model files ({kinds}) in {folder}")
            raise typer.Exit(EXIT_USAGE)
    try:
        steps = contract_phase(ws)
    except AccordError as exc:
        print_diagnostics(getattr(exc, "diagnostics", ()))
        console.print(f"[red]demo stopped:[/red] {str(exc).splitlines()[0]}")
        raise typer.Exit(EXIT_REFUSED) from exc
    if not json_out:
        console.print(steps)
    if contracts_only:
        return
    from accord.cli._demo_run import run_demo  # noqa: PLC0415 - engine and workers load here

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
            ),
            chosen_loop,
        )
    except AccordError as exc:
        print_diagnostics(getattr(exc, "diagnostics", ()))
        console.print(f"[red]demo stopped:[/red] {str(exc).splitlines()[0]}")
        raise typer.Exit(EXIT_REFUSED) from exc
    if json_out:
        emit_json(rows)
    if any(r["status"] != "completed" for r in rows):
        raise typer.Exit(EXIT_REFUSED)
