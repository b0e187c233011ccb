"""The stage result cache: content-addressed results on an object store.

Key: ``sha256`` over the canonical JSON of ``{input digest, capability name@version, parameters,
tenant}`` (:func:`cache_key`), so a new capability version, other parameters or another tenant
never share an entry. The store is any :class:`~accord.objects.ports.ObjectStore` — a directory
(``.accord/cache`` by default: the store is the state directory and the keys start ``cache/``)
or an S3 bucket. Keys::

    cache/entries/<hh>/<hex>.json              metadata: key, tenant, contract, object key, digest,
                                               size, createdAt, absolute expiresAt
    cache/objects/sha256/<hh>/<hex>.json       the result, addressed by its own digest

A read is classified, never guessed: ``hit`` (metadata valid, unexpired, same tenant, object
verified by digest and valid against its result contract); ``miss`` (the store says explicitly
that the entry does not exist — nothing else); ``denied`` (the tenant may not use the cache, the
entry is another tenant's, or the store refuses the credentials); ``unavailable`` (the store
cannot be reached or read: a stopped server, permissions, not a directory, I/O); ``corrupt``
(metadata unreadable or malformed, object missing or failing its digest);
``invalid-against-contract`` (the object breaks its result contract); ``expired``.

Expiry is the absolute ``expiresAtMs`` inside the validated metadata document, checked on every
read: object metadata (``x-amz-meta-*``, a "TTL" header) expires nothing, and a bucket lifecycle
rule (``accord objects lifecycle apply``) only collects garbage, day-granular, after the fact.

Writes are conditional (``if_absent``; S3 ``If-None-Match: *``), object first, so a reader never
sees metadata pointing at a missing object, and concurrent writers of one entry — in this process
or another — write it once. Concurrent lookups of one key share one read, and
:meth:`ResultCache.get_or_fill` coalesces concurrent misses into one fill. An expired, corrupt or
invalid entry is deleted before its replacement is written (conditionally, as a new one).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from accord.canonical import canonical_json, digest_of, sha256_hex
from accord.contracts.catalog import Catalog
from accord.contracts.validate import Validator
from accord.objects.fs import FileObjectStore
from accord.objects.ports import (
    ObjectDenied,
    ObjectError,
    ObjectExists,
    ObjectNotFound,
    ObjectStore,
)

__all__ = ["OUTCOMES", "CacheRead", "ResultCache", "cache_key", "iso"]

OUTCOMES = (
    "hit",
    "miss",
    "denied",
    "unavailable",
    "corrupt",
    "invalid-against-contract",
    "expired",
)
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
K = TypeVar("K")
T = TypeVar("T")
_META_TYPES = {"key": str, "tenant": str, "contract": str, "objectKey": str, "digest": str,
               "sizeBytes": int, "createdAtMs": int, "expiresAtMs": int}  # fmt: skip


def cache_key(input_digest: str, capability: str, params: Mapping[str, Any], tenant: str) -> str:
    doc = {
        "input": input_digest,
        "capability": capability,
        "params": dict(params),
        "tenant": tenant,
    }
    return digest_of(doc)


def iso(ms: int) -> str:
    return (
        datetime.fromtimestamp(ms / 1000, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


@dataclass(frozen=True, slots=True)
class CacheRead:
    outcome: str
    key: str
    contract: str = ""
    expires_at_ms: int | None = None
    object_key: str | None = None
    digest: str | None = None
    value: dict[str, Any] | None = field(default=None, repr=False)
    reason: str = ""

    @property
    def hit(self) -> bool:
        return self.outcome == "hit"


class ResultCache:
    def __init__(
        self,
        root: Path | None = None,
        *,
        store: ObjectStore | None = None,
        catalog: Catalog | None = None,
        now_ms: Callable[[], int] | None = None,
        tenants: frozenset[str] | None = None,
    ) -> None:
        if store is None:
            if root is None:
                raise ValueError("a result cache needs a root directory or an object store")
            store, name = FileObjectStore(root.parent), root.name
        else:
            name = "cache"
        self.root = root if root is not None else Path(name)
        self.store, self.name = store, name
        self.catalog, self.tenants = catalog, tenants
        self._now = now_ms or (lambda: int(datetime.now(UTC).timestamp() * 1000))
        self._reads: dict[tuple[str, str], asyncio.Future[CacheRead]] = {}
        self._fills: dict[str, asyncio.Future[CacheRead]] = {}
        self.reads = self.fills = 0

    def now_ms(self) -> int:
        return self._now()

    def entry_key(self, key: str) -> str:
        hexd = key.removeprefix("sha256:")
        return f"{self.name}/entries/{hexd[:2]}/{hexd}.json"

    def object_path(self, object_key: str) -> Path:
        """Where a directory-backed cache keeps ``object_key`` (for inspection and tests)."""
        return self.root.parent / object_key

    # -- reading ---------------------------------------------------------------------------

    def get(self, key: str, tenant: str) -> CacheRead:
        """Classify the entry under ``key`` for ``tenant`` (blocking store reads)."""
        self.reads += 1
        if self.tenants is not None and tenant not in self.tenants:
            return CacheRead("denied", key, reason=f"tenant {tenant!r} may not use the cache")
        try:
            raw = self.store.get(self.entry_key(key)).data
        except ObjectNotFound:
            return CacheRead("miss", key)
        except ObjectError as exc:
            return CacheRead(_outcome(exc), key, reason=str(exc))
        meta = _metadata(raw, key, self.name)
        if isinstance(meta, str):
            return CacheRead("corrupt", key, reason=meta)
        base = {"key": key, "contract": meta["contract"], "expires_at_ms": meta["expiresAtMs"]}
        if meta["tenant"] != tenant:
            return CacheRead("denied", **base, reason="the entry belongs to another tenant")
        if meta["expiresAtMs"] <= self._now():
            return CacheRead("expired", **base, reason=f"expired at {iso(meta['expiresAtMs'])}")
        try:
            blob = self.store.get(meta["objectKey"]).data
        except ObjectNotFound:
            return CacheRead("corrupt", **base, reason="the result object is missing")
        except ObjectError as exc:
            return CacheRead(_outcome(exc), **base, reason=str(exc))
        if "sha256:" + sha256_hex(blob) != meta["digest"]:
            return CacheRead("corrupt", **base, reason="the result object fails its digest")
        base |= {"object_key": meta["objectKey"], "digest": meta["digest"]}
        contract = self.catalog.message(meta["contract"]) if self.catalog else None
        if contract is None and self.catalog is not None:
            return CacheRead("invalid-against-contract", **base, reason="unknown result contract")
        checked = Validator.for_contract(contract).validate(blob) if contract else None
        if checked is not None and not checked.ok:
            text = "; ".join(f"{v.path or '$'}: {v.message}" for v in checked.violations)
            return CacheRead("invalid-against-contract", **base, reason=text[:500])
        value = checked.value if checked is not None else json.loads(blob)
        return CacheRead("hit", **base, value=dict(value))

    async def fetch(self, key: str, tenant: str) -> CacheRead:
        """:meth:`get` off the loop; concurrent fetches of one key share one read."""
        read, _ = await _once(
            self._reads, (key, tenant), lambda: asyncio.to_thread(self.get, key, tenant)
        )
        return read

    # -- writing ---------------------------------------------------------------------------

    def put(
        self,
        key: str,
        tenant: str,
        contract: str,
        value: Mapping[str, Any],
        ttl_ms: int,
        *,
        replace: bool = False,
    ) -> str:
        """Store ``value`` under ``key`` (object, then metadata), each written only if absent:
        when another writer got there first its entry stands, unless it reads as anything but a
        hit (expired, corrupt, invalid), which is deleted and replaced. ``replace`` deletes the
        current entry first (the caller read it as stale). Returns the object key."""
        blob = canonical_json(dict(value))
        hexd = sha256_hex(blob)
        object_key = f"{self.name}/objects/sha256/{hexd[:2]}/{hexd}.json"
        with contextlib.suppress(ObjectExists):  # content-addressed: the same bytes are there
            self.store.put(object_key, blob, if_absent=True)
        now = self._now()
        meta = {"key": key, "tenant": tenant, "contract": contract, "objectKey": object_key,
                "digest": f"sha256:{hexd}", "sizeBytes": len(blob), "createdAtMs": now,
                "expiresAtMs": now + ttl_ms, "expiresAt": iso(now + ttl_ms)}  # fmt: skip
        entry, doc = self.entry_key(key), canonical_json(meta)
        extra = {"accord-expires-at": iso(now + ttl_ms)}  # informative: the document decides
        if replace:
            self.store.delete(entry)
        try:
            self.store.put(entry, doc, metadata=extra, if_absent=True)
        except ObjectExists:  # another writer got there first: its entry stands if it is sound
            if self.get(key, tenant).hit:
                return object_key
            self.store.delete(entry)
            with contextlib.suppress(ObjectExists):  # a sound one raced in: it stands
                self.store.put(entry, doc, metadata=extra, if_absent=True)
        return object_key

    async def get_or_fill(
        self, key: str, tenant: str, contract: str, ttl_ms: int,
        fill: Callable[[], Awaitable[Mapping[str, Any]]],
    ) -> tuple[CacheRead, bool]:  # fmt: skip
        """A hit, or the result of ``fill`` stored and returned. Concurrent misses for one key
        run ``fill`` once; the others wait for it. ``True`` when this call filled."""
        read = await self.fetch(key, tenant)
        if read.outcome not in ("miss", "expired", "corrupt", "invalid-against-contract"):
            return read, False

        stale = read.outcome != "miss"

        async def fill_and_read() -> CacheRead:
            self.fills += 1
            value = dict(await fill())
            await asyncio.to_thread(
                lambda: self.put(key, tenant, contract, value, ttl_ms, replace=stale)
            )
            return await asyncio.to_thread(self.get, key, tenant)

        return await _once(self._fills, key, fill_and_read)


async def _once(
    flights: dict[K, asyncio.Future[T]], key: K, work: Callable[[], Awaitable[T]]
) -> tuple[T, bool]:
    """``work()`` for ``key`` run once for all concurrent callers: its result, and whether this
    call ran it (the others wait for that run, and share its exception if it fails)."""
    shared = flights.get(key)
    if shared is not None:
        return await asyncio.shield(shared), False
    future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    flights[key] = future
    try:
        result = await work()
        future.set_result(result)
        return result, True
    except BaseException as exc:
        future.set_exception(exc)
        future.exception()  # retrieved: waiters re-raise it, nobody logs it as lost
        raise
    finally:
        del flights[key]


def _outcome(exc: ObjectError) -> str:
    """``denied`` when the store refused the credentials, else ``unavailable``."""
    return "denied" if isinstance(exc, ObjectDenied) else "unavailable"


def _metadata(raw: bytes, key: str, prefix: str = "cache") -> dict[str, Any] | str:
    """The validated metadata, or why it is corrupt."""
    try:
        meta = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return "the metadata is not JSON"
    if not isinstance(meta, dict):
        return "the metadata is not an object"
    for name, kind in _META_TYPES.items():
        value = meta.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"metadata field {name!r} is missing or not {kind.__name__}"
    if meta["key"] != key or not _DIGEST.match(meta["digest"]):
        return "the metadata names another key or a malformed digest"
    object_key = meta["objectKey"]
    if ".." in object_key.split("/") or not object_key.startswith(f"{prefix}/objects/sha256/"):
        return "the metadata's object key leaves the cache"
    return meta
