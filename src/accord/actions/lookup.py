"""``cache.lookup@1`` and the writer that fills the cache from completed stages.

The lookup computes, for each cached capability (:data:`CACHED_CAPABILITIES`), the key over the
model's bytes, the capability version, its parameters and the tenant, and reads every entry. The
run takes the cache-hit branch only if **all** of them hit; otherwise the reported outcome is the
most serious one found (denied › unavailable › corrupt › invalid › expired › miss), so an operator
sees why the workers ran. ``cacheKey`` is the digest over the per-capability keys.

:class:`CacheWriter` is an engine observer: after a commit in which a cached worker stage holds a
completed result, it stores that result under the stage's key (once per run and stage, off the
loop). Only results the engine accepted — already checked against their contracts — are cached.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from accord.actions.cache import CacheRead, cache_key, iso
from accord.actions.config import PlatformConfig, params_for
from accord.canonical import digest_of
from accord.engine.runtime.actions import ActionContext
from accord.engine.runtime.orchestrator import Delivered
from accord.workflow.plan import Plan, TaskStage

__all__ = ["CacheWriter", "cache_lookup", "keys_for"]

log = logging.getLogger("accord.actions.cache")
_SEVERITY = ("denied", "unavailable", "corrupt", "invalid-against-contract", "expired", "miss")


def keys_for(config: PlatformConfig, tenant: str, model_id: str, digest: str) -> dict[str, str]:
    """``capability → cache key`` for one model's bytes under ``tenant``."""
    return {
        cap: cache_key(digest, cap, params_for(config.catalog, cap, model_id), tenant)
        for cap in config.cached
    }


def _result_ref(config: PlatformConfig, capability: str) -> str:
    cap = config.catalog.capability(capability) if config.catalog else None
    return str(cap.result) if cap else capability


async def cache_lookup(
    config: PlatformConfig, payload: dict[str, Any], ctx: ActionContext
) -> dict[str, Any]:
    model_id, tenant = str(payload["modelId"]), ctx.tenant
    cache = config.cache
    if cache.tenants is not None and tenant not in cache.tenants:
        return {"hit": False, "outcome": "denied", "expiresAt": None, "results": []}
    given = payload.get("inputDigest")
    if isinstance(given, str):
        digest = given
    else:
        path = await asyncio.to_thread(config.model_path, tenant, model_id)
        if path is None:  # nothing to key on: not a cache verdict, let the workers classify it
            return {"hit": False, "outcome": "unavailable", "expiresAt": None, "results": []}
        digest = await asyncio.to_thread(config.input_digest, path)
    keys = keys_for(config, tenant, model_id, digest)
    reads = await asyncio.gather(*(cache.fetch(k, tenant) for k in keys.values()))
    return summarise(digest_of(sorted(keys.values())), list(reads))


def summarise(bundle_key: str, reads: list[CacheRead]) -> dict[str, Any]:
    """The ``cache-lookup-result@1`` for a set of per-capability reads."""
    misses = [r.outcome for r in reads if not r.hit]
    if misses:
        outcome = next(o for o in _SEVERITY if o in misses)
        return {"hit": False, "outcome": outcome, "cacheKey": bundle_key, "expiresAt": None,
                "results": []}  # fmt: skip
    expiry = min((r.expires_at_ms for r in reads if r.expires_at_ms is not None), default=None)
    results = [
        {"contract": r.contract, "objectKey": r.object_key, "digest": r.digest} for r in reads
    ]
    expires = iso(expiry) if expiry is not None else None
    return {"hit": True, "outcome": "hit", "cacheKey": bundle_key, "expiresAt": expires,
            "results": results}  # fmt: skip


class CacheWriter:
    """Engine observer that caches completed results of cached worker stages."""

    def __init__(self, config: PlatformConfig) -> None:
        self.config = config
        self._stages: dict[str, dict[str, str]] = {}  # plan digest → stage → capability
        self._done: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.written = 0

    def watch(self, plan: Plan) -> None:
        cached = set(self.config.cached)
        self._stages[plan.digest] = {
            s.name: s.capability.ref
            for s in plan.stages
            if isinstance(s, TaskStage) and s.capability.ref in cached
        }

    def __call__(self, delivered: Delivered) -> None:
        run = delivered.run
        if run is None:
            return
        stages = self._stages.get(run.plan_digest, {})
        if run.terminal:  # every completed stage was seen on an earlier commit: forget the run
            self._done.difference_update((run.run_id, stage) for stage in stages)
            return
        for stage, capability in stages.items():
            st = run.stages.get(stage)
            if st is None or st.status != "completed" or st.result is None:
                continue
            if (run.run_id, stage) in self._done:
                continue
            self._done.add((run.run_id, stage))
            model_id = str(run.context.get("modelId", ""))
            args = (run.tenant, model_id, capability, dict(st.result))
            task = asyncio.get_running_loop().create_task(self._write(*args))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _write(self, tenant: str, model_id: str, capability: str, result: Any) -> None:
        try:
            await asyncio.to_thread(self.write, tenant, model_id, capability, result)
        except Exception:  # a cache that cannot be written costs a re-run, never the run itself
            log.exception("caching %s for %s failed", capability, model_id)

    def write(self, tenant: str, model_id: str, capability: str, result: dict[str, Any]) -> bool:
        config = self.config
        path = config.model_path(tenant, model_id)
        if path is None:
            return False
        keys = keys_for(config, tenant, model_id, config.input_digest(path))
        ref = _result_ref(config, capability)
        config.cache.put(keys[capability], tenant, ref, result, config.ttl_ms)
        self.written += 1
        return True

    async def drain(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
