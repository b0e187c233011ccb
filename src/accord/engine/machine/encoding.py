"""Canonical text for records, cheaply, and documents that carry their text.

A transition encodes a few dozen small documents (:func:`accord.canonical.canonical_text`, the
fast encoder held to the reference's bytes). :class:`EncodedDoc` is a JSON document with its
canonical text attached: the shell hands a store the run record as one, and a store that writes
text takes the text instead of encoding the document a second time.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from accord.canonical import canonical_text

__all__ = ["EncodedDoc", "canonical_key", "canonical_text"]


class EncodedDoc(dict[str, Any]):
    """A JSON document with ``canonical_json(doc).decode()`` attached as ``canonical``."""

    __slots__ = ("canonical",)

    def __init__(self, doc: Mapping[str, Any], canonical: str) -> None:
        super().__init__(doc)
        self.canonical = canonical


@functools.lru_cache(maxsize=4096)  # stage names: a plan's few, reused by every run
def canonical_key(name: str) -> str:
    return canonical_text(name)
