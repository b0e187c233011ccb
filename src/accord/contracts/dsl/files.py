"""Reading contract sources from disk: the file-reading entry of the contract DSL.

Everything else in ``contracts/`` is pure and works on text or data. This module only finds files,
reads them as UTF-8 and hands the text to :mod:`accord.contracts.dsl.lint`; it never writes. The
repository's default layout and the catalog built from it are :mod:`accord.contracts.sources`,
which re-exports these functions.
"""

from __future__ import annotations

import os
from pathlib import Path

from accord.contracts.dsl.lint import lint_sources, parse_sources, parse_text
from accord.contracts.model import Contract
from accord.contracts.yamlsource import MAX_BYTES
from accord.errors import ContractLintError, Diagnostic, Location

__all__ = ["lint_paths", "load_directory", "load_file", "read_sources"]


def _read(path: Path) -> str:
    """The UTF-8 text of ``path`` with universal newlines (as ``read_text`` gives it); a file
    over :data:`MAX_BYTES` is refused without being read past the limit."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_BYTES + 1)
            if len(data) > MAX_BYTES:
                size = max(os.fstat(f.fileno()).st_size, len(data))
                message = f"the source is {size:,} bytes, over the limit of {MAX_BYTES:,} (1 MiB)"
                raise ContractLintError(
                    [Diagnostic("yaml-too-large", message, Location(str(path), 1, 1))]
                )
        text = data.decode("utf-8")
        return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text
    except UnicodeDecodeError as exc:
        raise ContractLintError(
            [Diagnostic("source-encoding", f"not UTF-8 text: {exc.reason}", Location(str(path)))]
        ) from exc
    except OSError as exc:
        raise ContractLintError(
            [Diagnostic("source-unreadable", exc.strerror or str(exc), Location(str(path)))]
        ) from exc


def read_sources(paths: list[Path]) -> dict[str, str]:
    """Text of every ``*.yaml``/``*.yml`` file named or found (recursively) under ``paths``."""
    files: list[Path] = []
    missing: list[Diagnostic] = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml"))
        elif path.is_file():
            files.append(path)
        else:
            missing.append(
                Diagnostic("source-missing", "no such file or directory", Location(str(path)))
            )
    if missing:
        raise ContractLintError(missing)
    return {str(f): _read(f) for f in files}


def lint_paths(paths: list[Path]) -> tuple[list[Contract], list[Diagnostic]]:
    """Lint files and directories together (cross-references resolve across all of them)."""
    return lint_sources(read_sources(paths))


def load_file(path: Path) -> Contract:
    """Read and parse one source file; raises :class:`ContractLintError` with every finding."""
    return parse_text(_read(path), str(path))


def load_directory(path: Path) -> list[Contract]:
    """Every contract under ``path``; raises :class:`ContractLintError` with every finding."""
    return parse_sources(read_sources([path]))
