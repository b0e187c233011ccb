"""A directory as an object store: the embedded default (``file:///dir``).

It lives beside the port, not among the adapters, because the platform actions (which may not
import adapters) keep the stage-result cache in it when no other store is configured; the
adapters package re-exports it as ``accord.adapters.objects.fs``.

An object is the file ``root/<key>``; its metadata travels in the file's ``user.accord.meta``
extended attribute, set on the temporary file before it is moved into place, so data and metadata
land together. ``put`` writes a temporary file in the target's directory, fsyncs it, then
``os.replace`` (overwrite) or ``os.link`` (``if_absent``: the link fails if the key exists, which
is the atomic create-once). Keys that leave the root — after following symlinks — are refused.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from accord.objects.ports import (
    ObjectDenied,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectUnavailable,
    Operation,
    StoredObject,
    check_key,
)

__all__ = ["FileObjectStore"]

_XATTR = "user.accord.meta"


class FileObjectStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @property
    def url(self) -> str:
        return f"file://{self.root.resolve()}"

    def path(self, key: str) -> Path:
        """The file behind ``key``; :class:`ObjectDenied` when it resolves outside the root."""
        try:
            check_key(key)
        except ValueError as exc:
            raise ObjectDenied(str(exc), key=key[:200]) from None
        top = self.root.resolve()
        target = (top / key).resolve()
        if not target.is_relative_to(top) or target == top:
            raise ObjectDenied("object key resolves outside the store's root", key=key)
        return target

    def put(
        self,
        key: str,
        data: bytes,
        *,
        metadata: Mapping[str, str] | None = None,
        if_absent: bool = False,
    ) -> ObjectInfo:
        path = self.path(key)
        meta = dict(metadata or {})
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if self.path(key) != path:  # a parent was swapped for a link while creating it
                raise ObjectDenied("object path changed while writing", key=key)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                if meta:
                    os.setxattr(tmp, _XATTR, json.dumps(meta, sort_keys=True).encode())
                if if_absent:
                    try:
                        os.link(tmp, path)
                    except FileExistsError:
                        raise ObjectExists("an object already exists at the key", key=key) from None
                else:
                    os.replace(tmp, path)
                    tmp = ""
            finally:
                if tmp:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)
            _fsync_dir(path.parent)
        except PermissionError as exc:
            raise ObjectDenied(f"{type(exc).__name__}: {exc.strerror}", key=key) from None
        except (ObjectExists, ObjectDenied):
            raise
        except OSError as exc:
            raise ObjectUnavailable(f"{type(exc).__name__}: {exc.strerror}", key=key) from None
        return ObjectInfo(key, len(data), meta)

    def get(self, key: str) -> StoredObject:
        path = self.path(key)
        with _translated(key):
            data = path.read_bytes()
            return StoredObject(key, data, _read_meta(path))

    def head(self, key: str) -> ObjectInfo:
        path = self.path(key)
        with _translated(key):
            size = path.stat().st_size
            if not path.is_file():
                raise IsADirectoryError(errno.EISDIR, "is a directory")
            return ObjectInfo(key, size, _read_meta(path))

    def delete(self, key: str) -> None:
        path = self.path(key)
        with contextlib.suppress(ObjectNotFound), _translated(key):
            path.unlink()

    def list(self, prefix: str = "") -> list[str]:
        top = self.root.resolve()
        if not top.is_dir():
            return []
        found = []
        with _translated(prefix):
            for dirpath, _dirs, files in os.walk(top):
                for name in files:
                    if name.startswith(".") and name.endswith(".tmp"):
                        continue
                    key = (Path(dirpath) / name).relative_to(top).as_posix()
                    if key.startswith(prefix):
                        found.append(key)
        return sorted(found)

    def presign(self, key: str, operation: Operation, expires_s: int) -> str:
        """A ``file://`` URI: a local directory has no signatures, only the process's rights."""
        del operation, expires_s
        return self.path(key).as_uri()

    def close(self) -> None:
        return None


def _read_meta(path: Path) -> dict[str, str]:
    try:
        raw = os.getxattr(path, _XATTR)
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOTSUP):
            return {}
        raise
    value = json.loads(raw)
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _translated(key: str) -> Iterator[None]:
    try:
        yield
    except FileNotFoundError:
        raise ObjectNotFound("no object at the key", key=key) from None
    except PermissionError as exc:
        raise ObjectDenied(f"{type(exc).__name__}: {exc.strerror}", key=key) from None
    except OSError as exc:
        raise ObjectUnavailable(f"{type(exc).__name__}: {exc.strerror}", key=key) from None
