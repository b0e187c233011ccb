"""Operations that span shards: ``list_runs``, claims and shard leases.

**list_runs.** Each shard's ``idx`` sorted set holds, for every run, one entry ``*|order|run``
and one entry ``field=<len>:value|order|run`` per index value (``order`` is 15 digits of inverted
``updated_at``). A filter is therefore a lexicographic range whose entries already come newest
first and then by run id, exactly the order the SQL stores use. The first filter (by name) picks
the range; further filters are checked against the run's stored index values, page by page.
Shards are read concurrently and merged; the run records are read in one pipeline at the end.

**Claims.** A claim of ``limit`` items is split over the shards still worth asking (quotas
summing to the remaining limit, starting from a rotating shard so claimants spread out). Each
shard's script is atomic on its own; the calls of one round go out together, in one pipeline
(``_redis_group.py``). A shard that returns less than its quota is drained and dropped; the rest are
asked again for what is still missing. Every round either claims something or drops a shard, so
a claim takes at most ``shards`` rounds and an empty poll with ``limit >= shards`` takes one. If a
call fails, items already leased by the other calls come back when their lease lapses
(at-least-once). A claim given ``shards`` asks only those shards (``[]``: none).

**Leases.** ``hold_shards``, ``release_shards`` and ``shard_leases`` are one script (or read) per
shard, each touching only that shard's slot (its lease hash), made together by
:func:`each_shard` so they travel in the group's pipelines (``MAX_GROUP`` calls per round trip).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from accord.adapters.stores.redis.keys import StoreKeys, index_prefix
from accord.engine.ports import StoredRun
from accord.errors import StoreError

__all__ = ["claim_across", "each_shard", "list_runs"]

T = TypeVar("T")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_PAGE = 200


async def list_runs(
    client: Any, keys: StoreKeys, limit: int, filters: dict[str, str]
) -> list[StoredRun]:
    for name in filters:
        if not _NAME.match(name):
            raise StoreError(
                f"list_runs filter {name!r} is not an identifier ([A-Za-z_][A-Za-z0-9_]*)"
            )
    if limit <= 0:
        return []
    items = sorted(filters.items())
    prefix = index_prefix(*items[0]) if items else "*|"
    rest = dict(items[1:])
    found = await asyncio.gather(
        *(_shard_hits(client, keys, n, prefix, rest, limit=limit) for n in range(keys.shard_count))
    )
    best = sorted(hit for hits in found for hit in hits)[:limit]
    pipe = client.pipeline(transaction=False)
    for _, run_id in best:
        pipe.hmget(keys.run(run_id).record, "v", "state")
    rows = await pipe.execute() if best else []
    return [
        StoredRun(run_id, int(v), json.loads(state))
        for (_, run_id), (v, state) in zip(best, rows, strict=True)
        if v is not None
    ]


async def _shard_hits(
    client: Any, keys: StoreKeys, shard: int, prefix: str, rest: dict[str, str], *, limit: int
) -> list[tuple[str, str]]:
    """Up to ``limit`` ``(order, run id)`` of one shard matching every filter, best first."""
    index = keys.shards[shard].index
    low, high = "[" + prefix, "(" + prefix[:-1] + "}"  # "}" sorts right after "|"
    hits: list[tuple[str, str]] = []
    offset = 0
    while len(hits) < limit:
        page = limit - len(hits) if not rest else _PAGE
        members = await client.zrange(index, low, high, bylex=True, offset=offset, num=page)
        offset += len(members)
        tail = [m[len(prefix) :] for m in members]
        candidates = [(t[:15], t[16:]) for t in tail]
        if rest and candidates:
            candidates = await _keep_matching(client, keys, candidates, rest)
        hits += candidates
        if len(members) < page:
            break
    return hits[:limit]


async def _keep_matching(
    client: Any, keys: StoreKeys, candidates: list[tuple[str, str]], rest: dict[str, str]
) -> list[tuple[str, str]]:
    pipe = client.pipeline(transaction=False)
    for _, run_id in candidates:
        pipe.hget(keys.run(run_id).record, "ix")
    stored = await pipe.execute()
    kept = []
    for hit, text in zip(candidates, stored, strict=True):
        values = json.loads(text) if text else {}
        if all(values.get(k) == v for k, v in rest.items()):
            kept.append(hit)
    return kept


async def claim_across(
    order: list[int],
    limit: int,
    claim: Callable[[int, int], Awaitable[Any]],
    decode: Callable[[Any], list[T]],
) -> list[tuple[int, T]]:
    """``(shard, item)`` pairs, at most ``limit``. ``claim(shard, quota)`` starts the lease of up
    to ``quota`` items of one shard and returns the future of its reply (the calls of a round are
    made together, so they travel in one pipeline); ``decode`` turns a reply into the items."""
    remaining, live, got = limit, list(order), []
    while remaining > 0 and live:
        quotas = _split(remaining, live)
        replies = await asyncio.gather(*[claim(shard, quota) for shard, quota in quotas])
        for (shard, quota), reply in zip(quotas, replies, strict=True):
            items = decode(reply)
            got += [(shard, item) for item in items]
            remaining -= len(items)
            if len(items) < quota:
                live.remove(shard)
    return got


def _split(remaining: int, live: list[int]) -> list[tuple[int, int]]:
    if remaining < len(live):
        return [(shard, 1) for shard in live[:remaining]]
    base, extra = divmod(remaining, len(live))
    return [(shard, base + (1 if n < extra else 0)) for n, shard in enumerate(live)]


async def each_shard(
    shards: Sequence[int], call: Callable[[int], Awaitable[T]]
) -> list[T | BaseException]:
    """``call(shard)`` for every shard, all made before the first is awaited (so they share the
    group's pipelines); each reply or error, in ``shards``' order. Errors are returned, not
    raised, so the caller sees every outcome and decides (a refused lease wrote nothing)."""
    return await asyncio.gather(*(call(shard) for shard in shards), return_exceptions=True)
