"""Standard Webhooks signatures: signing what Accord sends, verifying what remote workers send.

A signed request carries ``webhook-id``, ``webhook-timestamp`` (Unix seconds) and
``webhook-signature`` (``v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">``, several separated
by spaces), as the Standard Webhooks specification says, plus ``Accord-Key-Id`` naming the key it
was signed with. The HMAC is the ``standardwebhooks`` library's. :class:`WebhookVerifier` checks,
in this order, and refuses with a stable code (:class:`Rejected`):

1. the three headers and the key id are present (``missing-signature``, ``missing-key-id``);
2. the key id is one of the active keys (``unknown-key``); several keys per remote are active at
   once, which is how a secret is rotated: add the new one, move the senders, drop the old one;
3. the timestamp is within ``tolerance_s`` of this clock (``timestamp-expired``,
   ``timestamp-in-future``, ``malformed-signature``);
4. the signature header is well formed: space-separated ``<version>,<base64>`` entries
   (``malformed-signature``; parsed here, since versions of the library differ on whether a
   malformed entry is an error of its own, a plain ``ValueError`` or merely no match), and one of
   them matches (``bad-signature``);
5. the ``webhook-id`` was not seen before (``replayed``, checked by :meth:`WebhookVerifier.claim`
   after the body has been read). Ids are kept in a :class:`ReplayStore` for twice the tolerance
   and a second, so every id whose timestamp can still pass step 3 is remembered.

A replay store is a small port: :class:`MemoryReplayStore` (one process), :class:`SqliteReplayStore`
(a table in a SQLite file, shared by the processes of one machine, e.g. beside the embedded
engine's store) and :class:`RedisReplayStore` (``SET NX PX``, shared by every API server of a
deployment on Redis).
"""

from __future__ import annotations

import asyncio
import binascii
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

__all__ = [
    "KEY_ID_HEADER",
    "MemoryReplayStore",
    "RedisReplayStore",
    "Rejected",
    "ReplayStore",
    "SqliteReplayStore",
    "Verified",
    "WebhookVerifier",
    "sign_headers",
]

KEY_ID_HEADER = "accord-key-id"
ID_HEADER, TIMESTAMP_HEADER = "webhook-id", "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
MAX_ID_CHARS = 256


class Rejected(Exception):
    """A request refused; ``code`` is stable, ``status`` the HTTP status to answer with."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.status, self.code, self.detail = status, code, detail


@dataclass(frozen=True, slots=True)
class Verified:
    webhook_id: str
    key_id: str
    timestamp: int


class ReplayStore(Protocol):
    async def claim(self, webhook_id: str, ttl_ms: int) -> bool:
        """Remember ``webhook_id`` for ``ttl_ms``; whether it was new."""
        ...

    async def release(self, webhook_id: str) -> None:
        """Forget a claimed id (its request could not be carried out; the sender retries)."""
        ...

    async def close(self) -> None: ...


class MemoryReplayStore:
    """Ids in a dict, pruned as they expire; one process only."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._seen: dict[str, float] = {}
        self._clock = clock
        self._next_prune = 0.0

    async def claim(self, webhook_id: str, ttl_ms: int) -> bool:
        now = self._clock()
        if now >= self._next_prune:
            self._seen = {k: v for k, v in self._seen.items() if v > now}
            self._next_prune = now + 1.0
        expires = self._seen.get(webhook_id)
        if expires is not None and expires > now:
            return False
        self._seen[webhook_id] = now + ttl_ms / 1000
        return True

    async def release(self, webhook_id: str) -> None:
        self._seen.pop(webhook_id, None)

    def __len__(self) -> int:
        return len(self._seen)

    async def close(self) -> None:
        self._seen.clear()


class SqliteReplayStore:
    """Ids in a table of a SQLite file (``accord_webhook_ids``): shared by the processes of one
    machine. Expired ids are deleted as new ones come."""

    def __init__(self, path: Path | str, clock: Callable[[], float] = time.time) -> None:
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._clock = clock
        with self._lock:
            self._db.execute("PRAGMA busy_timeout=5000")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS accord_webhook_ids "
                "(id TEXT PRIMARY KEY, expires_at REAL NOT NULL)"
            )

    def _claim(self, webhook_id: str, ttl_ms: int) -> bool:
        now = self._clock()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("DELETE FROM accord_webhook_ids WHERE expires_at <= ?", (now,))
                cur = self._db.execute(
                    "INSERT OR IGNORE INTO accord_webhook_ids VALUES (?, ?)",
                    (webhook_id, now + ttl_ms / 1000),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return cur.rowcount == 1

    async def claim(self, webhook_id: str, ttl_ms: int) -> bool:
        return await asyncio.to_thread(self._claim, webhook_id, ttl_ms)

    def _release(self, webhook_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM accord_webhook_ids WHERE id = ?", (webhook_id,))

    async def release(self, webhook_id: str) -> None:
        await asyncio.to_thread(self._release, webhook_id)

    async def close(self) -> None:
        with self._lock:
            self._db.close()


class RedisReplayStore:
    """Ids as Redis keys ``<prefix>:webhook-id:<id>`` set with ``SET NX PX``: shared by every
    process of a deployment. ``client`` is a ``redis.asyncio.Redis``."""

    def __init__(self, client: Any, prefix: str = "accord", *, owns_client: bool = False) -> None:
        self._client, self._prefix, self._owns = client, prefix, owns_client

    def _key(self, webhook_id: str) -> str:
        return f"{self._prefix}:webhook-id:{webhook_id}"

    async def claim(self, webhook_id: str, ttl_ms: int) -> bool:
        return bool(await self._client.set(self._key(webhook_id), b"1", nx=True, px=ttl_ms))

    async def release(self, webhook_id: str) -> None:
        await self._client.delete(self._key(webhook_id))

    async def close(self) -> None:
        if self._owns:
            await self._client.aclose()


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    return value.strip() if isinstance(value, str) else ""


def _well_formed(entry: str) -> bool:
    """One ``webhook-signature`` entry: ``<version>,<base64>``, a version such as ``v1`` and
    strict, padded base64 (any version is well formed; only ``v1`` can match)."""
    version, comma, encoded = entry.partition(",")
    if not (comma and version.isascii() and version.isalnum() and encoded.isascii()):
        return False
    try:
        return bool(binascii.a2b_base64(encoded, strict_mode=True))
    except binascii.Error:
        return False


class WebhookVerifier:
    """Checks Standard Webhooks signatures against the active keys (``key id → whsec_ secret``)
    with a timestamp tolerance, and remembers ids in a :class:`ReplayStore`."""

    def __init__(
        self,
        keys: Mapping[str, str],
        *,
        tolerance_s: int = 300,
        replay: ReplayStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 1 <= tolerance_s <= 300:
            raise ValueError("tolerance_s must be 1..300 (standardwebhooks holds a 5 min window)")
        self._hooks = {key_id: Webhook(secret) for key_id, secret in keys.items()}
        self.tolerance_s = tolerance_s
        self.replay: ReplayStore = replay if replay is not None else MemoryReplayStore()
        self._clock = clock

    @property
    def replay_ttl_ms(self) -> int:
        """How long an id is remembered: longer than any timestamp that can still pass."""
        return (2 * self.tolerance_s + 1) * 1000

    def verify(self, body: bytes, headers: Mapping[str, str]) -> Verified:
        """The signature checks (steps 1-4); raises :class:`Rejected` (401)."""
        webhook_id = _header(headers, ID_HEADER)
        stamp = _header(headers, TIMESTAMP_HEADER)
        signature = _header(headers, SIGNATURE_HEADER)
        if not (webhook_id and stamp and signature):
            raise Rejected(
                401, "missing-signature",
                "webhook-id, webhook-timestamp and webhook-signature headers are required",
            )  # fmt: skip
        if len(webhook_id) > MAX_ID_CHARS:
            raise Rejected(401, "malformed-signature", f"webhook-id over {MAX_ID_CHARS} characters")
        key_id = _header(headers, KEY_ID_HEADER)
        if not key_id:
            raise Rejected(401, "missing-key-id", "the Accord-Key-Id header is required")
        hook = self._hooks.get(key_id)
        if hook is None:
            raise Rejected(401, "unknown-key", f"key id {key_id[:64]!r} is not an active key")
        try:
            at = float(stamp)
        except ValueError:
            at = math.nan
        if not math.isfinite(at) or not stamp.isdigit():
            raise Rejected(401, "malformed-signature", "webhook-timestamp is not Unix seconds")
        now = self._clock()
        if at < now - self.tolerance_s:
            raise Rejected(
                401, "timestamp-expired",
                f"webhook-timestamp is more than {self.tolerance_s} s old",
            )  # fmt: skip
        if at > now + self.tolerance_s:
            raise Rejected(
                401, "timestamp-in-future",
                f"webhook-timestamp is more than {self.tolerance_s} s ahead",
            )  # fmt: skip
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise Rejected(400, "malformed-body", "the body is not UTF-8") from None
        if not all(map(_well_formed, signature.split(" "))):
            raise Rejected(
                401, "malformed-signature",
                "webhook-signature is malformed: expected space-separated <version>,<base64>",
            )  # fmt: skip
        try:
            hook.verify(
                text,
                {ID_HEADER: webhook_id, TIMESTAMP_HEADER: stamp, SIGNATURE_HEADER: signature},
                json_parse=False,
            )
        except WebhookVerificationError as exc:
            raise Rejected(401, "bad-signature", f"signature not verified: {exc}") from None
        except (ValueError, TypeError, binascii.Error, IndexError) as exc:
            # the library's parsing of a malformed header escapes as a plain ValueError
            raise Rejected(
                401, "malformed-signature", f"webhook-signature is malformed: {exc}"
            ) from None
        return Verified(webhook_id, key_id, int(stamp))

    async def claim(self, verified: Verified) -> None:
        """Step 5: the id is new; raises :class:`Rejected` (409) for a replay."""
        if not await self.replay.claim(verified.webhook_id, self.replay_ttl_ms):
            raise Rejected(
                409, "replayed", f"webhook-id {verified.webhook_id[:64]!r} was already received"
            )

    async def release(self, verified: Verified) -> None:
        await self.replay.release(verified.webhook_id)


def sign_headers(
    key_id: str, secret: str, webhook_id: str, body: bytes, *, timestamp: int | None = None
) -> dict[str, str]:
    """The headers that sign ``body`` with ``secret`` (Standard Webhooks ``v1``)."""
    at = int(time.time()) if timestamp is None else timestamp
    when = datetime.fromtimestamp(at, tz=UTC)
    signature = Webhook(secret).sign(webhook_id, when, body.decode("utf-8"))
    return {
        ID_HEADER: webhook_id,
        TIMESTAMP_HEADER: str(at),
        SIGNATURE_HEADER: signature,
        KEY_ID_HEADER: key_id,
    }
