"""The API's limits: request body size, page sizes and per-principal rate limits.

Rate limits are token buckets kept in the memory of each API process, one per principal: a
bucket holds up to ``burst`` tokens and refills at ``rate`` tokens a second; each authenticated
request spends one, and a request that finds the bucket empty is answered 429 with
``Retry-After`` (whole seconds until a token is back). Several API processes each keep their
own buckets, so a deployment of ``n`` allows up to ``n`` times the rate; a restart refills them.

The body limit is an ASGI middleware (:class:`BodyLimit`): a declared ``Content-Length`` above
the limit, or a body that grows past it, is answered 413 before any route reads it.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from accord.adapters.ingress.problems import problem_body

__all__ = ["ApiLimits", "BodyLimit", "RateLimiter"]

DRAIN_FACTOR = 16  # a refused body is read on up to this many times the limit, then cut off


@dataclass(frozen=True, slots=True)
class ApiLimits:
    max_body_bytes: int = 1_048_576  # the run-requested@1 contract's own maxBytes
    page_default: int = 50
    page_max: int = 500
    history_default: int = 200
    history_max: int = 1_000
    rate_per_s: float = 50.0
    burst: int = 100
    scan_max: int = 10_000  # the most runs one list request reads from the store


class RateLimiter:
    """Per-principal token buckets (at most ``keep`` principals are remembered)."""

    def __init__(self, rate_per_s: float, burst: int, *, keep: int = 10_000) -> None:
        self.rate, self.burst, self._keep = rate_per_s, float(burst), keep
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, who: str) -> float | None:
        """Spend one token of ``who``; ``None`` when allowed, else seconds until one is back."""
        if self.rate <= 0:
            return None
        now = time.monotonic()
        with self._lock:
            tokens, at = self._buckets.pop(who, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if tokens >= 1.0:
                self._buckets[who] = (tokens - 1.0, now)
                wait = None
            else:
                self._buckets[who] = (tokens, now)
                wait = (1.0 - tokens) / self.rate
            while len(self._buckets) > self._keep:
                self._buckets.popitem(last=False)
        return wait


class BodyLimit:
    """Refuses (413) request bodies larger than ``max_bytes``; smaller ones are read whole and
    handed on unchanged."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope.get("headers", ()) if k == b"content-length"), None)
        if declared is not None:
            try:
                too_big = int(declared) > self.max_bytes
            except ValueError:
                too_big = False
            if too_big:
                await self._refuse(send)
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await self._drain(receive, message)
                await self._refuse(send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        whole = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _drain(self, receive: Receive, message: Message) -> None:
        """Read (and drop) the rest of a body being refused, up to :data:`DRAIN_FACTOR` times
        the limit, so the client reads the 413 instead of a reset connection."""
        left = self.max_bytes * DRAIN_FACTOR
        while message.get("more_body", False) and left > 0:
            message = await receive()
            if message["type"] != "http.request":
                return
            left -= len(message.get("body", b""))

    async def _refuse(self, send: Send) -> None:
        doc = problem_body(
            413, "body-too-large", f"the request body exceeds {self.max_bytes} bytes",
            max_bytes=self.max_bytes,
        )  # fmt: skip
        payload = json.dumps(doc).encode("utf-8")
        await send({
            "type": "http.response.start", "status": 413,
            "headers": [(b"content-type", b"application/problem+json"),
                        (b"content-length", str(len(payload)).encode()),
                        (b"connection", b"close")],
        })  # fmt: skip
        await send({"type": "http.response.body", "body": payload})
