"""The marketplace policy a listing is checked against: the current Etsy policy artefact.

``accord policy refresh etsy --from FILE`` writes each new set of values as an immutable revision
(``<policies>/etsy/marketplace-listing-limits/<n>.json``) and points ``current.json`` at the
latest. A publication reads ``current.json``, verifies its digest, checks the listing and records
``marketplace-listing-limits/etsy@<n>`` with the digest in its result. A policy change is a new
revision, never a contract change: the listing contracts say what Etsy accepts structurally;
the artefact says what this marketplace's policy allows today.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accord.canonical import digest_of

__all__ = ["Policy", "check", "current"]

POLICY = "marketplace-listing-limits"


@dataclass(frozen=True)
class Policy:
    version: str  # marketplace-listing-limits/etsy@3
    digest: str
    rules: Mapping[str, Any]


class PolicyUnavailable(Exception):
    pass


def current(policies: Path, marketplace: str = "etsy") -> Policy:
    """The current revision; :class:`PolicyUnavailable` when absent, unreadable or tampered."""
    path = policies / marketplace / POLICY / "current.json"
    try:
        doc = json.loads(path.read_text("utf-8"))
        rules, digest, version = doc["rules"], doc["digest"], doc["version"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PolicyUnavailable(f"{path}: no readable policy artefact ({exc})") from None
    if digest_of(rules) != digest:
        raise PolicyUnavailable(f"{path}: digest does not match the rules")
    return Policy(str(version), str(digest), rules)


def check(listing: Mapping[str, Any], rules: Mapping[str, Any]) -> list[str]:
    """Every way ``listing`` breaks the policy, each ``<path>: <why>``."""
    out: list[str] = []
    title = str(listing.get("title", ""))
    if len(title) > int(rules["titleMaxLength"]):
        out.append(f"listing.title: longer than {rules['titleMaxLength']} characters")
    if not re.fullmatch(str(rules["titlePattern"]), title):
        out.append(f"listing.title: {_refused(str(rules['titlePattern']), title)}")
    tags = list(listing.get("tags") or [])
    if len(tags) > int(rules["maxTags"]):
        out.append(f"listing.tags: {len(tags)} tags, more than {rules['maxTags']}")
    for i, tag in enumerate(tags):
        if len(str(tag)) > int(rules["tagMaxLength"]):
            out.append(f"listing.tags[{i}]: longer than {rules['tagMaxLength']} characters")
        if not re.fullmatch(str(rules["tagPattern"]), str(tag)):
            out.append(f"listing.tags[{i}]: {_refused(str(rules['tagPattern']), str(tag))}")
    if listing.get("taxonomyId") not in set(rules["taxonomyIds"]):
        out.append(f"listing.taxonomyId: {listing.get('taxonomyId')} is not an allowed taxonomy")
    price = float(listing.get("price", 0))
    if not float(rules["priceMin"]) <= price <= float(rules["priceMax"]):
        out.append(f"listing.price: {price} outside [{rules['priceMin']}, {rules['priceMax']}]")
    return out


def _refused(pattern: str, text: str) -> str:
    """Why ``text`` does not match: the characters that do not match alone, when there are any."""
    odd = sorted({c for c in text if not re.fullmatch(pattern, c)})
    if odd and len(odd) < len(set(text)):
        return "has characters the policy does not allow: " + " ".join(repr(c) for c in odd)
    return f"does not match the policy's pattern {pattern!r}"
