"""Canonical text for records, cheaply: one encoder made once, and documents that carry their text.

``canonical_json`` builds a fresh ``JSONEncoder`` per call, which is most of the cost of encoding
a small document; a transition encodes a few dozen small ones, so the records share one encoder
with exactly its settings (sorted keys, no whitespace, UTF-8, no NaN). :class:`EncodedDoc` is a
JSON document with its canonical text attached: the shell hands a store the run record as one, and
a store that writes text takes the text instead of encoding the document a second time.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["EncodedDoc", "canonical_key", "canonical_text"]

_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


class EncodedDoc(dict[str, Any]):
    """A JSON document with ``canonical_json(doc).decode()`` attached as ``canonical``."""

    __slots__ = ("canonical",)

    def __init__(self, doc: Mapping[str, Any], canonical: str) -> None:
        super().__init__(doc)
        self.canonical = canonical


def canonical_text(value: Any) -> str:
    """``canonical_json(value).decode("utf-8")``, with the shared encoder."""
    return _ENCODER.encode(value)


@functools.lru_cache(maxsize=4096)  # stage names: a plan's few, reused by every run
def canonical_key(name: str) -> str:
    return _ENCODER.encode(name)
