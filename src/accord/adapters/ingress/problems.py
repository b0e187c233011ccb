"""RFC 9457 problem documents: every error the HTTP control plane answers is one of these.

A problem is a JSON object served as ``application/problem+json`` with ``type`` (a stable URI
naming the kind of problem), ``title`` (the status's short phrase), ``status``, ``detail`` (what
went wrong, for a person) and ``code`` (a stable, machine-readable name clients match on), plus
any extension members the caller adds (``errors``, ``retry_after``, ``diagnostics`` …).
"""

from __future__ import annotations

from http import HTTPStatus

from fastapi.responses import JSONResponse

__all__ = ["PROBLEM_MEDIA_TYPE", "TYPE_BASE", "Problem", "problem_body", "problem_response"]

PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_BASE = "https://accord.dev/problems/"  # type URIs are identifiers, not links to fetch


def _title(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def problem_body(status: int, code: str, detail: str, **extra: object) -> dict[str, object]:
    """The problem document as a dict (fields type/title/status/detail/code, then ``extra``)."""
    body: dict[str, object] = {
        "type": TYPE_BASE + code,
        "title": _title(status),
        "status": status,
        "detail": detail,
        "code": code,
    }
    for key, value in extra.items():
        if key not in body:
            body[key] = value
    return body


def problem_response(
    status: int,
    code: str,
    detail: str,
    *,
    headers: dict[str, str] | None = None,
    **extra: object,
) -> JSONResponse:
    """A ``JSONResponse`` carrying a problem document with the problem media type."""
    return JSONResponse(
        problem_body(status, code, detail, **extra),
        status_code=status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=headers,
    )


class Problem(Exception):
    """Raised by a route or dependency to answer with a problem document (the application's
    handler turns it into :func:`problem_response`)."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: object,
    ) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail
        self.headers = headers
        self.extra = extra

    def response(self) -> JSONResponse:
        return problem_response(
            self.status, self.code, self.detail, headers=self.headers, **self.extra
        )
