"""The string formats Accord checks, one table shared by every binding.

JSON Schema engines disagree on what ``format`` means (annotation or assertion, and which
grammar), so Accord fixes it: each known format is one regular expression written in the common
subset of Python ``re`` and ECMAScript ``RegExp`` (ASCII classes spelled out, no ``\\d``), and the
TypeScript binding is generated from this very table. A format not listed here is an annotation
only, in every language.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from types import MappingProxyType

__all__ = ["FORMAT_PATTERNS", "format_checkers"]

_DATE = r"[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"
_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:(?:[0-5][0-9]|60)(?:\.[0-9]+)?"
_OFFSET = r"(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"

FORMAT_PATTERNS: Mapping[str, str] = MappingProxyType(
    {
        "date": rf"^{_DATE}$",
        "date-time": rf"^{_DATE}[Tt]{_TIME}{_OFFSET}$",
        "digest": r"^sha256:[0-9a-f]{64}$",
        "duration-ms": r"^[0-9]{1,15}$",
        # an object-store key: relative, no empty, '.' or '..' segment, no control characters
        "object-key": (
            r"^(?!/)(?!.*//)(?!(?:.*/)?\.{1,2}(?:/|$))[^\u0000-\u001f\u007f\\]{1,1024}$"
        ),
        "uri": r"^[A-Za-z][A-Za-z0-9+.-]*:[^\u0000-\u0020\u007f]+$",
        "uuid": r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
    }
)


def _checker(pattern: str) -> Callable[[str], bool]:
    compiled = re.compile(pattern)
    return lambda value: compiled.fullmatch(value) is not None


def format_checkers() -> dict[str, Callable[[str], bool]]:
    """One predicate per known format, for ``jsonschema_rs`` (``formats=``)."""
    return {name: _checker(pattern) for name, pattern in FORMAT_PATTERNS.items()}
