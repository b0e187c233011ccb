"""The object-store port: bytes under keys, with metadata, conditional writes and signed URLs.

Every adapter (``file://`` directory, ``s3://`` bucket) passes one contract suite
(``tests/contract/test_object_store.py``). What a caller can rely on:

- ``put`` is atomic: a reader sees the old object or the new one, never part of one. With
  ``if_absent=True`` it writes only when no object exists at the key, else raises
  :class:`ObjectExists` (S3 ``If-None-Match: *`` → 412): concurrent writers of one key write once.
- ``get``/``head`` of a key that does not exist raise :class:`ObjectNotFound` — only on an explicit
  not-found from the store. Refused access is :class:`ObjectDenied`, a store that cannot be reached
  or answers with a server error is :class:`ObjectUnavailable`. Nothing is guessed.
- Metadata is a flat ``str → str`` map stored with the object and returned as written (names are
  lower-case ASCII; S3 carries them as ``x-amz-meta-*``).
- ``presign`` returns a URL that grants one operation on one key until it expires. Such a URL is
  a bearer capability: treat it as sensitive (never in a payload, history entry or log line).

Keys are relative (``a/b/c.json``): no leading ``/``, no empty, ``.`` or ``..`` segment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from accord.errors import StoreError

__all__ = [
    "ObjectDenied",
    "ObjectError",
    "ObjectExists",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectUnavailable",
    "Operation",
    "StoredObject",
    "check_key",
]

Operation = Literal["get", "put"]


class ObjectError(StoreError):
    """An object store refused or failed an operation (the adapter's error, translated)."""

    code = "object-error"

    def __init__(self, message: str, *, key: str = "", retryable: bool = False) -> None:
        super().__init__(message, retryable=retryable)
        self.key = key


class ObjectNotFound(ObjectError):
    """The store said explicitly that no object exists at the key."""

    code = "object-not-found"


class ObjectDenied(ObjectError):
    """The store refused the credentials or the operation (HTTP 403, or a permission error)."""

    code = "object-denied"


class ObjectUnavailable(ObjectError):
    """The store could not be reached or failed (connection refused, timeout, 5xx, I/O error)."""

    code = "object-unavailable"

    def __init__(self, message: str, *, key: str = "", retryable: bool = True) -> None:
        super().__init__(message, key=key, retryable=retryable)


class ObjectExists(ObjectError):
    """A conditional write found an object already at the key (HTTP 412)."""

    code = "object-exists"


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StoredObject:
    key: str
    data: bytes = field(repr=False)
    metadata: Mapping[str, str] = field(default_factory=dict)


def check_key(key: str) -> str:
    """``key`` if it is a plain relative key, else :class:`ValueError` naming why."""
    if not isinstance(key, str) or not key:
        raise ValueError("object key is empty")
    if key.startswith("/") or "\\" in key or "\x00" in key:
        raise ValueError(f"object key {key[:200]!r} is absolute or holds a backslash or NUL")
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise ValueError(f"object key {key[:200]!r} has an empty, '.' or '..' segment")
    return key


class ObjectStore(Protocol):
    """Bytes under keys (blocking calls: run them off the event loop with ``to_thread``)."""

    @property
    def url(self) -> str:
        """Where the store is, without any credential (safe to show)."""
        ...

    def put(
        self,
        key: str,
        data: bytes,
        *,
        metadata: Mapping[str, str] | None = None,
        if_absent: bool = False,
    ) -> ObjectInfo:
        """Write ``data`` at ``key`` atomically (``if_absent``: only if nothing is there)."""
        ...

    def get(self, key: str) -> StoredObject:
        """The object's bytes and metadata."""
        ...

    def head(self, key: str) -> ObjectInfo:
        """The object's size and metadata without its bytes."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object; removing a missing key is not an error."""
        ...

    def list(self, prefix: str = "") -> list[str]:
        """Every key starting with ``prefix``, sorted."""
        ...

    def presign(self, key: str, operation: Operation, expires_s: int) -> str:
        """A URL granting ``operation`` on ``key`` for ``expires_s`` seconds (sensitive)."""
        ...

    def close(self) -> None: ...
