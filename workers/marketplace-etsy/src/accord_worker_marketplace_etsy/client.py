"""Etsy's Open API v3 over HTTP, with every answer classified.

| Etsy answers | class | the connector does |
| --- | --- | --- |
| 201 / 200 | done | reads the ShopListing(s) |
| 400 | terminal ``listing-rejected`` | the message names the Accord paths of Etsy's error |
| 401, 403 | terminal ``marketplace-auth`` | logged at ERROR on ``accord.alerts``, never the token |
| 404 | terminal ``shop-not-found`` | |
| 429 | retryable ``rate-limited`` | waits ``Retry-After`` (up to ``max_wait_s``) and calls again |
| 5xx | retryable ``marketplace-unavailable`` | the same; a create is then ambiguous |
| no connection | retryable ``marketplace-unavailable`` | nothing was sent |
| timeout or reset once sent | :class:`Ambiguous` | the caller reconciles before anything else |

On the image operations (getListingImages, uploadListingImage) a 400 is ``image-rejected``.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

import httpx

from accord.worker.sdk import RetryableError, TerminalError
from accord_worker_marketplace_etsy.config import EtsyConfig
from accord_worker_marketplace_etsy.wire import wire_to_path

__all__ = ["Ambiguous", "EtsyClient"]

ALERTS = logging.getLogger("accord.alerts")
_FIELD = re.compile(r"(?:^|;\s*)([a-z_]+(?:\.[0-9]+)?):")


class Ambiguous(Exception):
    """The request was sent and no answer came: it may or may not have taken effect."""


class EtsyClient:
    def __init__(self, config: EtsyConfig, token: str) -> None:
        timeout = httpx.Timeout(config.read_timeout_s, connect=2.0)
        self._config = config
        self._http = httpx.Client(
            base_url=config.base_url,
            timeout=timeout,
            headers={"x-api-key": config.api_key, "authorization": f"Bearer {token}"},
        )

    def close(self) -> None:
        self._http.close()

    def create_listing(self, shop_id: int, form: list[tuple[str, str]]) -> dict[str, Any]:
        return self._call(
            "POST",
            f"/v3/application/shops/{shop_id}/listings",
            content=urlencode(form).encode(),
            headers={"content-type": "application/x-www-form-urlencoded"},
        )

    def listing_images(self, shop_id: int, listing_id: int) -> list[dict[str, Any]]:
        """getListingImages: the listing's images (ListingImage), in the order Etsy gives."""
        path = f"/v3/application/shops/{shop_id}/listings/{listing_id}/images"
        return list(self._call("GET", path, rejected="image-rejected").get("results", []))

    def upload_image(
        self, shop_id: int, listing_id: int, name: str, data: bytes, rank: int
    ) -> dict[str, Any]:
        """uploadListingImage (multipart/form-data): ``data`` as the ``image`` file part named
        ``name``, at ``rank``, replacing whatever is at that rank (``overwrite``)."""
        return self._call(
            "POST",
            f"/v3/application/shops/{shop_id}/listings/{listing_id}/images",
            files={"image": (name, data, _content_type(data))},
            data={"rank": str(rank), "overwrite": "true"},
            rejected="image-rejected",
        )

    def find_by_keyword(self, shop_id: int, keyword: str) -> list[dict[str, Any]]:
        path = f"/v3/application/shops/{shop_id}/listings/active"
        found, offset = [], 0
        while True:
            page = self._call("GET", path, params={"keywords": keyword, "limit": 100,
                                                   "offset": offset})  # fmt: skip
            results = list(page.get("results", []))
            found += results
            offset += len(results)
            if not results or offset >= int(page.get("count", 0)):
                return found

    def _call(
        self, method: str, path: str, *, rejected: str = "listing-rejected", **kw: Any
    ) -> dict[str, Any]:
        for attempt in range(1, self._config.tries + 1):
            try:
                response = self._http.request(method, path, **kw)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                raise RetryableError(f"Etsy unreachable: {type(exc).__name__}",
                                     "marketplace-unavailable") from None  # fmt: skip
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                raise Ambiguous(f"{method} {path}: {type(exc).__name__} after sending") from None
            status = response.status_code
            if status in (200, 201):
                body: dict[str, Any] = response.json()
                return body
            if status == 429 or status >= 500:
                wait = _retry_after(response.headers)
                code = "rate-limited" if status == 429 else "marketplace-unavailable"
                if status >= 500 and method == "POST":
                    raise Ambiguous(f"{method} {path}: {status}")
                if attempt == self._config.tries or wait > self._config.max_wait_s:
                    raise RetryableError(f"Etsy answered {status}; Retry-After {wait:g} s", code)
                time.sleep(wait)
                continue
            raise self._terminal(status, _error_text(response), path, rejected)
        raise AssertionError("unreachable")  # pragma: no cover

    def _terminal(self, status: int, error: str, path: str, rejected: str) -> TerminalError:
        if status in (401, 403):
            ALERTS.error("Etsy refused the connector's credentials (%s) on %s: %s",
                         status, path, error)  # fmt: skip
            return TerminalError(f"Etsy answered {status}: {error}", "marketplace-auth")
        if status == 404:
            return TerminalError(f"Etsy answered 404: {error}", "shop-not-found")
        if rejected != "listing-rejected":
            return TerminalError(f"Etsy answered {status} on {path}: {error}", rejected)
        paths = sorted({wire_to_path(m) for m in _FIELD.findall(error)})
        where = ", ".join(paths) if paths else "listing"
        return TerminalError(f"Etsy rejected the listing at {where}: {error}", "listing-rejected")


def _content_type(data: bytes) -> str:
    """The image type Etsy takes (JPEG, PNG, GIF) by its signature; PNG when unknown."""
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    return "image/png"


def _retry_after(headers: Mapping[str, str]) -> float:
    raw = headers.get("retry-after", "1")
    try:
        return max(0.0, float(raw))
    except ValueError:
        return 1.0


def _error_text(response: httpx.Response) -> str:
    try:
        return str(response.json().get("error", ""))[:500]
    except ValueError:
        return response.text[:500]
