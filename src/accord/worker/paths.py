"""Object keys and tenants from payloads, turned into paths that cannot leave the storage root.

A payload names a model by an opaque ``objectKey``; the worker resolves it under the run's tenant.
Both arrive from outside, so both are checked twice: once as text (grammar, every encoding a
traversal can hide in) and once on the filesystem (the resolved path, after following symlinks,
must still lie under ``root/tenant``). The text check refuses rather than normalises: a key that
needs decoding or cleaning to be safe is not a key this store ever wrote.

Refused on the text: empty keys, absolute paths, drive letters, backslashes, NUL and control
characters, ``.``/``..``/empty segments, percent-encoding (``%2e%2e``, ``%2f``, overlong
``%c0%ae`` …), and Unicode that folds to any of these under NFKC (``．．``, ``／``).
Every refusal is a terminal :class:`~accord.errors.StageFailed` with code ``invalid-object-key``.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from accord.errors import StageFailed

__all__ = ["MAX_KEY_LENGTH", "resolve_object", "validate_object_key", "validate_tenant"]

MAX_KEY_LENGTH = 1024
_TENANT = re.compile(r"[A-Za-z0-9_-]{1,64}")  # the envelope's tenant grammar
_SEGMENT = re.compile(r"[A-Za-z0-9._~+=@-]+")  # what this store writes; nothing needs escaping
_DRIVE = re.compile(r"^[A-Za-z]:")


def _refuse(reason: str, value: str) -> StageFailed:
    shown = value.encode("unicode_escape").decode("ascii")[:200]
    return StageFailed(
        f"{reason}: {shown!r}",
        failure_code="invalid-object-key",
        retryable=False,
        details={"objectKey": shown},
    )


def validate_tenant(tenant: str) -> str:
    """The tenant names a directory, so it must match ``[A-Za-z0-9_-]{1,64}`` exactly."""
    if not isinstance(tenant, str) or _TENANT.fullmatch(tenant) is None:
        raise _refuse("tenant must match [A-Za-z0-9_-]{1,64}", str(tenant))
    return tenant


def validate_object_key(key: str) -> str:
    """Return ``key`` unchanged if it is a plain relative key; raise ``invalid-object-key``."""
    if not isinstance(key, str) or not key:
        raise _refuse("object key is empty or not a string", str(key))
    if len(key) > MAX_KEY_LENGTH:
        raise _refuse(f"object key is longer than {MAX_KEY_LENGTH} characters", key)
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in key):
        raise _refuse("object key contains a NUL or control character", key)
    if "\\" in key:
        raise _refuse("object key contains a backslash", key)
    if "%" in key:
        raise _refuse("object key contains percent-encoding", key)
    folded = unicodedata.normalize("NFKC", key)
    if folded != key:
        raise _refuse("object key changes under Unicode normalisation (NFKC)", key)
    if key.startswith("/") or _DRIVE.match(key):
        raise _refuse("object key is an absolute path", key)
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise _refuse("object key has an empty, '.' or '..' segment", key)
        if _SEGMENT.fullmatch(segment) is None:
            raise _refuse("object key segment has characters outside [A-Za-z0-9._~+=@-]", key)
    return key


def resolve_object(root: Path, tenant: str, object_key: str) -> Path:
    """The path of ``object_key`` under ``root/tenant``, refusing anything that leaves it.

    The file need not exist (writers resolve before creating); symlinks on the way are followed
    and the result must stay under the tenant's directory, itself resolved the same way.
    """
    validate_tenant(tenant)
    validate_object_key(object_key)
    top = Path(root).resolve()
    base = (top / tenant).resolve()
    if not base.is_relative_to(top):
        raise _refuse("the tenant's directory is a link out of the storage root", tenant)
    target = (base / object_key).resolve()
    if target == base or not target.is_relative_to(base):
        raise _refuse("object key resolves outside the tenant's storage root", object_key)
    return target
