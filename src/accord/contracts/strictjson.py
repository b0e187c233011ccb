"""Strict JSON decoding for messages arriving as bytes.

Python's ``json`` module is lenient where a boundary must not be: it accepts ``NaN`` and
``Infinity``, keeps the last of duplicate keys, decodes lone surrogate escapes and recurses until
the interpreter's limit. :func:`loads_strict` refuses all of these with a :class:`JsonRejected`
carrying a stable code, after the caller has already refused oversized input (size is checked
before any decoding). Codes: ``not-utf8``, ``malformed-json``, ``duplicate-key``,
``non-finite-number``, ``lone-surrogate``, ``too-deep``.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["DEFAULT_MAX_DEPTH", "JsonRejected", "loads_strict"]

DEFAULT_MAX_DEPTH = 64
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abAB]", re.ASCII)


class JsonRejected(ValueError):
    """The bytes are not one strict JSON document; ``code`` is stable, ``path`` may be set."""

    def __init__(self, code: str, message: str, path: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.path = path


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):  # rare: find the first repeated key for the message
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise JsonRejected("duplicate-key", f"duplicate key {key!r} in an object")
            seen.add(key)
    return out


def _constant(name: str) -> Any:
    raise JsonRejected("non-finite-number", f"{name} is not a JSON number")


def loads_strict(
    data: bytes | bytearray | memoryview | str, max_depth: int = DEFAULT_MAX_DEPTH
) -> Any:
    """Decode one JSON document strictly, or raise :class:`JsonRejected`."""
    if isinstance(data, bytes | bytearray | memoryview):
        raw = bytes(data)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonRejected("not-utf8", f"input is not UTF-8 (byte {exc.start})") from None
    else:
        text = data
        raw = b"\\u" if "\\u" in text else b""
    try:
        value = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant)
    except JsonRejected:
        raise
    except RecursionError:
        raise JsonRejected("too-deep", f"nesting deeper than {max_depth} levels") from None
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise JsonRejected("malformed-json", f"malformed JSON at {where}: {exc.msg}") from None
    if text.count("[") + text.count("{") > max_depth:  # cheap bound: most messages stop here
        _check_depth(value, max_depth)
    if _SURROGATE_ESCAPE.search(raw):
        _check_strings(value)
    return value


def _check_depth(value: Any, max_depth: int) -> None:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > max_depth:
            raise JsonRejected("too-deep", f"nesting deeper than {max_depth} levels")
        stack.extend((child, depth + 1) for child in children)


def _check_strings(value: Any) -> None:
    stack = [value]
    while stack:
        node = stack.pop()
        texts: list[str] = []
        if isinstance(node, dict):
            texts.extend(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str):
            texts.append(node)
        for text in texts:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise JsonRejected("lone-surrogate", "string holds a lone surrogate") from None
