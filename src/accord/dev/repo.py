"""The development rules' only I/O: reading a repository tree, and its changes from git.

Everything else in :mod:`accord.dev` works on the texts and data this module returns.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from accord.contracts.catalog import Catalog
from accord.contracts.sources import SOURCES_DIR, load_catalog
from accord.dev.graph import ContractGraph
from accord.dev.layout import Layout, read_package

__all__ = ["GitError", "changed_paths", "read_graph", "read_layout"]

_SOURCE_SUFFIXES = (".py", ".ts")


class GitError(RuntimeError):
    """git could not say what changed (no repository, an unknown ref)."""


def _package_files(folder: Path) -> dict[str, str]:
    files: dict[str, str] = {}
    for path in folder.rglob("*"):
        rel = path.relative_to(folder).as_posix()
        if not path.is_file() or rel.startswith(("node_modules/", "dist/")) or "/." in f"/{rel}":
            continue
        wanted = rel in {"pyproject.toml", "package.json"} or (
            rel.startswith(("src/", "tests/", "test/")) and rel.endswith(_SOURCE_SUFFIXES)
        )
        files[rel] = path.read_text(encoding="utf-8") if wanted else ""
    return files


def read_layout(root: Path) -> Layout:
    """Every package under ``root/workers``."""
    packages = {}
    base = root / "workers"
    for folder in sorted(base.iterdir()) if base.is_dir() else ():
        if (folder / "pyproject.toml").is_file() or (folder / "package.json").is_file():
            packages[folder.name] = read_package(folder.name, _package_files(folder))
    return Layout(packages)


def read_catalog(root: Path) -> Catalog:
    return load_catalog(root / SOURCES_DIR)


def read_graph(root: Path) -> ContractGraph:
    """The contract graph of ``root/schemas/contracts`` (lint errors raise as they do there)."""
    root = root.resolve()
    return ContractGraph.from_catalog(read_catalog(root), str(root))


def _git(root: Path, *args: str) -> list[str]:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, check=False
        )
    except FileNotFoundError as exc:
        raise GitError("git is not installed") from exc
    if done.returncode != 0:
        message = (done.stderr.strip().splitlines() or ["git failed"])[0]
        raise GitError(f"git {' '.join(args)}: {message}")
    return [line for line in done.stdout.splitlines() if line.strip()]


def changed_paths(root: Path, base: str) -> list[str]:
    """Paths changed since the fork point of ``base`` and ``HEAD``: committed, staged and in the
    work tree (both sides of a rename), plus untracked files not ignored."""
    _git(root, "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}")
    # from where this branch left ``base``: what ``base`` gained since is not this change
    fork = _git(root, "merge-base", base, "HEAD")[0]
    changed = _git(root, "diff", "--name-only", "--no-renames", fork)
    changed += _git(root, "ls-files", "--others", "--exclude-standard")
    return sorted(set(changed))
