"""``GET /v1/search``: search runs in the search projection (docs/observability.md).

``q`` takes the terms ``accord runs search`` takes (``workflow:model-ingest status:failed
stage:publish since:1h``, bare words full-text). The search is confined to the principal's
tenants, as ``/v1/runs`` is: a ``tenant:`` term or ``tenant`` parameter naming another is
``403 tenant-forbidden``. The answer carries the matching run documents (newest update first),
``total``, facet counts (``status``, workflow ``version``, ``failed_stage``, ``failure_class``,
``tenant``), ``next_cursor`` (pass it back as ``cursor`` for the next page: a keyset on the last
run's ``(updated_at_ms, run_id)``, so pages neither repeat nor skip a run while others are
updated; ``null`` on the last page; a cursor that does not decode is ``422 search-invalid``), and
says it comes from a derived index and how far behind it is (``lag_ms``,
``last_write_ms_ago``). A process started without a projection answers ``404 projection-off``;
a malformed query is ``422 search-invalid`` naming the term; an index that cannot be reached is
``503 projection-unavailable``.

The projection is read from ``app.state.projection`` (``accord serve`` puts it there).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from accord.adapters.ingress.auth import Principal, authorizer, tenants_of
from accord.adapters.ingress.problems import Problem
from accord.engine.ports import Projection
from accord.engine.runtime.projector import parse_query
from accord.errors import StoreError

__all__ = ["router"]

router = APIRouter(prefix="/v1/search", tags=["search"])
viewer = Depends(authorizer("viewer"))
MAX_LIMIT = 500


def encode_cursor(run: dict[str, Any]) -> str:
    """The opaque cursor after ``run`` (a run document) in the search order."""
    raw = json.dumps([run.get("updated_at_ms"), run.get("run_id")], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(text: str) -> tuple[int, str]:
    """``(updated_at_ms, run_id)`` from a cursor; :class:`ValueError` saying why not."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        value = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise ValueError("not a cursor this server gave (it does not decode)") from None
    match value:
        case [int() as at, str() as run_id] if not isinstance(at, bool):
            return at, run_id
    raise ValueError("not a cursor this server gave (expected [updated_at_ms, run_id])")


def _projection(request: Request) -> Projection:
    projection = getattr(request.app.state, "projection", None)
    if projection is None:
        raise Problem(404, "projection-off", "this server runs without a search projection")
    return projection  # type: ignore[no-any-return]


@router.get("", summary="Search runs in the derived search index, with facets and its lag")
async def search(  # noqa: PLR0917 - FastAPI maps each parameter
    request: Request,
    principal: Principal = viewer,
    q: Annotated[str, Query(max_length=2000, description="search terms")] = "",
    tenant: Annotated[list[str] | None, Query(max_length=63)] = None,
    limit: Annotated[int, Query(ge=0, le=MAX_LIMIT)] = 50,
    cursor: Annotated[str, Query(max_length=400, description="next_cursor of a page")] = "",
) -> dict[str, Any]:
    projection = _projection(request)
    tenants = tuple(tenants_of(principal, tenant))
    now = int(time.time() * 1000)
    try:
        query = parse_query(q, now, tenants=tenants, limit=limit)
    except ValueError as exc:
        raise Problem(422, "search-invalid", f"q: {exc}") from None
    query = dataclasses.replace(query, limit=limit + 1 if limit else 0)  # one more: a next page?
    if cursor:
        try:
            query = dataclasses.replace(query, after=decode_cursor(cursor))
        except ValueError as exc:
            raise Problem(422, "search-invalid", f"cursor: {exc}") from None
    named = [t for t in parse_query(q, now).tenants or ()]
    for t in named:
        if not principal.can_see(t):
            raise Problem(403, "tenant-forbidden", f"{principal.id} may not read {t!r}")
    try:
        result = await projection.search(query)
    except ValueError as exc:
        raise Problem(422, "search-invalid", f"q: {exc}") from None
    except StoreError as exc:
        raise Problem(503, "projection-unavailable", f"the search index: {exc}") from None
    through, at = result.indexed_through_ms, result.projected_at_ms
    runs = result.runs[:limit]
    more = len(result.runs) > limit
    return {
        "runs": runs,
        "total": result.total,
        "next_cursor": encode_cursor(runs[-1]) if more and runs else None,
        "facets": result.facets,
        "source": "derived index (the search projection; the store is the truth)",
        "indexed_through_ms": through,
        "projected_at_ms": at,
        "lag_ms": max(0, at - through) if at and through else None,
        "last_write_ms_ago": max(0, now - at) if at else None,
    }
