"""The platform actions the engine runs itself: the stage result cache, the catalogue, the audit.

:func:`register_platform_actions` binds ``cache.lookup@1``, ``catalogue.publish@2`` and
``audit.run-terminal@1`` into an engine's :class:`~accord.engine.runtime.actions.ActionRegistry` and
returns a :class:`Platform` holding what they share — the cache, the catalogue table, the audit
log and the :class:`~accord.actions.lookup.CacheWriter` to add to the engine's observers so that
completed stage results are cached::

    platform = register_platform_actions(engine.registry, PlatformConfig(state, catalog=...))
    engine.observers.append(platform.writer)
    platform.writer.watch(plan)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accord.actions.audit import AuditLog, audit_run_terminal
from accord.actions.cache import CacheRead, ResultCache, cache_key
from accord.actions.catalogue import Catalogue, catalogue_publish
from accord.actions.config import CACHED_CAPABILITIES, PlatformConfig, params_for
from accord.actions.lookup import CacheWriter, cache_lookup, keys_for
from accord.engine.runtime.actions import ActionContext, ActionRegistry

__all__ = [
    "CACHED_CAPABILITIES",
    "AuditLog",
    "CacheRead",
    "CacheWriter",
    "Catalogue",
    "Platform",
    "PlatformConfig",
    "ResultCache",
    "cache_key",
    "keys_for",
    "params_for",
    "register_platform_actions",
]


@dataclass
class Platform:
    config: PlatformConfig
    catalogue: Catalogue
    audit: AuditLog
    writer: CacheWriter

    @property
    def cache(self) -> ResultCache:
        return self.config.cache

    def close(self) -> None:
        self.catalogue.close()
        self.audit.close()


def register_platform_actions(registry: ActionRegistry, config: PlatformConfig) -> Platform:
    platform = Platform(
        config,
        Catalogue(config.state / "catalogue.db"),
        AuditLog(config.state / "audit.db"),
        CacheWriter(config),
    )

    async def lookup(payload: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
        return await cache_lookup(config, payload, ctx)

    async def publish(payload: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
        return await catalogue_publish(config, platform.catalogue, payload, ctx)

    async def audit(payload: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
        return await audit_run_terminal(config, platform.audit, payload, ctx)

    registry.register("cache.lookup@1", lookup)
    registry.register("catalogue.publish@2", publish)
    registry.register("audit.run-terminal@1", audit)
    return platform
