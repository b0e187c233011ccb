"""A filesystem object store, addressed the way payloads address storage.

A payload carries an opaque ``storageConnectionRef`` (never a path or a credential) and an
``objectKey``. The worker's :class:`StorageMap` — configuration, not payload — maps each ref name
to a root directory; the store for one run is that root's subdirectory for the run's tenant, which
comes from the envelope, never from the payload. Every key goes through
:func:`accord.worker.paths.resolve_object`, so no key or symlink reaches outside ``root/tenant``.

Writes are atomic (temporary file in the same directory, fsync, ``os.replace``), so a reader sees
the old object or the new one, never half of one. ``put_bytes`` returns the key, the size and the
``sha256:<hex>`` digest of exactly the bytes written.

A ref the map does not name as a directory may name a connection of its
:class:`~accord.adapters.objects.connections.ConnectionRegistry` (an S3 bucket and a per-tenant
prefix). The registry checks the run's tenant and issues a grant that ends within the stage's
deadline (the envelope's ``deadline``); the handler then gets a :class:`RemoteStorage`, which
reaches objects only through signed URLs for keys under that tenant's prefix. The URLs are bearer
capabilities: they stay inside this module — no result, failure, detail or log line carries one.
A ref of another tenant is refused with the terminal ``storage-ref-denied``.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from accord._files import atomic_write
from accord.adapters.objects.connections import ConnectionRegistry, Grant
from accord.errors import StageFailed
from accord.worker.paths import resolve_object, validate_object_key, validate_tenant

__all__ = ["DEFAULT_REF", "ObjectStorage", "RemoteStorage", "StorageMap", "model_in_store"]

DEFAULT_REF = "local"
_ENV_ROOT = "ACCORD_OBJECT_ROOT"


def _not_found(key: str) -> StageFailed:
    """A missing input object: terminal (a retry finds the same nothing)."""
    return StageFailed(
        f"no object {key!r} in this tenant's store",
        failure_code="object-not-found",
        retryable=False,
        details={"objectKey": key},
    )


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
            raise _not_found(key)
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


_KEEP_DOWNLOADS_S = 1_800  # twice the longest grant: no handler still reads an older download
_downloads: list[Path] = []


def _download_dir() -> Path:
    """A fresh directory for one grant's downloads, under this process's private folder (removed
    at exit); folders older than :data:`_KEEP_DOWNLOADS_S` are removed as new ones are made."""
    if not _downloads:
        top = Path(tempfile.mkdtemp(prefix="accord-objects-"))
        _downloads.append(top)
        atexit.register(shutil.rmtree, top, True)
    top = _downloads[0]
    cutoff = time.time() - _KEEP_DOWNLOADS_S
    for old in top.iterdir():
        with contextlib.suppress(OSError):
            if old.stat().st_mtime < cutoff:
                shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(dir=top))


class RemoteStorage:
    """One run's objects behind a :class:`Grant`: every read and write goes through a signed URL
    for one key under the tenant's prefix. A model read is downloaded once into a private
    temporary folder of this grant's, so parsers get a path as with files; the folder outlives
    this object (handlers may keep only the path) and is removed half an hour later or at exit."""

    def __init__(self, grant: Grant, *, timeout_s: float = 60.0) -> None:
        self._grant = grant
        self.tenant = grant.tenant
        self._timeout = timeout_s
        self._dir = _download_dir()

    def __repr__(self) -> str:
        return f"RemoteStorage(ref={self._grant.ref!r}, tenant={self.tenant!r})"

    def _fetch(self, key: str) -> Path | None:
        """The object downloaded to a local file, or ``None`` on an explicit not-found."""
        local = self._dir / validate_object_key(key)
        if local.is_file():
            return local
        request = urllib.request.Request(self._grant.url(key, "read"), method="GET")
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as reply:
                data = reply.read()
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code == 404:
                return None
            raise _store_failed(key, exc.code) from None
        except OSError as exc:
            raise _store_failed(key, 0, type(exc).__name__) from None
        local.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(local, data)
        return local

    def get_path(self, key: str) -> Path:
        found = self._fetch(key)
        if found is None:
            raise _not_found(key)
        return found

    def put_bytes(self, key: str, data: bytes) -> tuple[str, int, str]:
        validate_object_key(key)
        request = urllib.request.Request(self._grant.url(key, "write"), data=data, method="PUT")
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as reply:
                reply.read()
        except urllib.error.HTTPError as exc:
            exc.close()
            raise _store_failed(key, exc.code) from None
        except OSError as exc:
            raise _store_failed(key, 0, type(exc).__name__) from None
        return key, len(data), "sha256:" + hashlib.sha256(data).hexdigest()

    def find_model(self, model_id: str, suffixes: Iterable[str]) -> str:
        for suffix in suffixes:
            key = validate_object_key(f"models/{model_id}.{suffix}")
            if self._fetch(key) is not None:
                return key
        raise StageFailed(
            f"no model stored for modelId {model_id!r} under models/",
            failure_code="object-not-found",
            retryable=False,
            details={"modelId": model_id},
        )


def _store_failed(key: str, status: int, why: str = "") -> StageFailed:
    """A failure naming the key and the HTTP status, never the signed URL."""
    said = f"HTTP {status}" if status else why or "no answer"
    return StageFailed(
        f"the object store failed for {key!r} ({said})",
        failure_code="storage-unavailable",
        retryable=status == 0 or status >= 500,
        details={"objectKey": key, "status": status},
    )


@dataclass(frozen=True, slots=True)
class StorageMap:
    """Configured ``storageConnectionRef`` names → root directories, and connections of a
    registry (S3 buckets with per-tenant prefixes)."""

    roots: Mapping[str, Path] = field(default_factory=dict)
    registry: ConnectionRegistry | None = None

    @classmethod
    def local(cls, root: Path | str | None = None) -> StorageMap:
        """``local`` → ``root``, else ``$ACCORD_OBJECT_ROOT``, else ``.accord/objects``."""
        chosen = root if root is not None else os.environ.get(_ENV_ROOT, ".accord/objects")
        return cls({DEFAULT_REF: Path(chosen)})

    def open(
        self, ref: str | None, tenant: str, *, deadline_ms: int | None = None
    ) -> ObjectStorage | RemoteStorage:
        """The store for ``tenant`` behind ``ref`` (``local`` when the payload names none)."""
        name = ref or DEFAULT_REF
        root = self.roots.get(name)
        if root is None and self.registry is not None and name in self.registry:
            now_ms = int(time.time() * 1000)
            grant = self.registry.resolve(name, tenant, now_ms=now_ms, deadline_ms=deadline_ms)
            return RemoteStorage(grant)
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


def _deadline_ms(envelope: Mapping[str, Any]) -> int | None:
    text = envelope.get("deadline")
    if not isinstance(text, str):
        return None
    try:
        return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None


def model_in_store(
    payload: Mapping[str, Any], ctx: _RunContext, suffixes: Iterable[str]
) -> tuple[ObjectStorage | RemoteStorage, str, Path]:
    """The run's store (``ctx.services["storage"]``, else :meth:`StorageMap.local`) for the
    envelope's tenant, granted until the envelope's deadline, the model's key (``objectKey``,
    else ``models/<modelId>.<suffix>``) and its checked path."""
    storage_map = ctx.services.get("storage") or StorageMap.local()
    deadline = _deadline_ms(getattr(ctx, "envelope", {}) or {})
    ref = payload.get("storageConnectionRef")
    storage = storage_map.open(ref, ctx.tenant, deadline_ms=deadline)
    key = payload.get("objectKey") or storage.find_model(str(payload["modelId"]), suffixes)
    return storage, key, storage.get_path(key)
