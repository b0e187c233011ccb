"""Atomic file replacement, the one way Accord writes a file that others may read.

Every layer writes files through it (the contract code generator, the CLI, the artefact store,
the cache, the worker's storage), so it sits in the bottom layer of the import contract
(``pyproject.toml``, beside :mod:`accord.canonical` and :mod:`accord.errors`) and imports nothing
from Accord: only the standard library.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write"]


def atomic_write(path: Path, data: bytes | str) -> None:
    """Replace ``path`` with ``data`` (text is written as UTF-8, byte for byte) so that readers
    see the old file or the new, never half: a temporary file in the same folder, fsynced, renamed
    over the target, the folder fsynced."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
