"""Contract sources on disk: the repository's layout, and the catalog read from it.

Reading the files is :mod:`accord.contracts.dsl.files` (re-exported here: :func:`read_sources`,
:func:`lint_paths`, :func:`load_file`, :func:`load_directory`); everything else in ``contracts/``
is pure and works on text or data, and nothing here writes. This module knows the repository's
default layout (``schemas/contracts/`` for sources, ``schemas/published/`` for artefacts), found
by walking up from a start directory.
"""

from __future__ import annotations

from pathlib import Path

from accord.contracts.catalog import Catalog
from accord.contracts.dsl.files import lint_paths, load_directory, load_file, read_sources

__all__ = [
    "ARTEFACTS_DIR",
    "SOURCES_DIR",
    "find_root",
    "lint_paths",
    "load_catalog",
    "load_directory",
    "load_file",
    "read_sources",
]

SOURCES_DIR = Path("schemas/contracts")
ARTEFACTS_DIR = Path("schemas/published")


def find_root(start: Path | None = None) -> Path:
    """The nearest directory at or above ``start`` holding ``pyproject.toml`` or ``schemas/``."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "schemas").is_dir() or (candidate / "pyproject.toml").is_file():
            return candidate
    return here


def load_catalog(path: Path) -> Catalog:
    """A :class:`Catalog` of every contract source under ``path`` (e.g. ``schemas/contracts``)."""
    return Catalog(load_directory(path))
