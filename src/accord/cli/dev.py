"""``accord dev``: working in the monorepo (docs/monorepo.md).

``accord dev affected [PATH...] [--base REF] [--run] [--json]`` prints which workers and parts
of the platform the changed paths touch (the paths given, else those changed since the fork
point of ``REF`` and ``HEAD``, work tree and untracked files included); ``--run`` then runs
their suites (each worker's, and the platform's own when it is touched) and exits 1 on the first
that fails. ``accord dev ci [--check]`` writes ``.github/workflows/ci-<worker>.yaml`` and each
deployed worker's Kustomize base (``workers/<name>/k8s/``: its capabilities and their published
digests) (``--check`` writes nothing and exits 1 when a file differs, is missing or is
stale). ``accord dev new-worker NAME --capability name@version --language
python|typescript [--into DIR]`` scaffolds a worker.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from accord.cli._common import console, emit_json, refuse, usage
from accord.contracts.sources import find_root
from accord.dev.affected import Affected, affected
from accord.dev.ci import CI_DIR, HEADER, ci_files
from accord.dev.graph import ContractGraph
from accord.dev.layout import Layout, LayoutError
from accord.errors import AccordError

app = typer.Typer(
    help="Work in the monorepo: affected sets, per-worker CI, scaffolds.", no_args_is_help=True
)

JsonOpt = Annotated[bool, typer.Option("--json", help="One JSON document.")]


def _read(root: Path) -> tuple[Layout, ContractGraph]:
    from accord.dev.repo import read_graph, read_layout  # noqa: PLC0415 - keep --help light

    try:
        return read_layout(root), read_graph(root)
    except LayoutError as exc:
        refuse(str(exc))
    except AccordError as exc:
        refuse(f"schemas/contracts: {str(exc).splitlines()[0]}")


def suite_commands(found: Affected, layout: Layout) -> list[tuple[str, list[str]]]:
    """``(folder, argv)`` for each suite ``found`` reaches, the platform's own first."""
    commands: list[tuple[str, list[str]]] = []
    if found.platform:
        commands.append((".", [sys.executable, "-m", "pytest", "tests", "-p", "no:cacheprovider"]))
        if "typescript-bindings" in found.parts:
            commands.append(("bindings/typescript", ["npm", "test", "--silent"]))
    for name in found.workers:
        package = layout.packages[name]
        if package.language == "python":
            argv = [
                sys.executable,
                "-m",
                "pytest",
                f"{package.path}/tests",
                "-p",
                "no:cacheprovider",
            ]
            commands.append((".", argv))
        else:
            commands.append(
                (package.path, ["sh", "-c", "npm run --silent build && npm test --silent"])
            )
    return commands


@app.command("affected")
def affected_command(
    paths: Annotated[
        list[str] | None, typer.Argument(help="Changed paths (default: from git).")
    ] = None,
    base: Annotated[str, typer.Option("--base", help="Compare with this ref.")] = "HEAD",
    run: Annotated[bool, typer.Option("--run", help="Run the suites reached.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Which workers and parts of the platform a change touches."""
    root = find_root()
    layout, graph = _read(root)
    if paths:
        changed = list(paths)
    else:
        from accord.dev.repo import GitError, changed_paths  # noqa: PLC0415

        try:
            changed = changed_paths(root, base)
        except GitError as exc:
            refuse(f"--base {base}: {exc}")
    try:
        found = affected(changed, layout, graph)
    except ValueError as exc:
        usage(str(exc))
    commands = suite_commands(found, layout)
    if json_out and not run:
        emit_json(
            {
                "ok": True,
                "base": None if paths else base,
                **found.to_json(),
                "suites": [{"cwd": c, "argv": a} for c, a in commands],
            }
        )
        return
    if not json_out:
        console.print(f"workers: {', '.join(found.workers) or '(none)'}")
        console.print(f"parts: {', '.join(found.parts) or '(none)'}")
        console.print(f"platform suite: {'yes' if found.platform else 'no'}")
    if run:
        failed = None
        for cwd, argv in commands:
            if not json_out:
                console.print(f"$ (cd {cwd} && {' '.join(argv)})")
            # with --json the suites' own output goes to stderr (file descriptor 2): stdout
            # carries the one JSON document
            done = subprocess.run(argv, cwd=root / cwd, check=False, stdout=2 if json_out else None)
            if done.returncode != 0:
                shown = " ".join(argv[2:] if argv[0] == sys.executable else argv)
                failed = shown if cwd == "." else f"{shown} (in {cwd})"
                break
        if failed is not None:
            refuse(f"suite failed: {failed}")
        if json_out:
            emit_json({"ok": True, **found.to_json(), "ran": len(commands)})


def _deploy_files(root: Path, layout: Layout, graph: ContractGraph) -> dict[str, str]:
    """``workers/<name>/k8s/*`` of each worker with a Containerfile, from the rules."""
    from accord.dev.deploy import k8s_base  # noqa: PLC0415 - keep --help light
    from accord.dev.repo import read_catalog  # noqa: PLC0415

    catalog = read_catalog(root)
    out: dict[str, str] = {}
    for package in layout.workers:
        if not package.containerfile:
            continue
        capabilities = []
        for ref in package.capabilities:
            capability = catalog.capability(ref)
            if capability is None:
                refuse(f"{package.path}: binds {ref}, which no contract in schemas/ defines")
            capabilities.append(capability)
        for name, text in k8s_base(package, capabilities, graph.digests).items():
            out[f"{package.path}/k8s/{name}"] = text
    return out


@app.command("ci")
def ci_command(
    check: Annotated[bool, typer.Option("--check", help="Fail when a file would change.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Write (or check) .github/workflows/ci-<worker>.yaml and the workers' k8s bases."""
    root = find_root()
    layout, graph = _read(root)
    wanted = ci_files(layout, graph)
    folder = root / CI_DIR
    present = {
        f"{CI_DIR}/{p.name}": p.read_text(encoding="utf-8")
        for p in (sorted(folder.glob("ci-*.yaml")) if folder.is_dir() else [])
    }
    stale = sorted(p for p, t in present.items() if p not in wanted and t.startswith(HEADER))
    deploy = _deploy_files(root, layout, graph)
    present |= {p: (root / p).read_text(encoding="utf-8") for p in deploy if (root / p).is_file()}
    wanted |= deploy
    differ = sorted(p for p, t in wanted.items() if present.get(p) != t)
    if check:
        if differ or stale:
            what = [f"{p} differs" if p in present else f"{p} is missing" for p in differ]
            what += [f"{p} is stale" for p in stale]
            refuse(
                "CI files or k8s bases drifted from the rules (run `accord dev ci`): "
                + "; ".join(what)
            )
        if json_out:
            emit_json({"ok": True, "files": sorted(wanted)})
        else:
            console.print(f"{len(wanted)} CI files and k8s base files agree with the rules")
        return
    for path in differ:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(wanted[path], encoding="utf-8")
    for path in stale:
        (root / path).unlink()
    if json_out:
        emit_json({"ok": True, "files": sorted(wanted), "written": differ, "removed": stale})
    else:
        console.print(f"{len(differ)} written, {len(stale)} removed, {len(wanted)} in all")


@app.command("new-worker")
def new_worker(
    name: Annotated[str, typer.Argument(help="The worker's folder name under workers/.")],
    capability: Annotated[str, typer.Option("--capability", help="name@version it serves.")],
    language: Annotated[str, typer.Option("--language", help="python or typescript.")],
    into: Annotated[
        Path | None, typer.Option("--into", help="Repository root to write into (default: this).")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Scaffold a worker: package, tests, Containerfile, k8s base and CI file."""
    from accord.dev.ci import render_ci  # noqa: PLC0415
    from accord.dev.layout import read_package  # noqa: PLC0415
    from accord.dev.repo import read_catalog, read_layout  # noqa: PLC0415
    from accord.dev.scaffold import ScaffoldError, scaffold  # noqa: PLC0415

    if language not in {"python", "typescript"}:
        usage(f"--language {language!r}: python or typescript")
    root = find_root()
    target = (into or root).resolve()
    folder = target / "workers" / name
    if folder.exists():
        refuse(f"{folder}: already exists")
    try:
        catalog = read_catalog(root)
    except AccordError as exc:
        refuse(f"schemas/contracts: {str(exc).splitlines()[0]}")
    graph = ContractGraph.from_catalog(catalog, str(root))
    try:
        files = scaffold(
            name,
            capability,
            "python" if language == "python" else "typescript",
            catalog,
            graph.digests,
        )
        existing = read_layout(target).packages
    except (ScaffoldError, LayoutError) as exc:
        refuse(str(exc))
    layout = Layout({**existing, name: read_package(name, files)})
    written = []
    for rel, text in sorted(files.items()):
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(f"workers/{name}/{rel}")
    ci = target / CI_DIR / f"ci-{name}.yaml"
    ci.parent.mkdir(parents=True, exist_ok=True)
    ci.write_text(render_ci(layout, graph, name), encoding="utf-8")
    written.append(f"{CI_DIR}/ci-{name}.yaml")
    if json_out:
        emit_json({"ok": True, "worker": name, "capability": capability, "files": written})
    else:
        console.print(f"scaffolded workers/{name} ({language}, {capability}): {len(written)} files")
