"""The search projection in PostgreSQL, through psycopg 3: ``jsonb`` documents, GIN indexes and a
``tsvector`` column, for a deployment where several engines share one index.

URL: ``postgresql://user@host:5432/db?schema=accord_search&max_doc_bytes=1048576
&connect_timeout_ms=10000``. The tables live in ``schema`` (default ``accord_search``), created
when missing. The guard is the same one statement as in SQLite
(``ON CONFLICT DO UPDATE … WHERE excluded.seq > seq``); a bulk upsert is one transaction run as
one pipeline. A connection that cannot be had or is lost becomes a retryable
:class:`~accord.errors.StoreError` (the projector retries it with backoff); anything else a
non-retryable one naming the operation.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.types.json import Jsonb

from accord.adapters._store_rules import int_option
from accord.adapters.projection import DEFAULT_MAX_DOC_BYTES, FACETS, encode_body, search_text
from accord.engine.ports import (
    Document,
    FailedDocument,
    IndexOutcome,
    SearchQuery,
    SearchResult,
)
from accord.errors import StoreError

__all__ = ["PostgresProjection"]

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,39}\Z")
_OPTIONS = frozenset({"schema", "max_doc_bytes", "connect_timeout_ms", "sslmode"})

SCHEMA = """
CREATE TABLE IF NOT EXISTS projection_docs (
    doc_id text PRIMARY KEY, kind text NOT NULL, run_id text NOT NULL, tenant text NOT NULL,
    seq bigint NOT NULL, body jsonb NOT NULL, workflow text, version text, digest text,
    status text, intent text, trig text, requester text, updated_at bigint, words tsvector
);
CREATE INDEX IF NOT EXISTS projection_docs_run ON projection_docs (run_id);
CREATE INDEX IF NOT EXISTS projection_docs_find ON projection_docs (kind, tenant, updated_at);
CREATE INDEX IF NOT EXISTS projection_docs_wf ON projection_docs (kind, workflow, status);
CREATE INDEX IF NOT EXISTS projection_docs_body ON projection_docs USING gin (body);
CREATE INDEX IF NOT EXISTS projection_docs_words ON projection_docs USING gin (words);
CREATE TABLE IF NOT EXISTS projection_failures (
    doc_id text PRIMARY KEY, run_id text NOT NULL, error text NOT NULL,
    attempts integer NOT NULL, failed_at bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS projection_marks (name text PRIMARY KEY, value bigint NOT NULL)
"""

_UPSERT = """
INSERT INTO projection_docs AS d
    (doc_id, kind, run_id, tenant, seq, body, workflow, version, digest, status, intent, trig,
     requester, updated_at, words)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, to_tsvector('simple', %s))
ON CONFLICT (doc_id) DO UPDATE SET
    kind = excluded.kind, run_id = excluded.run_id, tenant = excluded.tenant,
    seq = excluded.seq, body = excluded.body, workflow = excluded.workflow,
    version = excluded.version, digest = excluded.digest, status = excluded.status,
    intent = excluded.intent, trig = excluded.trig, requester = excluded.requester,
    updated_at = excluded.updated_at,
    words = excluded.words
WHERE excluded.seq > d.seq
RETURNING doc_id
"""


def _str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    return value if isinstance(value, str) else None


def where(q: SearchQuery) -> tuple[str, list[Any]]:
    """The ``WHERE`` clause of a run search (PostgreSQL dialect) and its parameters."""
    sql: list[str] = ["kind = 'run'"]
    args: list[Any] = []
    if q.tenants is not None:
        sql.append("tenant = ANY(%s)")
        args.append(list(q.tenants))
    for column, value in (
        ("workflow", q.workflow), ("status", q.status), ("intent", q.intent),
        ("trig", q.trigger), ("requester", q.requester), ("run_id", q.run_id),
    ):  # fmt: skip
        if value:
            sql.append(f"{column} = %s")
            args.append(value)
    if q.version:
        sql.append("(version = %s OR starts_with(digest, %s))")
        args.extend([q.version, q.version])
    if q.since_ms is not None:
        sql.append("updated_at >= %s")
        args.append(q.since_ms)
    if q.until_ms is not None:
        sql.append("updated_at <= %s")
        args.append(q.until_ms)
    if q.stage:
        if q.stage_status == "failed":
            sql.append("body -> 'failed_stages' ? %s")
            args.append(q.stage)
        elif q.stage_status:
            sql.append("body -> 'stages' -> %s ->> 'status' = %s")
            args.extend([q.stage, q.stage_status])
        else:
            sql.append("body -> 'stages' -> %s ->> 'status' NOT IN ('pending', 'skipped')")
            args.append(q.stage)
    words = q.text.split()
    if words:
        sql.append("words @@ plainto_tsquery('simple', %s)")
        args.append(" ".join(words))
    return " AND ".join(sql), args


class PostgresProjection:
    def __init__(
        self,
        dsn: str,
        schema: str = "accord_search",
        *,
        max_doc_bytes: int = DEFAULT_MAX_DOC_BYTES,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.dsn, self.schema = dsn, schema
        self.max_doc_bytes = max_doc_bytes
        self.connect_timeout_s = connect_timeout_s
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock: asyncio.Lock | None = None
        self._closed = False

    @classmethod
    def from_url(cls, url: str) -> PostgresProjection:
        parts = urlsplit(url)
        pairs = parse_qsl(parts.query)
        unknown = sorted({k for k, _ in pairs} - _OPTIONS)
        if unknown:
            raise ValueError(f"unknown option(s) {unknown}; known: {sorted(_OPTIONS)}")
        opts = dict(pairs)
        schema = opts.get("schema", "accord_search")
        if not _SCHEMA_NAME.match(schema):
            raise ValueError(f"schema={schema!r}: expected [a-z_][a-z0-9_]{{0,39}}")
        driver = [(k, v) for k, v in pairs if k == "sslmode"]
        dsn = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(driver), ""))
        return cls(
            dsn,
            schema,
            max_doc_bytes=int_option(opts, "max_doc_bytes", DEFAULT_MAX_DOC_BYTES),
            connect_timeout_s=int_option(opts, "connect_timeout_ms", 10_000) / 1000,
        )

    @property
    def where_(self) -> str:
        parts = urlsplit(self.dsn)
        return f"{parts.hostname}:{parts.port or 5432}{parts.path}#{self.schema}"

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        conn = await psycopg.AsyncConnection.connect(
            self.dsn, connect_timeout=max(1, int(self.connect_timeout_s)), autocommit=True
        )
        await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
        await conn.execute(f'SET search_path TO "{self.schema}"')
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.schema,))
            for statement in (s.strip() for s in SCHEMA.split(";")):
                if statement:
                    await conn.execute(statement)
        return conn

    @contextlib.asynccontextmanager
    async def _connection(self, what: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if self._closed:
            raise StoreError(f"projection {self.where_}: handle is closed")
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            try:
                if self._conn is None or self._conn.closed or self._conn.broken:
                    self._conn = await self._connect()
                yield self._conn
            except psycopg.OperationalError as exc:
                conn, self._conn = self._conn, None
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
                why = " ".join(str(exc).split())
                raise StoreError(f"projection {self.where_} {what}: {why}", retryable=True) from exc
            except psycopg.Error as exc:
                why = " ".join(str(exc).split())
                raise StoreError(f"projection {self.where_} {what}: {why}") from exc

    async def upsert(self, documents: Sequence[Document], now_ms: int) -> list[IndexOutcome]:
        out: list[IndexOutcome | None] = []
        rows: list[tuple[int, tuple[Any, ...]]] = []
        for doc in documents:
            try:
                size = len(encode_body(doc).encode())
            except (ValueError, TypeError) as exc:
                out.append(IndexOutcome(doc.doc_id, "failed", f"not encodable: {exc}"))
                continue
            if size > self.max_doc_bytes:
                why = f"document of {size} bytes > max_doc_bytes"
                out.append(IndexOutcome(doc.doc_id, "failed", why))
                continue
            b = doc.body
            updated = b.get("updated_at_ms") if doc.kind == "run" else b.get("at_ms")
            rows.append((len(out), (
                doc.doc_id, doc.kind, doc.run_id, doc.tenant, doc.seq, Jsonb(b),
                _str(b, "workflow"), _str(b, "version"), _str(b, "plan_digest"), _str(b, "status"),
                _str(b, "intent"), _str(b, "trigger"), _str(b, "requester"),
                updated if isinstance(updated, int) else None,
                search_text(b) if doc.kind == "run" else "",
            )))  # fmt: skip
            out.append(None)
        if rows:
            changed: list[bool] = []  # one result set per row, in order
            async with (
                self._connection("upsert") as conn,
                conn.transaction(),
                conn.cursor() as cur,
            ):
                await cur.executemany(_UPSERT, [r for _, r in rows], returning=True)
                while True:
                    changed.append(await cur.fetchone() is not None)
                    if not cur.nextset():
                        break
            for (index, row), hit in zip(rows, changed, strict=True):
                out[index] = IndexOutcome(row[0], "indexed" if hit else "unchanged")
        return [o for o in out if o is not None]

    async def get(self, doc_id: str) -> Document | None:
        async with self._connection("get") as conn:
            cur = await conn.execute(
                "SELECT doc_id, kind, run_id, tenant, seq, body FROM projection_docs "
                "WHERE doc_id = %s",
                (doc_id,),
            )
            row = await cur.fetchone()
        return None if row is None else _doc(row)

    async def documents(self, run_id: str) -> list[Document]:
        async with self._connection("documents") as conn:
            cur = await conn.execute(
                "SELECT doc_id, kind, run_id, tenant, seq, body FROM projection_docs "
                'WHERE run_id = %s ORDER BY doc_id COLLATE "C"',
                (run_id,),
            )
            rows = await cur.fetchall()
        return [_doc(r) for r in rows]

    async def search(self, query: SearchQuery) -> SearchResult:
        clause, args = where(query)
        async with self._connection("search") as conn:
            marks = dict(
                await (await conn.execute("SELECT name, value FROM projection_marks")).fetchall()
            )
            through, at = (
                int(marks.get("indexed_through_ms", 0)),
                int(marks.get("projected_at_ms", 0)),
            )
            if query.tenants == ():
                return SearchResult([], 0, {k: {} for k in FACETS}, through, at)
            page, page_args = clause, list(args)
            if query.after is not None:  # keyset: after the cursor's place in the order
                page += " AND (updated_at < %s OR (updated_at = %s AND doc_id > %s))"
                page_args.extend([query.after[0], query.after[0], query.after[1]])
            rows = await (await conn.execute(
                f"SELECT body FROM projection_docs WHERE {page} "
                "ORDER BY updated_at DESC, doc_id LIMIT %s",
                [*page_args, max(0, query.limit)],
            )).fetchall()  # fmt: skip
            total = await (await conn.execute(
                f"SELECT count(*) FROM projection_docs WHERE {clause}", args
            )).fetchone()  # fmt: skip
            status = await (await conn.execute(
                f"SELECT status, count(*) FROM projection_docs WHERE {clause} "
                "GROUP BY status",
                args,
            )).fetchall()  # fmt: skip
            version = await (await conn.execute(
                "SELECT workflow || '@' || coalesce(nullif(version, ''), left(digest, 19)), "
                f"count(*) FROM projection_docs WHERE {clause} GROUP BY 1",
                args,
            )).fetchall()  # fmt: skip
            listed: dict[str, dict[str, int]] = {}
            for name, key in (("failed_stage", "failed_stages"),
                              ("failure_class", "failure_classes")):  # fmt: skip
                counted = await (await conn.execute(
                    f"SELECT j, count(*) FROM (SELECT body FROM projection_docs WHERE {clause}) d, "
                    f"jsonb_array_elements_text(coalesce(d.body -> '{key}', '[]'::jsonb)) j "
                    "GROUP BY j",
                    args,
                )).fetchall()  # fmt: skip
                listed[name] = {r[0]: int(r[1]) for r in counted}
            tenant = await (await conn.execute(
                f"SELECT tenant, count(*) FROM projection_docs WHERE {clause} GROUP BY tenant",
                args,
            )).fetchall()  # fmt: skip
        return SearchResult(
            [r[0] for r in rows],
            int(total[0]) if total else 0,
            {
                "status": {r[0]: int(r[1]) for r in status},
                "version": {r[0]: int(r[1]) for r in version},
                **listed,
                "tenant": {r[0]: int(r[1]) for r in tenant},
            },
            through,
            at,
        )

    async def run_ids(self, limit: int = 1000, after: str = "") -> list[str]:
        async with self._connection("run ids") as conn:
            cur = await conn.execute(
                "SELECT doc_id FROM projection_docs WHERE kind = 'run' "
                'AND doc_id COLLATE "C" > %s '
                'ORDER BY doc_id COLLATE "C" LIMIT %s',
                (after, limit),
            )
            return [r[0] for r in await cur.fetchall()]

    async def record_failures(self, failures: Sequence[FailedDocument]) -> None:
        if not failures:
            return
        async with (
            self._connection("record failures") as conn,
            conn.transaction(),
            conn.cursor() as cur,
        ):
            await cur.executemany(
                "INSERT INTO projection_failures AS f (doc_id, run_id, error, attempts, "
                "failed_at) VALUES (%s, %s, %s, %s, %s) ON CONFLICT (doc_id) DO UPDATE SET "
                "error = excluded.error, attempts = f.attempts + excluded.attempts, "
                "failed_at = excluded.failed_at",
                [(f.doc_id, f.run_id, f.error, f.attempts, f.failed_at_ms) for f in failures],
            )

    async def failures(self, limit: int = 1000) -> list[FailedDocument]:
        async with self._connection("failures") as conn:
            cur = await conn.execute(
                "SELECT doc_id, run_id, error, attempts, failed_at FROM projection_failures "
                "ORDER BY failed_at, doc_id LIMIT %s",
                (limit,),
            )
            rows = await cur.fetchall()
        return [FailedDocument(r[0], r[1], r[2], int(r[3]), int(r[4])) for r in rows]

    async def clear_failures(self, doc_ids: Sequence[str]) -> None:
        async with self._connection("clear failures") as conn:
            await conn.execute(
                "DELETE FROM projection_failures WHERE doc_id = ANY(%s)", (list(doc_ids),)
            )

    async def mark(self, indexed_through_ms: int, now_ms: int) -> None:
        async with self._connection("mark") as conn:
            await conn.execute(
                "INSERT INTO projection_marks AS m VALUES ('indexed_through_ms', %s), "
                "('projected_at_ms', %s) ON CONFLICT (name) DO UPDATE SET value = CASE "
                "WHEN m.name = 'indexed_through_ms' THEN greatest(m.value, excluded.value) "
                "ELSE excluded.value END",
                (indexed_through_ms, now_ms),
            )

    async def reset(self) -> None:
        async with self._connection("reset") as conn:
            await conn.execute("TRUNCATE projection_docs, projection_failures, projection_marks")

    async def close(self) -> None:
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()


def _doc(row: Sequence[Any]) -> Document:
    return Document(row[0], row[1], row[2], row[3], int(row[4]), dict(row[5]))
