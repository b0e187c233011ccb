"""Claiming across shards: one concurrent round of per-shard claim scripts per round trip.

A claim of ``limit`` items is split over the shards still worth asking (quotas summing to the
remaining limit, starting from a rotating shard so claimants spread out). Each shard's script is
atomic on its own; the calls of one round run concurrently. A shard that returns less than its
quota is drained and dropped; the rest are asked again for what is still missing. Every round
either claims something or drops a shard, so a claim takes at most ``shards`` rounds and an
empty poll with ``limit >= shards`` takes one. If a call fails half-way through a round, items
already leased by the other calls come back when their lease lapses (delivery is at-least-once).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["claim_across"]

T = TypeVar("T")


async def claim_across(
    order: list[int], limit: int, claim: Callable[[int, int], Awaitable[list[T]]]
) -> list[tuple[int, T]]:
    """``(shard, item)`` pairs, at most ``limit``; ``claim(shard, quota)`` leases up to
    ``quota`` items of one shard."""
    remaining, live, got = limit, list(order), []
    while remaining > 0 and live:
        quotas = _split(remaining, live)
        replies = await asyncio.gather(*(claim(shard, quota) for shard, quota in quotas))
        for (shard, quota), items in zip(quotas, replies, strict=True):
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
