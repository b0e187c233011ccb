"""Field paths: the one spelling every Accord binding uses to name a place in a message.

A path is relative to the message root (the root itself is ``""``, shown as ``$``): object
members are joined with ``.``, array items are ``[index]``, so ``views[2].angle``. A member name
that is not a plain identifier (``[A-Za-z_][A-Za-z0-9_-]*``) is written ``["…"]`` with JSON string
escaping, so every path is unambiguous. The TypeScript binding implements the same function and
the golden fixtures hold both to it.

Declared tolerances name *schema* paths, where ``[]`` stands for "every item": ``views[].angle``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

__all__ = ["format_path", "join", "tolerance_segments"]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_TOLERANCE_PIECE = re.compile(r"([A-Za-z_][A-Za-z0-9_-]*)((?:\[\])*)")


def join(base: str, part: str | int) -> str:
    """``base`` extended by one member name or array index."""
    if isinstance(part, int):
        return f"{base}[{part}]"
    if _IDENT.fullmatch(part):
        return f"{base}.{part}" if base else part
    return f"{base}[{json.dumps(part, ensure_ascii=False)}]"


def format_path(parts: Iterable[str | int]) -> str:
    """The path of a sequence of member names and indexes (as a JSON Schema engine reports)."""
    out = ""
    for part in parts:
        out = join(out, part)
    return out


def tolerance_segments(path: str) -> list[str]:
    """Split a tolerance path into member names and ``[]`` markers: ``a[].b`` → a, [], b."""
    segments: list[str] = []
    for piece in path.split("."):
        match = _TOLERANCE_PIECE.fullmatch(piece)
        if match is None:
            raise ValueError(f"bad tolerance path {path!r}")
        segments.append(match.group(1))
        segments.extend(["[]"] * (len(match.group(2)) // 2))
    return segments
