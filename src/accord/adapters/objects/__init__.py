"""Object-store adapters behind :class:`accord.objects.ports.ObjectStore`, opened from URLs.

- ``file:///abs/dir`` (or a plain path): :class:`~.fs.FileObjectStore`, the embedded default.
- ``s3://bucket[/prefix]?endpoint=http://host:port[&region=…]``: :class:`~.s3.S3ObjectStore`
  (SigV4, path-style addressing; credentials from the arguments or boto3's usual chain, never
  from the URL).

:mod:`.connections` is the per-tenant connection registry that ``storageConnectionRef`` names.
"""

from __future__ import annotations

from pathlib import Path

from accord.adapters.objects.fs import FileObjectStore
from accord.objects.ports import ObjectStore

__all__ = ["FileObjectStore", "open_object_store", "redact_url"]


def open_object_store(
    url: str, *, access_key: str | None = None, secret_key: str | None = None
) -> ObjectStore:
    """The store ``url`` names; :class:`ValueError` naming the problem for a URL it cannot open."""
    if url.startswith("s3://"):
        try:
            from accord.adapters.objects.s3 import S3ObjectStore  # noqa: PLC0415 - boto3 is heavy
        except ImportError:
            raise ValueError("s3:// object stores need boto3: pip install 'accord[s3]'") from None
        return S3ObjectStore.from_url(url, access_key=access_key, secret_key=secret_key)
    if url.startswith("file://"):
        return FileObjectStore(Path(url.removeprefix("file://")))
    if "://" in url:
        raise ValueError(f"object store URL {redact_url(url)!r}: scheme must be s3:// or file://")
    return FileObjectStore(Path(url))


def redact_url(url: str) -> str:
    """``url`` without a query string or user info: what may be shown or logged."""
    head, _, _ = url.partition("?")
    scheme, sep, rest = head.partition("://")
    if sep and "@" in rest.split("/", 1)[0]:
        rest = rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"
