"""A test double of Etsy's Open API v3: a local HTTP service on loopback, for the connector's tests.

It serves five operations of the vendored document (:mod:`tests.etsy_double.spec`):
createListing, findAllActiveListingsByShop (the connector's reconciliation query), getListing,
getListingImages and uploadListingImage. Every request is checked the way the document defines
it: the ``x-api-key`` header and an OAuth bearer token with the operation's scope (401 / 403),
path and query parameters, and the body against the operation's request schema — a form body, or
for an upload a ``multipart/form-data`` body whose ``image`` must be a file part holding a JPEG,
PNG or GIF (400 with ``ErrorSchema``, naming each wire field). Every response is built from its
schema and checked against it. Uploaded images take their ``rank``: with ``overwrite`` they
replace the image there, else they are inserted before it (later ones move up), as Etsy does.

Faults are injected through :class:`EtsyDouble`: a status for the next calls of an operation
(429 or 5xx with ``Retry-After``, 400, 401, 403), a delay *after* the write of a create or an
upload (the client times out although the listing or image exists), a hold after the write
that a test releases (to kill a process in between), queries that wait for each other
(``meet_searches``: callers asking at the same instant, made certain), and what a second create
of the same listing does: ``"create"`` makes a second listing (what Etsy itself does, having no
idempotency key), ``"reject"`` answers 400. It is a test double and nothing else; it keeps
everything in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any, Literal
from urllib.parse import parse_qsl

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.etsy_double.spec import SPEC, build, decode_form, errors_of, operation

__all__ = ["EtsyDouble", "Fault", "serve"]

CREATE = ("/v3/application/shops/{shop_id}/listings", "post")
SEARCH = ("/v3/application/shops/{shop_id}/listings/active", "get")
GET = ("/v3/application/listings/{listing_id}", "get")
IMAGES = ("/v3/application/shops/{shop_id}/listings/{listing_id}/images", "get")
UPLOAD = ("/v3/application/shops/{shop_id}/listings/{listing_id}/images", "post")
_OPS = {"createListing": CREATE, "findAllActiveListingsByShop": SEARCH, "getListing": GET,
        "getListingImages": IMAGES, "uploadListingImage": UPLOAD}  # fmt: skip
_FORM = "application/x-www-form-urlencoded"
_MULTIPART = "multipart/form-data"
SPEC_IMAGE = {"$ref": "#/components/schemas/ListingImage"}
assert "ListingImage" in SPEC["components"]["schemas"]
_IMAGE_TYPES = {b"\x89PNG\r\n\x1a\n": "png", b"\xff\xd8\xff": "jpeg", b"GIF8": "gif"}


@dataclass
class Fault:
    status: int
    times: int = 1
    retry_after: int | None = None
    error: str = "injected"


@dataclass
class EtsyDouble:
    api_key: str = "double-api-key"
    tokens: dict[str, tuple[str, ...]] = field(
        default_factory=lambda: {"token-shop-1": ("listings_r", "listings_w")}
    )
    shops: frozenset[int] = frozenset({1})
    duplicates: Literal["create", "reject"] = "create"
    faults: dict[str, list[Fault]] = field(default_factory=dict)
    delay_after_write_s: float = 0.0
    delay_times: int = 0
    hold: threading.Event | None = None
    listings: dict[int, dict[str, Any]] = field(default_factory=dict)
    images: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # listing → by rank
    uploads: list[tuple[int, str, int]] = field(default_factory=list)  # (listing, file, rank)
    upload_delay_s: float = 0.0
    upload_delay_times: int = 0
    calls: list[tuple[str, int]] = field(default_factory=list)  # (operation, status) answered
    received: list[str] = field(default_factory=list)  # operations, in the order they arrived
    written: threading.Event = field(default_factory=threading.Event)
    _next_id: int = 1000
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _meet: threading.Barrier | None = None
    _meet_left: int = 0

    def inject(self, operation_id: str, fault: Fault) -> None:
        assert operation_id in _OPS, operation_id
        with self._lock:
            self.faults.setdefault(operation_id, []).append(fault)

    def slow_after_write(self, seconds: float, times: int = 1) -> None:
        self.delay_after_write_s, self.delay_times = seconds, times

    def slow_upload_after_write(self, seconds: float, times: int = 1) -> None:
        """The next ``times`` image uploads answer ``seconds`` after the image is stored."""
        self.upload_delay_s, self.upload_delay_times = seconds, times

    def meet_searches(self, parties: int) -> None:
        """The next ``parties`` reconciliation queries wait for each other and are answered
        together, from the same state: callers that ask at the same instant, made certain."""
        with self._lock:
            self._meet, self._meet_left = threading.Barrier(parties), parties

    def count(self, operation_id: str, status: int | None = None) -> int:
        return sum(1 for op, s in self.calls if op == operation_id and status in (None, s))

    def _fault(self, operation_id: str) -> Fault | None:
        with self._lock:
            queue = self.faults.get(operation_id, [])
            if not queue:
                return None
            fault = queue[0]
            fault.times -= 1
            if fault.times <= 0:
                queue.pop(0)
            return fault

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route(CREATE[0], self._create, methods=["POST"]),
                Route(SEARCH[0], self._search, methods=["GET"]),
                Route(GET[0], self._get, methods=["GET"]),
                Route(IMAGES[0], self._images, methods=["GET"]),
                Route(UPLOAD[0], self._upload, methods=["POST"]),
            ]
        )

    # -- request checks ----------------------------------------------------------------------

    def _refuse(self, op_id: str, request: Request, scope: str) -> Response | None:
        self.received.append(op_id)
        fault = self._fault(op_id)
        if fault is not None:
            headers = {} if fault.retry_after is None else {"Retry-After": str(fault.retry_after)}
            return self._answer(op_id, fault.status, {"error": fault.error}, headers)
        if request.headers.get("x-api-key") != self.api_key:
            return self._answer(op_id, 401, {"error": "x-api-key: missing or unknown API key"})
        auth = request.headers.get("authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        if token is None or token not in self.tokens:
            return self._answer(op_id, 401, {"error": "authorization: invalid_token"})
        if scope not in self.tokens[token]:
            return self._answer(op_id, 403, {"error": f"authorization: scope {scope} required"})
        return None

    def _admit(self, op_id: str, request: Request, scope: str) -> dict[str, Any] | Response:
        """The operation's parameters, or the answer that refuses the call: an injected fault,
        a key or token without ``scope`` (:meth:`_refuse`), parameters off the document (400)."""
        refused = self._refuse(op_id, request, scope)
        if refused is not None:
            return refused
        params, problems = self._params(op_id, request)
        if problems:
            return self._answer(op_id, 400, {"error": "; ".join(problems)})
        return params

    def _params(self, op_id: str, request: Request) -> tuple[dict[str, Any], list[str]]:
        path, method = _OPS[op_id]
        values: dict[str, Any] = {}
        problems: list[str] = []
        for param in operation(path, method).get("parameters", []):
            where = request.path_params if param["in"] == "path" else request.query_params
            raw = where.get(param["name"])
            if raw is None:
                if param.get("required"):
                    problems.append(f"{param['name']}: required")
                continue
            value = decode_form({"properties": {"v": param["schema"]}}, [("v", str(raw))])["v"]
            problems += [f"{param['name']}{p[4:]}" for p in errors_of(param["schema"], value)]
            values[param["name"]] = value
        return values, problems

    def _answer(
        self, op_id: str, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> Response:
        path, method = _OPS[op_id]
        self.calls.append((op_id, status))
        spec = operation(path, method)["responses"].get(str(status))
        if spec is not None and "content" in spec:
            body = build(spec["content"]["application/json"]["schema"], body)
        return JSONResponse(body, status_code=status, headers=headers)

    # -- operations --------------------------------------------------------------------------

    async def _create(self, request: Request) -> Response:
        op_id = "createListing"
        params = self._admit(op_id, request, "listings_w")
        if isinstance(params, Response):
            return params
        if params["shop_id"] not in self.shops:
            return self._answer(op_id, 404, {"error": f"shop_id: no shop {params['shop_id']}"})
        content = operation(*CREATE)["requestBody"]["content"]
        if request.headers.get("content-type", "").split(";")[0] != _FORM:
            return self._answer(op_id, 400, {"error": f"body: content type must be {_FORM}"})
        schema = content[_FORM]["schema"]
        pairs = parse_qsl((await request.body()).decode(), keep_blank_values=True)
        body = decode_form(schema, pairs)
        problems = errors_of(schema, body)
        if problems:
            return self._answer(op_id, 400, {"error": "; ".join(problems)})
        with self._lock:
            same = [x for x in self.listings.values() if _same(x, body, params["shop_id"])]
            if same and self.duplicates == "reject":
                dup = {"error": f"duplicate of listing {same[0]['listing_id']}"}
                return self._answer(op_id, 400, dup)
            listing_id = self._next_id
            self._next_id += 1
            now = int(time.time())
            listing = {
                "listing_id": listing_id,
                "user_id": 1,
                "shop_id": params["shop_id"],
                "title": body["title"],
                "description": body["description"],
                "state": "0",
                "creation_timestamp": now,
                "last_modified_timestamp": now,
                "quantity": body["quantity"],
                "url": f"https://www.etsy.com/listing/{listing_id}",
                "tags": list(body.get("tags") or []),
                "materials": list(body.get("materials") or []),
                "who_made": body["who_made"],
                "when_made": body["when_made"],
                "price": {"amount": round(body["price"] * 100), "divisor": 100,
                          "currency_code": "USD"},
            }  # fmt: skip
            self.listings[listing_id] = listing
            delay = self.delay_after_write_s if self.delay_times > 0 else 0.0
            self.delay_times -= 1 if delay else 0
        self.written.set()
        if self.hold is not None:
            await asyncio.to_thread(self.hold.wait, 60)
        if delay:
            await asyncio.sleep(delay)
        return self._answer(op_id, 201, listing)

    async def _search(self, request: Request) -> Response:
        op_id = "findAllActiveListingsByShop"
        params = self._admit(op_id, request, "listings_r")
        if isinstance(params, Response):
            return params
        words = str(params.get("keywords") or "").lower().split()
        with self._lock:
            meet = self._meet if self._meet_left > 0 else None
            self._meet_left -= 1 if meet is not None else 0
        if meet is not None:
            await asyncio.to_thread(meet.wait, 30)
        with self._lock:
            found = [
                x for x in self.listings.values()
                if x["shop_id"] == params["shop_id"] and all(w in _text(x) for w in words)
            ]  # fmt: skip
        offset, limit = int(params.get("offset", 0)), int(params.get("limit", 25))
        page = [build(operation(*GET)["responses"]["200"]["content"]["application/json"]
                      ["schema"], x) for x in found[offset : offset + limit]]  # fmt: skip
        return self._answer(op_id, 200, {"count": len(found), "results": page})

    async def _get(self, request: Request) -> Response:
        op_id = "getListing"
        params = self._admit(op_id, request, "listings_r")
        if isinstance(params, Response):
            return params
        listing = self.listings.get(params["listing_id"])
        if listing is None:
            return self._answer(op_id, 404, {"error": f"listing_id: no listing {params}"})
        return self._answer(op_id, 200, listing)

    def _listing_of(self, op_id: str, params: dict[str, Any]) -> Response | None:
        """404 unless the listing exists in the shop the path names."""
        listing = self.listings.get(params["listing_id"])
        if params["shop_id"] not in self.shops:
            return self._answer(op_id, 404, {"error": f"shop_id: no shop {params['shop_id']}"})
        if listing is None or listing["shop_id"] != params["shop_id"]:
            why = f"listing_id: no listing {params['listing_id']} in shop {params['shop_id']}"
            return self._answer(op_id, 404, {"error": why})
        return None

    def _image_doc(self, image: dict[str, Any]) -> dict[str, Any]:
        schema = SPEC_IMAGE
        shown = {k: v for k, v in image.items() if not k.startswith("_")}
        return build(schema, shown)

    async def _images(self, request: Request) -> Response:
        op_id = "getListingImages"
        params = self._admit(op_id, request, "listings_r")
        if isinstance(params, Response):
            return params
        missing = self._listing_of(op_id, params)
        if missing is not None:
            return missing
        with self._lock:
            found = [self._image_doc(i) for i in self.images.get(params["listing_id"], [])]
        return self._answer(op_id, 200, {"count": len(found), "results": found})

    async def _upload(self, request: Request) -> Response:
        """uploadListingImage: the multipart body checked against the operation's schema (the
        ``image`` part must be a file holding a JPEG, PNG or GIF), the image stored at ``rank``:
        replacing the one there with ``overwrite``, else inserted before it (later ranks move
        up by one); a rank past the end is the next one."""
        op_id = "uploadListingImage"
        params = self._admit(op_id, request, "listings_w")
        if isinstance(params, Response):
            return params
        missing = self._listing_of(op_id, params)
        if missing is not None:
            return missing
        content_type = request.headers.get("content-type", "")
        if content_type.split(";")[0].strip() != _MULTIPART:
            return self._answer(op_id, 400, {"error": f"body: content type must be {_MULTIPART}"})
        schema = operation(*UPLOAD)["requestBody"]["content"][_MULTIPART]["schema"]
        parts = _multipart(content_type, await request.body())
        if parts is None:
            return self._answer(op_id, 400, {"error": "body: not a multipart/form-data body"})
        pairs = [(name, text) for name, (filename, text, _) in parts.items() if filename is None]
        body = decode_form(schema, pairs)
        problems = [f"{n}: not a form field of uploadListingImage"
                    for n in parts if n not in schema["properties"]]  # fmt: skip
        image = parts.get("image")
        if image is not None:
            if image[0] is None:
                problems.append("image: must be a file part (format binary)")
            body["image"] = image[0] or ""
        problems += errors_of(schema, body)
        if image is None:
            why = "image: required (re-associating listing_image_id is not served by the double)"
            problems.append(why)
        if problems:
            return self._answer(op_id, 400, {"error": "; ".join(problems)})
        assert image is not None
        data = image[2]
        kind = next((k for sig, k in _IMAGE_TYPES.items() if data.startswith(sig)), None)
        if kind is None:
            return self._answer(op_id, 400, {"error": "image: not a JPEG, PNG or GIF file"})
        width, height = _png_size(data) if kind == "png" else (0, 0)
        rank, overwrite = int(body.get("rank", 1)), bool(body.get("overwrite", False))
        with self._lock:
            images = self.images.setdefault(params["listing_id"], [])
            rank = min(max(rank, 1), len(images) + 1)
            at = next((i for i in images if i["rank"] == rank), None)
            if at is not None and overwrite:
                images.remove(at)
            elif at is not None:
                for i in images:
                    i["rank"] += 1 if i["rank"] >= rank else 0
            image_id = self._next_id
            self._next_id += 1
            base = f"https://i.etsystatic.com/{params['listing_id']}/{image_id}"
            stored = {
                "listing_id": params["listing_id"], "listing_image_id": image_id,
                "hex_code": None, "creation_tsz": int(time.time()), "rank": rank,
                "url_75x75": f"{base}/75x75", "url_170x135": f"{base}/170x135",
                "url_570xN": f"{base}/570xN", "url_fullxfull": f"{base}/fullxfull",
                "full_height": height, "full_width": width,
                "_file": image[0], "_bytes": len(data),
            }  # fmt: skip
            images.append(stored)
            images.sort(key=lambda i: i["rank"])
            self.uploads.append((params["listing_id"], str(image[0]), rank))
            delay = self.upload_delay_s if self.upload_delay_times > 0 else 0.0
            self.upload_delay_times -= 1 if delay else 0
        if delay:
            await asyncio.sleep(delay)
        return self._answer(op_id, 200, self._image_doc(stored))


def _multipart(content_type: str, body: bytes) -> dict[str, tuple[str | None, str, bytes]] | None:
    """A multipart/form-data body as ``{name: (filename or None, text, bytes)}``, or None."""
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = BytesParser(policy=HTTP).parsebytes(head + body)
    if not message.is_multipart():
        return None
    out: dict[str, tuple[str | None, str, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            return None
        data = part.get_payload(decode=True)
        data = data if isinstance(data, bytes) else b""
        out[name] = (part.get_filename(), data.decode("utf-8", "replace"), data)
    return out


def _png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    if len(data) < 24:
        return 0, 0
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _same(listing: dict[str, Any], body: dict[str, Any], shop_id: int) -> bool:
    return bool(
        listing["shop_id"] == shop_id
        and listing["title"] == body["title"]
        and listing["tags"] == list(body.get("tags") or [])
    )


def _text(listing: dict[str, Any]) -> str:
    return " ".join([listing["title"], listing["description"], *listing["tags"]]).lower()


@contextlib.contextmanager
def serve(double: EtsyDouble) -> Iterator[str]:
    """Run ``double`` with uvicorn on a free loopback port in a thread; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(double.app(), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "the Etsy double did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        if double.hold is not None:
            double.hold.set()
        server.should_exit = True
        thread.join(10)
        sock.close()
