"""Search projection adapters, opened from URLs (docs/observability.md, "Projection and search").

- ``sqlite:///path/projection.db`` — SQLite with FTS5, the embedded default: beside a SQLite
  store it is the store's file name with ``.projection`` before the suffix
  (:func:`default_projection_url`), a file of its own so indexing never takes the store's
  write lock.
- ``postgresql://user@host:5432/db?schema=accord_search`` — PostgreSQL with ``jsonb`` documents,
  GIN indexes and a ``tsvector`` column, through psycopg 3.

Both take ``max_doc_bytes`` (default 1 MiB): a document whose encoded body is larger is refused
item by item (outcome ``failed``), as a search engine refuses an oversized document in a bulk
request, and the projector sends it to the failure destination.

Both answer :class:`~accord.engine.ports.SearchQuery` the same way: ``stage:<name>`` alone
matches runs in which that stage started (its status is neither ``pending`` nor ``skipped``),
``stage:<name>=<status>`` a stage in that status, and ``status:failed stage:<name>`` runs that
failed with that stage among their failed stages; ``since:``/``until:`` bound the run's last
update; bare words are full-text over the run's workflow, status, stage names, failure classes,
trigger and requester.

A search pages by keyset: ``SearchQuery.after`` is the ``(updated_at_ms, run_id)`` of the last
run of the page before, so a page is stable while runs are updated (a run updated meanwhile moves
to the front, it is neither repeated nor does it push others out of later pages). The facets
count runs by ``status``, ``version``, ``failed_stage``, ``failure_class`` and ``tenant``.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from urllib.parse import urlsplit

from accord.canonical import canonical_json
from accord.engine.ports import Document, JsonDict, Projection
from accord.errors import StoreError

__all__ = [
    "DEFAULT_MAX_DOC_BYTES",
    "FACETS",
    "PROJECTION_SCHEMES",
    "default_projection_url",
    "encode_body",
    "open_projection",
    "search_text",
]

PROJECTION_SCHEMES = ("sqlite", "postgresql")
FACETS = ("status", "version", "failed_stage", "failure_class", "tenant")  # every search counts
DEFAULT_MAX_DOC_BYTES = 1 << 20


def open_projection(url: str) -> Projection:
    """The projection named by ``url``; :class:`~accord.errors.StoreError` naming the problem."""
    try:
        scheme = urlsplit(url).scheme.lower()
        if scheme == "sqlite":
            from accord.adapters.projection.sqlite import SqliteProjection  # noqa: PLC0415

            return SqliteProjection.from_url(url)
        if scheme == "postgresql":
            from accord.adapters.projection.postgres import PostgresProjection  # noqa: PLC0415

            return PostgresProjection.from_url(url)
    except ValueError as exc:
        raise StoreError(f"projection URL {url!r}: {exc}") from exc
    raise StoreError(
        f"projection URL {url!r}: unknown scheme {scheme!r}; expected one of "
        + ", ".join(f"{s}://" for s in PROJECTION_SCHEMES)
    )


def default_projection_url(store_url: str) -> str | None:
    """The projection beside a SQLite store (``runs.db`` → ``runs.projection.db``); ``None``
    for any other store, or one whose URL does not even split (the projection is then off
    unless named; the store refuses its own URL, naming why)."""
    try:
        parts = urlsplit(store_url)
    except ValueError:
        return None
    if parts.scheme.lower() != "sqlite":
        return None
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path or path == ":memory:":
        return None
    p = PurePosixPath(path)
    suffix = p.suffix or ".db"
    return f"sqlite:///{p.with_name(p.stem + '.projection' + suffix)}"


def encode_body(doc: Document) -> str:
    return canonical_json(doc.body).decode()


def _words(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [w for v in value for w in _words(v)]
    return []


def search_text(body: JsonDict) -> str:
    """The words a run document is found by (full-text)."""
    words = [
        *_words(body.get("workflow")),
        *_words(body.get("status")),
        *_words(body.get("intent")),
        *_words(body.get("trigger")),
        *_words(body.get("requester")),
        *_words(body.get("failure_classes")),
    ]
    stages = body.get("stages")
    if isinstance(stages, dict):
        words.extend(stages)
    return " ".join(w.replace("-", " ") + (f" {w}" if "-" in w else "") for w in words)
