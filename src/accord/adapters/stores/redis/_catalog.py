"""Plans, activations and worker announcements: the store's small, rarely written records.

- A plan is immutable: ``SET NX`` writes it once; a second put compares and refuses a different
  document (:class:`~accord.errors.ImmutableArtefactError`).
- Activations of a workflow are a list, oldest first; the last entry is the active plan.
- Announcements: a sorted set of worker ids by expiry plus a hash of their capability lists,
  replaced together by ``announce-2.lua``; live ones are those expiring after ``now``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from accord.adapters import _store_rules as rules
from accord.adapters._redis_group import GroupCalls
from accord.adapters.stores.redis._scripts import Scripts
from accord.adapters.stores.redis._server import redis_errors
from accord.adapters.stores.redis.keys import StoreKeys
from accord.engine.ports import Clock
from accord.errors import ImmutableArtefactError, StoreError

__all__ = ["Catalog"]

_ANNOUNCE_PRUNE_MS = 3_600_000


class Catalog:
    """Plan and announcement methods of :class:`~accord.adapters.stores.redis.RedisStore`."""

    client: Any
    keys: StoreKeys
    clock: Clock
    scripts: Scripts
    group: GroupCalls

    async def ready(self) -> None:
        raise NotImplementedError

    async def put_plan(self, digest: str, document: dict[str, Any]) -> None:
        key, text = self.keys.plan(digest), rules.dump(document, "plan")
        await self.ready()
        async with redis_errors("put_plan"):
            if await self.group.submit_command("SET", key, text, "NX", write=True):
                return
            known = await self.group.submit_command("GET", key)
        if known != text:
            raise ImmutableArtefactError(rules.plan_changed(digest))

    async def get_plan(self, digest: str) -> dict[str, Any] | None:
        await self.ready()
        try:
            key = self.keys.plan(digest)
        except StoreError:
            return None
        async with redis_errors("get_plan"):
            text = await self.group.submit_command("GET", key)
        return None if text is None else dict(json.loads(text))

    async def set_active(self, workflow: str, digest: str) -> None:
        key, plan = self.keys.active(workflow), self.keys.plan(digest)
        await self.ready()
        async with redis_errors("set_active"):
            # plans are never deleted, so "exists" cannot turn false before the push
            if not await self.group.submit_command("EXISTS", plan):
                raise StoreError(rules.unknown_plan(workflow, digest))
            row = json.dumps([digest, self.clock.now_ms()])
            await self.group.submit_command("RPUSH", key, row, write=True)

    async def get_active(self, workflow: str) -> str | None:
        versions = await self.plan_versions(workflow, latest_only=True)
        return versions[-1]["digest"] if versions else None

    async def plan_versions(
        self, workflow: str, *, latest_only: bool = False
    ) -> list[dict[str, Any]]:
        """Every activation of ``workflow``, oldest first (see ``SqliteStore.plan_versions``)."""
        await self.ready()
        try:
            key = self.keys.active(workflow)
        except StoreError:
            return []
        async with redis_errors("plan_versions"):
            rows = await self.group.submit_command("LRANGE", key, -1 if latest_only else 0, -1)
        return rules.activation_rows([tuple(json.loads(r)) for r in rows])

    async def announce(
        self, worker_id: str, capabilities: Sequence[str], expires_at_ms: int
    ) -> None:
        caps = json.dumps(list(dict.fromkeys(capabilities)))
        await self.ready()
        async with redis_errors("announce"):
            keys = [self.keys.announcements, self.keys.capabilities]
            args: list[str | int] = [
                worker_id,
                expires_at_ms,
                caps,
                expires_at_ms - _ANNOUNCE_PRUNE_MS,
            ]
            await self.group.submit(self.scripts.announce, keys, args)

    async def live_capabilities(self, now_ms: int) -> dict[str, list[str]]:
        await self.ready()
        async with redis_errors("live_capabilities"):
            workers = await self.client.zrangebyscore(self.keys.announcements, f"({now_ms}", "+inf")
            caps = await self.client.hmget(self.keys.capabilities, workers) if workers else []
        live: dict[str, list[str]] = {}
        for worker_id, text in sorted(zip(workers, caps, strict=True)):
            for capability in json.loads(text) if text else []:
                live.setdefault(capability, []).append(worker_id)
        return dict(sorted(live.items()))
