"""Create claims: one connector process at a time may create the listing of an external id.

Etsy's createListing takes no idempotency key and offers no conditional create, and the
reconciliation query cannot tell two processes that ask at the same instant about each other: both
find nothing and both would create. So connector processes that share an object store (a folder
or a bucket all of them reach) take a *create claim* before creating, with the store's
conditional write (``put(if_absent=True)``: ``If-None-Match: *`` on S3, an atomic link on a
folder), keyed by the listing's deterministic external id::

    etsy/create-claims/<shopId>/<externalId>/<generation>.json   {"owner", "externalId",
                                                                  "claimedAtMs", "expiresAtMs"}

- the highest generation present is the claim; it is *live* until its ``expiresAtMs``;
- taking a claim writes the next generation only if absent, so of any number of processes at once
  exactly one wins (the others get ``ObjectExists``), and a live claim is never superseded;
- an expired claim (its holder died or hung past the lease) is superseded by writing the next
  generation, with the same conditional write;
- the holder releases (deletes) its claim once the listing is created or found, or when the create
  was refused outright; after an *ambiguous* create it keeps the claim, so nobody else creates
  until the lease has run out and the ambiguous write has had time to show.

The lease must outlast one create call (every try, every ``Retry-After`` honoured): the connector
sets it from its timeouts. Leases compare wall clocks of different processes, so hosts sharing a
claim store need clocks in step to well within the lease.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import socket
import time
from dataclasses import dataclass, field

from accord.objects.ports import ObjectError, ObjectExists, ObjectNotFound, ObjectStore

__all__ = ["PREFIX", "Claim", "CreateClaims"]

PREFIX = "etsy/create-claims"
_GENERATION = re.compile(r"^([0-9]{1,12})\.json$")
_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class Claim:
    key: str
    generation: int
    external_id: str


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclass
class CreateClaims:
    """Create claims in ``store`` (see the module docstring); blocking calls."""

    store: ObjectStore
    lease_s: float = 60.0
    owner: str = field(default_factory=_owner)

    def _prefix(self, shop_id: int, external_id: str) -> str:
        return f"{PREFIX}/{shop_id}/{external_id}/"

    def _top(self, prefix: str) -> int:
        """The highest generation present under ``prefix`` (0: none)."""
        gens = [0]
        for key in self.store.list(prefix):
            m = _GENERATION.match(key.removeprefix(prefix))
            if m:
                gens.append(int(m.group(1)))
        return max(gens)

    def _live(self, key: str, now_ms: int) -> bool:
        """Whether the claim at ``key`` still holds: present, readable and not expired."""
        try:
            doc = json.loads(self.store.get(key).data)
        except ObjectNotFound:
            return False  # released between the listing and the read
        except ValueError:
            _LOG.warning("create claim %s is unreadable: treated as expired", key)
            return False
        expires = doc.get("expiresAtMs") if isinstance(doc, dict) else None
        return isinstance(expires, int) and expires > now_ms

    def take(self, shop_id: int, external_id: str) -> Claim | None:
        """The claim, if this process won it; ``None`` while another holds a live one.
        :class:`ObjectError` when the store cannot answer (then nobody may create)."""
        prefix = self._prefix(shop_id, external_id)
        now_ms = int(time.time() * 1000)
        top = self._top(prefix)
        if top and self._live(f"{prefix}{top:08d}.json", now_ms):
            return None
        key = f"{prefix}{top + 1:08d}.json"
        doc = {
            "owner": self.owner,
            "externalId": external_id,
            "claimedAtMs": now_ms,
            "expiresAtMs": now_ms + int(self.lease_s * 1000),
        }
        try:
            self.store.put(key, json.dumps(doc).encode(), if_absent=True)
        except ObjectExists:
            return None  # another process took this generation first
        return Claim(key, top + 1, external_id)

    def release(self, claim: Claim) -> None:
        """Delete ``claim`` and the generations below it (claims it superseded); a store that
        fails leaves them to expire (logged, not raised)."""
        prefix = claim.key.rsplit("/", 1)[0] + "/"
        try:
            self.store.delete(claim.key)
            for key in self.store.list(prefix):
                m = _GENERATION.match(key.removeprefix(prefix))
                if m and int(m.group(1)) < claim.generation:
                    self.store.delete(key)
        except ObjectError as exc:
            _LOG.warning("create claim %s not released (%s): it expires with its lease",
                         claim.key, exc)  # fmt: skip
