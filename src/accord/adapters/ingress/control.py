"""The control plane's own state: API keys, audit records and idempotency claims.

It lives in one SQLite file, kept apart from the run store so the store ports stay as they are:
beside a SQLite store it is the store's file with ``.control.db`` appended (``.accord/accord.db``
→ ``.accord/accord.db.control.db``); for any other store it is ``.accord/control.db`` unless
``--control PATH`` names another (:func:`control_path`). Every ``accord serve`` and ``accord
keys`` process of one deployment must name the same file. Writes are single statements in WAL
mode: a key's creation or revocation is fsynced before it is acknowledged (``synchronous=FULL``);
audit records and claims survive a crash of the process, and a power cut may lose the last of
them (``synchronous=NORMAL``: they are on disk at the next checkpoint), which keeps two fsyncs
off every start.

- **Keys** are ``acc_<id>_<secret>``: ``id`` (12 hex digits) finds the row in one lookup, and
  only the sha256 of the secret (32 random bytes) is stored; the key itself is shown once, when
  it is made. A revoked key stays listed, with the time it was revoked, and no longer
  authenticates.
- **Audit** records are appended, never changed: principal, time, tenant, request id, action,
  target and a small detail document.
- **Idempotency claims** bind ``(tenant, Idempotency-Key)`` to the digest of the request body
  and the run id derived from them; the first claim wins (one ``INSERT``), so two requests with
  one key racing each other start one run, and a different body under a claimed key is refused.

Rate-limit buckets are not kept here: they live in each API process's memory
(:mod:`accord.adapters.ingress.limits`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from accord.errors import AccordError

__all__ = [
    "KEY_PREFIX",
    "ROLES",
    "ApiKey",
    "AuditRecord",
    "ControlStore",
    "ControlStoreError",
    "control_path",
    "role_at_least",
]

ROLES = ("viewer", "operator", "author", "admin")  # each may do what the ones before it may
KEY_PREFIX = "acc_"
_KEY_ID_HEX = 12

_SCHEMA = """
CREATE TABLE IF NOT EXISTS accord_api_keys (
  key_id TEXT PRIMARY KEY,
  secret_sha256 TEXT NOT NULL,
  role TEXT NOT NULL,
  tenants TEXT NOT NULL,
  name TEXT NOT NULL,
  created_at_ms INTEGER NOT NULL,
  created_by TEXT NOT NULL,
  revoked_at_ms INTEGER
);
CREATE TABLE IF NOT EXISTS accord_audit (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  at_ms INTEGER NOT NULL,
  principal TEXT NOT NULL,
  tenant TEXT NOT NULL,
  request_id TEXT NOT NULL,
  action TEXT NOT NULL,
  target TEXT NOT NULL,
  detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS accord_audit_tenant ON accord_audit (tenant, seq);
CREATE TABLE IF NOT EXISTS accord_idempotency (
  tenant TEXT NOT NULL,
  idem_key TEXT NOT NULL,
  body_sha256 TEXT NOT NULL,
  run_id TEXT NOT NULL,
  created_at_ms INTEGER NOT NULL,
  PRIMARY KEY (tenant, idem_key)
);
"""


class ControlStoreError(AccordError):
    code = "control-store-error"


def role_at_least(role: str, needed: str) -> bool:
    return role in ROLES and ROLES.index(role) >= ROLES.index(needed)


def control_path(store_url: str, explicit: str | None = None) -> Path:
    """Where the control file of a deployment over ``store_url`` lives (see the module doc)."""
    if explicit:
        return Path(explicit)
    parts = urlsplit(store_url)
    if parts.scheme.lower() == "sqlite":
        target = store_url.split("://", 1)[1].split("?", 1)[0]
        target = target[1:] if target.startswith("/") else target  # sqlite:///rel, ////abs
        if target and target != ":memory:":
            return Path(target + ".control.db")
    return Path(".accord/control.db")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class ApiKey:
    key_id: str
    role: str
    tenants: tuple[str, ...]
    name: str
    created_at_ms: int
    created_by: str
    revoked_at_ms: int | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "key_id": self.key_id,
            "role": self.role,
            "tenants": list(self.tenants),
            "name": self.name,
            "created_at_ms": self.created_at_ms,
            "created_by": self.created_by,
            "revoked_at_ms": self.revoked_at_ms,
        }


@dataclass(frozen=True, slots=True)
class AuditRecord:
    seq: int
    at_ms: int
    principal: str
    tenant: str
    request_id: str
    action: str
    target: str
    detail: dict[str, object]

    def to_json(self) -> dict[str, object]:
        return {
            "seq": self.seq,
            "at_ms": self.at_ms,
            "principal": self.principal,
            "tenant": self.tenant,
            "request_id": self.request_id,
            "action": self.action,
            "target": self.target,
            "detail": self.detail,
        }


class ControlStore:
    """The control file (``":memory:"`` for a private one in tests)."""

    def __init__(self, path: Path | str) -> None:
        where = str(path)
        if where != ":memory:":
            Path(where).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = sqlite3.connect(
                where, timeout=10.0, isolation_level=None, check_same_thread=False
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise ControlStoreError(f"cannot open the control file {where}: {exc}") from exc
        self._lock = threading.Lock()
        self.path = where

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _run(self, sql: str, args: Sequence[object] = ()) -> list[tuple[object, ...]]:
        try:
            with self._lock:
                return list(self._conn.execute(sql, tuple(args)).fetchall())
        except sqlite3.Error as exc:
            raise ControlStoreError(f"control file {self.path}: {exc}") from exc

    def _durable(self, sql: str, args: Sequence[object]) -> int:
        """One write, fsynced before it returns (keys: a revocation must survive a power cut);
        the rows it changed."""
        try:
            with self._lock:
                self._conn.execute("PRAGMA synchronous=FULL")
                try:
                    return self._conn.execute(sql, tuple(args)).rowcount
                finally:
                    self._conn.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            raise ControlStoreError(f"control file {self.path}: {exc}") from exc

    # -- keys ------------------------------------------------------------------------------

    def create_key(
        self, role: str, tenants: Sequence[str], *, name: str = "", created_by: str = "cli"
    ) -> tuple[str, ApiKey]:
        """A new key (the full secret, shown once) and its stored row."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
        if not tenants:
            raise ValueError("a key needs at least one tenant")
        key_id = secrets.token_hex(_KEY_ID_HEX // 2)
        secret = secrets.token_urlsafe(32)
        row = ApiKey(key_id, role, tuple(tenants), name, _now_ms(), created_by)
        self._durable(
            "INSERT INTO accord_api_keys (key_id, secret_sha256, role, tenants, name,"
            " created_at_ms, created_by) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (key_id, _sha256(secret), role, json.dumps(list(tenants)), name, row.created_at_ms,
             created_by),
        )  # fmt: skip
        return f"{KEY_PREFIX}{key_id}_{secret}", row

    def verify_key(self, presented: str) -> ApiKey | None:
        """The live key ``presented`` is, or ``None`` (unknown, wrong secret or revoked)."""
        if not presented.startswith(KEY_PREFIX):
            return None
        key_id, sep, secret = presented[len(KEY_PREFIX) :].partition("_")
        if not sep or len(key_id) != _KEY_ID_HEX or not secret:
            return None
        rows = self._run(
            "SELECT secret_sha256, role, tenants, name, created_at_ms, created_by, revoked_at_ms"
            " FROM accord_api_keys WHERE key_id = ?",
            (key_id,),
        )
        if not rows:
            return None
        digest, role, tenants, name, created, by, revoked = rows[0]
        if not hmac.compare_digest(str(digest), _sha256(secret)) or revoked is not None:
            return None
        return ApiKey(key_id, str(role), tuple(json.loads(str(tenants))), str(name),
                      int(str(created)), str(by))  # fmt: skip

    def list_keys(self) -> list[ApiKey]:
        rows = self._run(
            "SELECT key_id, role, tenants, name, created_at_ms, created_by, revoked_at_ms"
            " FROM accord_api_keys ORDER BY created_at_ms, key_id"
        )
        return [
            ApiKey(
                str(k),
                str(r),
                tuple(json.loads(str(t))),
                str(n),
                int(str(c)),
                str(b),
                None if v is None else int(str(v)),
            )
            for k, r, t, n, c, b, v in rows
        ]

    def get_key(self, key_id: str) -> ApiKey | None:
        return next((k for k in self.list_keys() if k.key_id == key_id), None)

    def revoke_key(self, key_id: str) -> bool:
        """Revoke ``key_id``; ``False`` when there is no such live key."""
        changed = self._durable(
            "UPDATE accord_api_keys SET revoked_at_ms = ?"
            " WHERE key_id = ? AND revoked_at_ms IS NULL",
            (_now_ms(), key_id),
        )
        return changed == 1

    # -- audit -----------------------------------------------------------------------------

    def audit(
        self,
        principal: str,
        tenant: str,
        request_id: str,
        *,
        action: str,
        target: str,
        detail: dict[str, object] | None = None,
    ) -> int:
        """Append one audit record; its sequence number."""
        with self._lock:
            try:
                cur = self._conn.execute(
                    "INSERT INTO accord_audit (at_ms, principal, tenant, request_id, action,"
                    " target, detail) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (_now_ms(), principal, tenant, request_id, action, target,
                     json.dumps(detail or {}, sort_keys=True)),
                )  # fmt: skip
            except sqlite3.Error as exc:
                raise ControlStoreError(f"control file {self.path}: {exc}") from exc
            return int(cur.lastrowid or 0)

    def audit_records(
        self, tenants: Sequence[str], *, after: int = 0, limit: int = 100, action: str | None = None
    ) -> list[AuditRecord]:
        """Records of ``tenants`` with ``seq > after``, oldest first."""
        if not tenants:
            return []
        marks = ",".join("?" for _ in tenants)
        sql = (
            "SELECT seq, at_ms, principal, tenant, request_id, action, target, detail"
            f" FROM accord_audit WHERE tenant IN ({marks}) AND seq > ?"
        )
        args: list[object] = [*tenants, after]
        if action is not None:
            sql += " AND action = ?"
            args.append(action)
        rows = self._run(sql + " ORDER BY seq LIMIT ?", [*args, limit])
        return [
            AuditRecord(
                int(str(s)), int(str(a)), str(p), str(t), str(r), str(x), str(g), json.loads(str(d))
            )
            for s, a, p, t, r, x, g, d in rows
        ]

    # -- idempotency -----------------------------------------------------------------------

    def claim(self, tenant: str, key: str, body_sha256: str, run_id: str) -> str | None:
        """Claim ``(tenant, key)`` for this body; ``None`` when this call made the claim, else
        the body digest of the claim already there."""
        with self._lock:
            try:
                cur = self._conn.execute(
                    "INSERT OR IGNORE INTO accord_idempotency (tenant, idem_key, body_sha256,"
                    " run_id, created_at_ms) VALUES (?, ?, ?, ?, ?)",
                    (tenant, key, body_sha256, run_id, _now_ms()),
                )
                if cur.rowcount == 1:
                    return None
                row = self._conn.execute(
                    "SELECT body_sha256 FROM accord_idempotency WHERE tenant = ? AND idem_key = ?",
                    (tenant, key),
                ).fetchone()
            except sqlite3.Error as exc:
                raise ControlStoreError(f"control file {self.path}: {exc}") from exc
        return str(row[0]) if row else body_sha256

    def release(self, tenant: str, key: str) -> None:
        """Drop a claim whose run could not be started, so the key may be used again."""
        self._run("DELETE FROM accord_idempotency WHERE tenant = ? AND idem_key = ?", (tenant, key))
