"""The connection registry: what a ``storageConnectionRef`` names, per tenant.

A payload carries only an opaque reference name. The worker's own configuration (never the
payload) maps each name to a :class:`Connection`: the store's URL, the tenant it belongs to, the
key prefix that tenant's objects live under, and the operations a stage may perform there. The
worker runtime resolves a reference for one run with :meth:`ConnectionRegistry.resolve`:

1. the reference must be configured (else ``storage-unavailable``);
2. it must belong to the run's tenant — taken from the envelope, never the payload — or be a
   shared connection (``tenant: "*"``) whose prefix is per tenant (``{tenant}`` in it); a
   reference of tenant A used in a run of tenant B is refused with ``storage-ref-denied``;
3. the result is a :class:`Grant`: the tenant's prefix, the allowed operations and a lifetime that
   ends no later than the stage's deadline. Handlers reach objects only through signed URLs the
   grant issues for keys under its prefix; the credentials stay with the registry.

The registry file (JSON) names credentials by environment variable, never inline::

    {"connections": [{"name": "acme-models", "tenant": "acme",
                      "url": "s3://models?endpoint=http://127.0.0.1:8333",
                      "prefix": "tenants/acme/", "operations": ["read", "write"],
                      "accessKeyEnv": "ACME_S3_KEY", "secretKeyEnv": "ACME_S3_SECRET"}]}
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accord.adapters.objects import open_object_store, redact_url
from accord.errors import StageFailed
from accord.objects.ports import ObjectStore, Operation, check_key

__all__ = ["OPERATIONS", "Connection", "ConnectionRegistry", "Grant", "RegistryError"]

OPERATIONS = frozenset({"read", "write", "list"})
ANY_TENANT = "*"
MAX_GRANT_S = 900  # a signed URL never outlives 15 minutes, whatever the deadline
_TENANT = re.compile(r"[A-Za-z0-9_-]{1,64}")
_FIELDS = frozenset({"name", "tenant", "url", "prefix", "operations", "accessKeyEnv",
                     "secretKeyEnv", "maxGrantSeconds"})  # fmt: skip


class RegistryError(ValueError):
    """A registry file or entry is malformed; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class Connection:
    name: str
    tenant: str  # the owning tenant, or "*": shared, with "{tenant}" in the prefix
    url: str
    prefix: str
    operations: frozenset[str] = frozenset({"read"})
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    max_grant_s: int = MAX_GRANT_S

    def __post_init__(self) -> None:
        where = f"connection {self.name!r}"
        if not self.name:
            raise RegistryError("a connection needs a name")
        if self.tenant != ANY_TENANT and _TENANT.fullmatch(self.tenant) is None:
            raise RegistryError(f"{where}: tenant must match [A-Za-z0-9_-]{{1,64}} or be '*'")
        if self.tenant == ANY_TENANT and "{tenant}" not in self.prefix:
            raise RegistryError(f"{where}: a shared connection's prefix must contain {{tenant}}")
        unknown = set(self.operations) - OPERATIONS
        if unknown:
            raise RegistryError(f"{where}: unknown operation(s) {sorted(unknown)}")
        if not self.prefix.endswith("/"):
            raise RegistryError(f"{where}: prefix must end with '/'")
        if not 1 <= self.max_grant_s <= MAX_GRANT_S:
            raise RegistryError(f"{where}: maxGrantSeconds must be 1..{MAX_GRANT_S}")

    def prefix_for(self, tenant: str) -> str:
        return self.prefix.replace("{tenant}", tenant)


@dataclass(frozen=True, slots=True)
class Grant:
    """Access for one run: keys under :attr:`prefix`, :attr:`operations`, until :attr:`expires_s`
    seconds from when it was issued. :meth:`url` signs one operation on one key."""

    ref: str
    tenant: str
    prefix: str
    operations: frozenset[str]
    expires_s: int
    store: ObjectStore = field(repr=False)

    def full_key(self, key: str) -> str:
        try:
            return self.prefix + check_key(key)
        except ValueError as exc:
            raise StageFailed(str(exc), failure_code="invalid-object-key", retryable=False,
                              details={"objectKey": str(key)[:200]}) from None  # fmt: skip

    def url(self, key: str, operation: str) -> str:
        """A signed URL for ``operation`` (``read``/``write``) on ``key`` (sensitive)."""
        if operation not in self.operations:
            raise StageFailed(
                f"storageConnectionRef {self.ref!r} does not allow {operation}",
                failure_code="storage-ref-denied",
                retryable=False,
                details={"storageConnectionRef": self.ref, "operation": operation},
            )
        method: Operation = "get" if operation == "read" else "put"
        return self.store.presign(self.full_key(key), method, self.expires_s)


class ConnectionRegistry:
    def __init__(
        self,
        connections: Iterable[Connection] = (),
        *,
        stores: Mapping[str, ObjectStore] | None = None,
    ) -> None:
        """``stores``: stores already opened, by connection name (else opened from the URL)."""
        self._by_name: dict[str, Connection] = {}
        self._stores: dict[str, ObjectStore] = dict(stores or {})
        for conn in connections:
            if conn.name in self._by_name:
                raise RegistryError(f"connection {conn.name!r} is defined twice")
            self._by_name[conn.name] = conn

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def names(self) -> list[str]:
        return sorted(self._by_name)

    @classmethod
    def from_file(cls, path: Path, env: Mapping[str, str] | None = None) -> ConnectionRegistry:
        environ = os.environ if env is None else env
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise RegistryError(f"{path}: cannot read the registry ({exc})") from None
        items = doc.get("connections") if isinstance(doc, dict) else None
        if not isinstance(items, list):
            raise RegistryError(f"{path}: 'connections' must be a list")
        return cls(_entry(path, n, item, environ) for n, item in enumerate(items))

    def store(self, name: str) -> ObjectStore:
        """The opened store behind connection ``name`` (holds its credentials)."""
        conn = self._by_name[name]
        if name not in self._stores:
            self._stores[name] = open_object_store(
                conn.url, access_key=conn.access_key, secret_key=conn.secret_key
            )
        return self._stores[name]

    def resolve(self, ref: str, tenant: str, *, now_ms: int, deadline_ms: int | None) -> Grant:
        """The run's grant for ``ref``, after checking that ``tenant`` may use it."""
        conn = self._by_name.get(ref)
        if conn is None:
            raise StageFailed("storageConnectionRef names no configured store",
                              failure_code="storage-unavailable", retryable=False,
                              details={"storageConnectionRef": ref[:200]})  # fmt: skip
        if _TENANT.fullmatch(tenant) is None:
            raise StageFailed("the run's tenant is not a valid tenant name",
                              failure_code="storage-ref-denied", retryable=False)  # fmt: skip
        if conn.tenant not in (ANY_TENANT, tenant):
            raise StageFailed(
                f"storageConnectionRef {ref!r} belongs to another tenant than the run's",
                failure_code="storage-ref-denied",
                retryable=False,
                details={"storageConnectionRef": ref, "tenant": tenant},
            )
        lifetime = conn.max_grant_s
        if deadline_ms is not None:
            left = (deadline_ms - now_ms) // 1000
            if left < 1:
                raise StageFailed("the stage's deadline has passed; no storage access is granted",
                                  failure_code="storage-ref-denied", retryable=False)  # fmt: skip
            lifetime = min(lifetime, left)
        return Grant(ref, tenant, conn.prefix_for(tenant), conn.operations, int(lifetime),
                     self.store(ref))  # fmt: skip

    def describe(self) -> list[dict[str, Any]]:
        """The connections without credentials (what an operator may see)."""
        return [{"name": c.name, "tenant": c.tenant, "url": redact_url(c.url), "prefix": c.prefix,
                 "operations": sorted(c.operations)} for c in self._by_name.values()]  # fmt: skip

    def close(self) -> None:
        for store in self._stores.values():
            store.close()
        self._stores.clear()


def _entry(path: Path, n: int, item: Any, env: Mapping[str, str]) -> Connection:
    where = f"{path}: connections[{n}]"
    if not isinstance(item, dict):
        raise RegistryError(f"{where}: must be an object")
    unknown = sorted(set(item) - _FIELDS)
    if unknown:
        raise RegistryError(f"{where}: unknown field(s) {', '.join(unknown)}")
    for name in ("name", "tenant", "url", "prefix"):
        if not isinstance(item.get(name), str):
            raise RegistryError(f"{where}.{name}: required, a string")
    keys = {}
    for name in ("accessKeyEnv", "secretKeyEnv"):
        var = item.get(name)
        if var is not None:
            if not isinstance(var, str) or var not in env:
                raise RegistryError(f"{where}.{name}: environment variable {var!r} is not set")
            keys[name] = env[var]
    ops = item.get("operations", ["read"])
    if not isinstance(ops, list) or not all(isinstance(o, str) for o in ops):
        raise RegistryError(f"{where}.operations: a list of strings")
    try:
        return Connection(item["name"], item["tenant"], item["url"], item["prefix"], frozenset(ops),
                          keys.get("accessKeyEnv"), keys.get("secretKeyEnv"),
                          int(item.get("maxGrantSeconds", MAX_GRANT_S)))  # fmt: skip
    except RegistryError as exc:
        raise RegistryError(f"{where}: {exc}") from None
