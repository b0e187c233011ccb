"""Configuration shared by the platform actions, and how a model's input bytes are found.

Everything lives under one state directory (``.accord`` by default): the result cache in
``cache/``, the catalogue in ``catalogue.db``, the audit log in ``audit.db``. Models are located
by ``(tenant, modelId)`` through :attr:`PlatformConfig.locate`; the default looks in the object
store the workers read (``<objects>/<tenant>/models/<modelId>.<ext>`` or a folder of that name),
never outside it. The digest of a model's bytes (the cache key's input) is memoised by path, size
and modification time, so a repeat lookup does not re-read an unchanged file.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accord.actions.cache import ResultCache
from accord.contracts.catalog import Catalog
from accord.contracts.validate import Validator
from accord.objects.ports import ObjectStore

__all__ = ["CACHED_CAPABILITIES", "PlatformConfig", "RunLoader", "default_locator", "params_for"]

# the derived results the model-ingest workflow caches, in the order a lookup checks them
CACHED_CAPABILITIES = ("thumbnail.render@3", "semantic.analyse@4", "metadata.extract@2")
_IDENTITY = frozenset({"modelId", "storageConnectionRef", "objectKey"})

Locator = Callable[[str, str], Path | None]  # (tenant, model id) → the model file, or None
RunLoader = Callable[[str], Awaitable[Mapping[str, Any] | None]]  # run id → run record JSON


def default_locator(objects: Path) -> Locator:
    def locate(tenant: str, model_id: str) -> Path | None:
        base = objects / tenant / "models"
        if not base.is_dir():
            return None
        found = sorted(p for p in base.glob(f"{model_id}.*") if p.is_file())
        folder = base / model_id
        if not found and folder.is_dir():
            found = sorted(p for p in folder.iterdir() if p.is_file())
        if not found or not found[0].resolve().is_relative_to(objects.resolve()):
            return None
        return found[0]

    return locate


@dataclass
class PlatformConfig:
    state: Path = Path(".accord")
    catalog: Catalog | None = None
    locate: Locator | None = None
    load_run: RunLoader | None = None
    tenants: frozenset[str] | None = None  # None: every tenant may use the cache
    ttl_ms: int = 7 * 24 * 3_600_000
    cached: tuple[str, ...] = CACHED_CAPABILITIES
    now_ms: Callable[[], int] | None = None
    cache_store: ObjectStore | None = None  # None: the folder STATE/cache
    _cache: ResultCache | None = field(default=None, repr=False)
    _digests: dict[tuple[str, int, int], str] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def cache(self) -> ResultCache:
        if self._cache is None:
            root = None if self.cache_store is not None else self.state / "cache"
            self._cache = ResultCache(
                root, store=self.cache_store, catalog=self.catalog, now_ms=self.now_ms,
                tenants=self.tenants,
            )  # fmt: skip
        return self._cache

    @property
    def objects(self) -> Path:
        return self.state / "objects"

    def model_path(self, tenant: str, model_id: str) -> Path | None:
        locate = self.locate or default_locator(self.objects)
        return locate(tenant, model_id)

    def input_digest(self, path: Path) -> str:
        """``sha256:<hex>`` of the file's bytes (blocking; memoised by size and mtime)."""
        stat = path.stat()
        memo = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
        with self._lock:
            known = self._digests.get(memo)
        if known is not None:
            return known
        h = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        digest = f"sha256:{h.hexdigest()}"
        with self._lock:
            self._digests[memo] = digest
        return digest


def params_for(catalog: Catalog | None, capability: str, model_id: str) -> dict[str, Any]:
    """The request parameters a stage that binds only ``modelId`` runs with: the request
    contract's defaults, minus the identity fields."""
    cap = catalog.capability(capability) if catalog else None
    request = catalog.message(cap.request) if catalog and cap else None
    if request is None:
        return {}
    value = Validator.for_contract(request).validate({"modelId": model_id}).value or {}
    return {k: v for k, v in dict(value).items() if k not in _IDENTITY}
