"""Every Redis key the store touches is built here, and only from checked identifiers.

Key layout (``P`` is the store's prefix, ``S`` the shard number written with at least two digits
(``07``, ``42``, ``200``), ``R`` a run id)::

    P:{sS}:run:R      hash    v (version), state (JSON), ix (index values), up (ordering key)
    P:{sS}:hist:R     list    history entries (JSON), oldest first
    P:{sS}:obx        stream  outbox entries (fields e, r, t, p, c); consumer group ``accord``
    P:{sS}:obx:ids    hash    pending entry id -> stream id (uniqueness; ``outbox_done`` by id)
    P:{sS}:obx:lease  zset    stream id -> lease expiry (ms, store clock)
    P:{sS}:tmr        zset    timer id -> avail_at (due time, or lease expiry while leased)
    P:{sS}:tmr:data   hash    timer id -> JSON [run id, due ms, payload]
    P:{sS}:tmr:owner  hash    timer id -> owner of the current lease
    P:{sS}:idx        zset    lexicographic run index, all scores 0 (see :func:`index_member`)
    P:{sS}:lease      hash    the shard's lease: owner (engine id), epoch, expires (ms, store clock)
    P:engines         zset    engine id -> beat expiry (ms, store clock)
    P:plan:A/D        string  plan document (JSON) under digest ``A:D``; written once (SET NX)
    P:active:W        list    activations of workflow W: JSON [digest, activated_at_ms]
    P:{ann}           zset    worker id -> announcement expiry (ms)
    P:{ann}:caps      hash    worker id -> JSON list of capability refs (same slot as P:{ann})

A run's keys carry its *shard's* hash tag ``{sS}`` (shard = crc32(run id) mod shard count), so a
commit touches one Redis Cluster slot: the run record, history, the shard's outbox stream, timer
set and run index. The outbox and timers are spread over the shards, so no single key is a global
hotspot, and at most ``shards`` slots carry run traffic. The shard count is fixed for a keyspace
(recorded in ``P:meta`` and checked at startup), from 1 to ``_store_rules.MAX_SHARDS``; shards
below 100 keep the two-digit tags of the keyspaces made when 100 was the limit (``{s07}``), so
those still open unchanged, and the tags stay distinct (no number is written with a leading zero
beyond two digits).

The shard's lease lives under the same tag, so the commit script reads it in the same slot, in
the same atomic step as the run's version (the fence, see ``commit-9.lua``). Lease hashes are
never expired nor deleted: an epoch must never go back. The engines' beats are one sorted set,
touched only by ``beat-1.lua`` and ``leave``'s ``ZREM``.

Identifiers that become part of a key (prefix, run id, workflow, digest) must match a strict
grammar: ASCII letters, digits and ``. _ @ / + = -``, 1–200 characters, no ``..`` segment. So
``:``, ``{``, ``}``, ``*``, spaces and newlines can never reach a key, a run id cannot pick
another run's slot, and no key pattern can be injected. Entry, timer and worker ids are hash
fields or set members, never keys, and need no such rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from accord.adapters._store_rules import MAX_SHARDS
from accord.engine.ports import shard_of
from accord.errors import StoreError

__all__ = [
    "MAX_UPDATED_AT",
    "RunKeys",
    "ShardKeys",
    "StoreKeys",
    "check_identifier",
    "index_member",
    "index_prefix",
    "order_key",
    "shard_tag",
]

_IDENT = re.compile(r"[A-Za-z0-9._@/+=-]{1,200}\Z")
_DIGEST = re.compile(r"([a-z0-9]{1,16}):([A-Za-z0-9._+=-]{1,200})\Z")
MAX_UPDATED_AT = 10**15 - 1  # the index's ordering key is 15 digits (exact in Lua's doubles)


def check_identifier(value: str, what: str) -> str:
    """``value`` if it may become part of a key, else :class:`StoreError` naming ``what``."""
    if not isinstance(value, str) or not _IDENT.match(value):
        raise StoreError(
            f"{what} {value!r} cannot be stored in Redis: expected 1-200 characters from"
            " [A-Za-z0-9._@/+=-] (no ':', braces, '*', spaces or newlines)"
        )
    if ".." in value.split("/"):
        raise StoreError(f"{what} {value!r} cannot be stored in Redis: '..' segment")
    return value


@dataclass(frozen=True, slots=True)
class ShardKeys:
    """The keys of one shard, in the order the scripts take them."""

    tag: str  # e.g. ``P:{s03}``

    @property
    def outbox(self) -> str:
        return f"{self.tag}:obx"

    @property
    def outbox_ids(self) -> str:
        return f"{self.tag}:obx:ids"

    @property
    def outbox_lease(self) -> str:
        return f"{self.tag}:obx:lease"

    @property
    def timers(self) -> str:
        return f"{self.tag}:tmr"

    @property
    def timer_data(self) -> str:
        return f"{self.tag}:tmr:data"

    @property
    def timer_owner(self) -> str:
        return f"{self.tag}:tmr:owner"

    @property
    def index(self) -> str:
        return f"{self.tag}:idx"

    @property
    def lease(self) -> str:
        return f"{self.tag}:lease"


@dataclass(frozen=True, slots=True)
class RunKeys:
    run_id: str
    shard: ShardKeys

    @property
    def record(self) -> str:
        return f"{self.shard.tag}:run:{self.run_id}"

    @property
    def history(self) -> str:
        return f"{self.shard.tag}:hist:{self.run_id}"

    def prune_keys(self) -> list[str]:
        """KEYS of ``prune-3.lua``, in its header's order."""
        return [self.record, self.history, self.shard.index]

    def commit_keys(self) -> list[str]:
        """KEYS of ``commit-9.lua``, in its header's order."""
        s = self.shard
        return [
            self.record, self.history, s.outbox, s.outbox_ids,
            s.timers, s.timer_data, s.timer_owner, s.index, s.lease,
        ]  # fmt: skip


class StoreKeys:
    """Key builder for one keyspace (a prefix and a shard count)."""

    def __init__(self, prefix: str, shards: int) -> None:
        check_identifier(prefix, "key prefix")
        if not 1 <= shards <= MAX_SHARDS:
            raise StoreError(f"shards={shards}: expected 1..{MAX_SHARDS}")
        self.prefix = prefix
        self.shard_count = shards
        self.shards = [ShardKeys(shard_tag(prefix, n)) for n in range(shards)]

    def shard_of(self, run_id: str) -> int:
        return shard_of(run_id, self.shard_count)

    def run(self, run_id: str) -> RunKeys:
        check_identifier(run_id, "run id")
        return RunKeys(run_id, self.shards[self.shard_of(run_id)])

    @property
    def meta(self) -> str:
        return f"{self.prefix}:meta"

    def plan(self, digest: str) -> str:
        match = _DIGEST.match(digest) if isinstance(digest, str) else None
        if match is None or ".." in match.group(2):
            raise StoreError(
                f"plan digest {digest!r} cannot be stored in Redis: expected <algorithm>:<value>"
            )
        return f"{self.prefix}:plan:{match.group(1)}/{match.group(2)}"

    def active(self, workflow: str) -> str:
        return f"{self.prefix}:active:{check_identifier(workflow, 'workflow')}"

    @property
    def engines(self) -> str:
        return f"{self.prefix}:engines"

    @property
    def announcements(self) -> str:
        return f"{self.prefix}:{{ann}}"  # one hash tag with capabilities: announce-2.lua's slot

    @property
    def capabilities(self) -> str:
        return f"{self.prefix}:{{ann}}:caps"


def shard_tag(prefix: str, shard: int) -> str:
    """``P:{sNN}``: at least two digits, so shards below 100 keep their original names."""
    return f"{prefix}:{{s{shard:02d}}}"


def index_member(field: str, value: str, order: str, run_id: str) -> str:
    """One run-index entry: ``field=<byte length>:value|order|run id``. ``order`` is the inverted
    ``updated_at`` (15 digits), so an ascending lexicographic range lists the newest first and
    ties by run id. The length prefix keeps a value from spilling into the next field. The same
    format is built in ``commit-9.lua``."""
    return f"{field}={len(value.encode('utf-8'))}:{value}|{order}|{run_id}"


def index_prefix(field: str, value: str) -> str:
    return f"{field}={len(value.encode('utf-8'))}:{value}|"


def order_key(updated_at: int) -> str:
    if not 0 <= updated_at <= MAX_UPDATED_AT:
        raise StoreError(f"index updated_at={updated_at}: expected 0..{MAX_UPDATED_AT}")
    return f"{MAX_UPDATED_AT - updated_at:015d}"
