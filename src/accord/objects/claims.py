"""Claim checks: a payload or result above the envelope's threshold travels as ``payloadRef``.

The envelope (``envelope@2``, as ``envelope@1`` before it) carries either ``payload`` or
``payloadRef`` (``digest``, ``objectKey``, ``sizeBytes``). :func:`check_in` stores the canonical
JSON of a payload larger than :data:`THRESHOLD_BYTES` in the object store under its own digest — per
tenant, ``claims/<tenant>/sha256/<hh>/<hex>.json``, written only if absent — and returns the
envelope with the reference in place of the payload; a smaller payload stays inline.
:func:`check_out` does the reverse and verifies on read: the key must be the envelope tenant's and
name the digest, and the bytes must have exactly the size and digest the reference states, else the
terminal ``corrupt-payload`` (a mismatch is never retried: the same bytes would fail again).
:func:`check_in_result` / :func:`check_out_result` do the same for a stage's result, which then
travels as ``{"payloadRef": {…}}``.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from typing import Any

from accord.canonical import canonical_json, sha256_hex
from accord.errors import StageFailed
from accord.objects.ports import (
    ObjectDenied,
    ObjectError,
    ObjectExists,
    ObjectNotFound,
    ObjectStore,
)

__all__ = ["THRESHOLD_BYTES", "check_in", "check_in_result", "check_out", "check_out_result"]

THRESHOLD_BYTES = 256 * 1024  # a quarter of envelope@2's maxBytes (1 MiB): room for the rest
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def _corrupt(reason: str, ref: Mapping[str, Any]) -> StageFailed:
    shown = {k: ref.get(k) for k in ("digest", "objectKey", "sizeBytes")}
    return StageFailed(reason, failure_code="corrupt-payload", retryable=False, details=shown)


def _store(value: Mapping[str, Any], store: ObjectStore, tenant: str) -> dict[str, Any]:
    blob = canonical_json(dict(value))
    hexd = sha256_hex(blob)
    key = f"claims/{tenant}/sha256/{hexd[:2]}/{hexd}.json"
    with contextlib.suppress(ObjectExists):  # content-addressed: the same bytes are there
        store.put(key, blob, if_absent=True)
    return {"digest": f"sha256:{hexd}", "objectKey": key, "sizeBytes": len(blob)}


def _load(ref: Any, store: ObjectStore, tenant: str) -> dict[str, Any]:
    if not isinstance(ref, dict):
        raise _corrupt("payloadRef is not an object", {})
    digest, key, size = ref.get("digest"), ref.get("objectKey"), ref.get("sizeBytes")
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise _corrupt("payloadRef.digest is not sha256:<64 hex>", ref)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise _corrupt("payloadRef.sizeBytes is not a non-negative integer", ref)
    hexd = digest.removeprefix("sha256:")
    if key != f"claims/{tenant}/sha256/{hexd[:2]}/{hexd}.json":
        raise StageFailed(
            "payloadRef.objectKey is not this tenant's claim for its digest",
            failure_code="storage-ref-denied",
            retryable=False,
            details={"objectKey": str(key)[:200]},
        )
    try:
        blob = store.get(key).data
    except ObjectNotFound:
        raise _corrupt("the claimed payload is missing from the object store", ref) from None
    except ObjectError as exc:
        denied = isinstance(exc, ObjectDenied)
        raise StageFailed(
            f"the object store refused or failed: {exc}",
            failure_code="storage-ref-denied" if denied else "storage-unavailable",
            retryable=exc.retryable and not denied,
            details={"objectKey": key},
        ) from None
    if len(blob) != size:
        raise _corrupt(f"the claimed payload is {len(blob)} bytes, the reference says {size}", ref)
    if "sha256:" + sha256_hex(blob) != digest:
        raise _corrupt("the claimed payload fails its digest", ref)
    try:
        value = json.loads(blob)
    except ValueError:
        raise _corrupt("the claimed payload is not JSON", ref) from None
    if not isinstance(value, dict):
        raise _corrupt("the claimed payload is not a JSON object", ref)
    return value


def check_in(
    envelope: Mapping[str, Any], store: ObjectStore, *, threshold: int = THRESHOLD_BYTES
) -> dict[str, Any]:
    """``envelope`` with a payload above ``threshold`` bytes replaced by its ``payloadRef``."""
    out = dict(envelope)
    payload = out.get("payload")
    if not isinstance(payload, dict) or len(canonical_json(payload)) <= threshold:
        return out
    out["payloadRef"] = _store(payload, store, str(out["tenant"]))
    del out["payload"]
    return out


def check_out(envelope: Mapping[str, Any], store: ObjectStore) -> dict[str, Any]:
    """``envelope`` with its ``payloadRef`` replaced by the verified payload."""
    out = dict(envelope)
    if "payloadRef" not in out:
        return out
    out["payload"] = _load(out.pop("payloadRef"), store, str(out["tenant"]))
    return out


def check_in_result(
    result: Mapping[str, Any],
    store: ObjectStore,
    tenant: str,
    *,
    threshold: int = THRESHOLD_BYTES,
) -> dict[str, Any]:
    """A result above ``threshold`` bytes as ``{"payloadRef": {…}}``; a smaller one unchanged."""
    if len(canonical_json(dict(result))) <= threshold:
        return dict(result)
    return {"payloadRef": _store(result, store, tenant)}


def check_out_result(result: Mapping[str, Any], store: ObjectStore, tenant: str) -> dict[str, Any]:
    """The verified result behind ``{"payloadRef": {…}}``; any other result unchanged."""
    if set(result) != {"payloadRef"}:
        return dict(result)
    return _load(result["payloadRef"], store, tenant)
