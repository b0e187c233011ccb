"""A filesystem object store, addressed the way payloads address storage.

A payload carries an opaque ``storageConnectionRef`` (never a path or a credential) and an
``objectKey``. The worker's :class:`StorageMap` — configuration, not payload — maps each ref name
to a root directory; the store for one run is that root's subdirectory for the run's tenant, which
comes from the envelope, never from the payload. Every key goes through
:func:`accord.worker.paths.resolve_object`, so no key or symlink reaches outside ``root/tenant``.

Writes are atomic (temporary file in the same directory, fsync, ``os.replace``), so a reader sees
the old object or the new one, never half of one. ``put_bytes`` returns the key, the size and the
``sha256:<hex>`` digest of exactly the bytes written.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from accord._files import atomic_write
from accord.errors import StageFailed
from accord.worker.paths import resolve_object, validate_object_key, validate_tenant

__all__ = ["DEFAULT_REF", "ObjectStorage", "StorageMap", "model_in_store"]

DEFAULT_REF = "local"
_ENV_ROOT = "ACCORD_OBJECT_ROOT"


@dataclass(frozen=True, slots=True)
class ObjectStorage:
    """One tenant's objects under ``root/tenant``."""

    root: Path
    tenant: str

    def __post_init__(self) -> None:
        validate_tenant(self.tenant)

    def get_path(self, key: str) -> Path:
        """The path of an existing object; ``storage-unavailable`` style misses are terminal."""
        path = resolve_object(self.root, self.tenant, key)
        if not path.is_file():
            raise StageFailed(
                f"no object {key!r} in this tenant's store",
                failure_code="object-not-found",
                retryable=False,
                details={"objectKey": key},
            )
        return path

    def put_bytes(self, key: str, data: bytes) -> tuple[str, int, str]:
        """Write ``data`` at ``key`` atomically; return ``(key, size, "sha256:<hex>")``."""
        path = resolve_object(self.root, self.tenant, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # the parent may have been swapped for a link since resolving: resolve again after mkdir
        if resolve_object(self.root, self.tenant, key) != path:
            raise StageFailed(
                "object path changed while writing", failure_code="invalid-object-key"
            )
        atomic_write(path, data)
        return key, len(data), "sha256:" + hashlib.sha256(data).hexdigest()

    def find_model(self, model_id: str, suffixes: Iterable[str]) -> str:
        """The key ``models/<modelId>.<suffix>`` that exists, trying ``suffixes`` in order.

        Requests that carry only a ``modelId`` (the workflow binds nothing else) find the model
        by this convention; ingestion stores models there.
        """
        for suffix in suffixes:
            key = validate_object_key(f"models/{model_id}.{suffix}")
            if resolve_object(self.root, self.tenant, key).is_file():
                return key
        raise StageFailed(
            f"no model stored for modelId {model_id!r} under models/",
            failure_code="object-not-found",
            retryable=False,
            details={"modelId": model_id},
        )


@dataclass(frozen=True, slots=True)
class StorageMap:
    """Configured ``storageConnectionRef`` names → root directories."""

    roots: Mapping[str, Path] = field(default_factory=dict)

    @classmethod
    def local(cls, root: Path | str | None = None) -> StorageMap:
        """``local`` → ``root``, else ``$ACCORD_OBJECT_ROOT``, else ``.accord/objects``."""
        chosen = root if root is not None else os.environ.get(_ENV_ROOT, ".accord/objects")
        return cls({DEFAULT_REF: Path(chosen)})

    def open(self, ref: str | None, tenant: str) -> ObjectStorage:
        """The store for ``tenant`` behind ``ref`` (``local`` when the payload names none)."""
        name = ref or DEFAULT_REF
        root = self.roots.get(name)
        if root is None:
            raise StageFailed(
                "storageConnectionRef names no configured store",
                failure_code="storage-unavailable",
                retryable=False,
            )
        return ObjectStorage(Path(root), tenant)


class _RunContext(Protocol):
    tenant: str
    services: Mapping[str, Any]


def model_in_store(
    payload: Mapping[str, Any], ctx: _RunContext, suffixes: Iterable[str]
) -> tuple[ObjectStorage, str, Path]:
    """The run's store (``ctx.services["storage"]``, else :meth:`StorageMap.local`), the model's
    key (``objectKey``, else ``models/<modelId>.<suffix>``) and its checked path."""
    storage_map = ctx.services.get("storage") or StorageMap.local()
    storage = storage_map.open(payload.get("storageConnectionRef"), ctx.tenant)
    key = payload.get("objectKey") or storage.find_model(str(payload["modelId"]), suffixes)
    return storage, key, storage.get_path(key)
