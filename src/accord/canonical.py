"""Canonical JSON and digests, shared by contracts and plans.

Canonical form: UTF-8, keys sorted, no insignificant whitespace, no NaN or infinities. Two values
that mean the same thing serialise to the same bytes, so their sha256 digests agree.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["canonical_json", "digest_of", "sha256_hex"]


def canonical_json(value: Any) -> bytes:
    """Serialise ``value`` canonically (raises ``ValueError`` on NaN/inf)."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest_of(value: Any) -> str:
    """``sha256:<hex>`` over the canonical JSON of ``value``."""
    return "sha256:" + sha256_hex(canonical_json(value))
