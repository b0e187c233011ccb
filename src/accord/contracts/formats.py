"""The string formats Accord checks, one table shared by every binding.

JSON Schema engines disagree on what ``format`` means (annotation or assertion, and which
grammar), so Accord fixes it: each known format is one regular expression written in the common
subset of Python ``re``, Rust ``regex`` (what ``jsonschema_rs`` runs) and ECMAScript ``RegExp``:
ASCII classes spelled out (no ``\\d``), anchored, no lookaround. The validators compile each
into a ``pattern`` of their engine schema and the TypeScript binding is generated from this very
table. A format not listed here is an annotation only, in every language.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["FORMAT_PATTERNS"]

_DATE = r"[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"
_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:(?:[0-5][0-9]|60)(?:\.[0-9]+)?"
_CHAR = r"[^/\u0000-\u001f\u007f\\]"
_FIRST = r"[^./\u0000-\u001f\u007f\\]"
_SEGMENT = rf"(?:{_FIRST}{_CHAR}*|\.{_FIRST}{_CHAR}*|\.\.{_CHAR}+)"
_OFFSET = r"(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"

FORMAT_PATTERNS: Mapping[str, str] = MappingProxyType(
    {
        "date": rf"^{_DATE}$",
        "date-time": rf"^{_DATE}[Tt]{_TIME}{_OFFSET}$",
        "digest": r"^sha256:[0-9a-f]{64}$",
        "duration-ms": r"^[0-9]{1,15}$",
        # an object-store key: relative, '/'-separated, no empty, '.' or '..' segment, no control
        # character or backslash (lengths are the field's maxLength; no lookaround, so every
        # engine runs it as a plain automaton)
        "object-key": rf"^{_SEGMENT}(?:/{_SEGMENT})*$",
        "uri": r"^[A-Za-z][A-Za-z0-9+.-]*:[^\u0000-\u0020\u007f]+$",
        "uuid": r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
    }
)
