"""The search projection in SQLite with FTS5: the embedded default, beside a SQLite store.

URL: ``sqlite:///path/runs.projection.db?max_doc_bytes=1048576&synchronous=NORMAL``. One table of
documents (the body as JSON text, plus the columns searches filter on), an FTS5 table of the run
documents' words, the failure destination and the marks. Writes go through the one-thread
database of :mod:`accord.adapters._sqlite` (a bulk upsert is one transaction). The guard is one
statement: ``INSERT … ON CONFLICT DO UPDATE … WHERE excluded.seq > seq``, so an older or equal
document changes nothing and reports ``unchanged``. ``synchronous`` defaults to ``NORMAL``: the
projection is derived and rebuilt from the store, so it need not pay an fsync per batch.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from accord.adapters import _store_rules as rules
from accord.adapters._sqlite import Database, parse_sqlite_url
from accord.adapters.projection import DEFAULT_MAX_DOC_BYTES, FACETS, encode_body, search_text
from accord.engine.ports import (
    Document,
    FailedDocument,
    IndexOutcome,
    JsonDict,
    SearchQuery,
    SearchResult,
)

__all__ = ["SqliteProjection"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS projection_docs (
    id INTEGER PRIMARY KEY, doc_id TEXT NOT NULL UNIQUE, kind TEXT NOT NULL,
    run_id TEXT NOT NULL, tenant TEXT NOT NULL,
    seq INTEGER NOT NULL, body TEXT NOT NULL, workflow TEXT, version TEXT, digest TEXT,
    status TEXT, intent TEXT, trig TEXT, requester TEXT, updated_at INTEGER
);
CREATE INDEX IF NOT EXISTS projection_docs_run ON projection_docs (run_id);
CREATE INDEX IF NOT EXISTS projection_docs_find ON projection_docs (kind, tenant, updated_at);
CREATE INDEX IF NOT EXISTS projection_docs_wf ON projection_docs (kind, workflow, status);
CREATE VIRTUAL TABLE IF NOT EXISTS projection_words USING fts5 (words);
CREATE TABLE IF NOT EXISTS projection_failures (
    doc_id TEXT PRIMARY KEY, run_id TEXT NOT NULL, error TEXT NOT NULL,
    attempts INTEGER NOT NULL, failed_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS projection_marks (name TEXT PRIMARY KEY, value INTEGER NOT NULL)
"""

_UPSERT = """
INSERT INTO projection_docs
    (doc_id, kind, run_id, tenant, seq, body, workflow, version, digest, status, intent, trig,
     requester, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (doc_id) DO UPDATE SET
    kind = excluded.kind, run_id = excluded.run_id, tenant = excluded.tenant,
    seq = excluded.seq, body = excluded.body, workflow = excluded.workflow,
    version = excluded.version, digest = excluded.digest, status = excluded.status,
    intent = excluded.intent, trig = excluded.trig, requester = excluded.requester,
    updated_at = excluded.updated_at
WHERE excluded.seq > projection_docs.seq
"""


def _str(body: JsonDict, key: str) -> str | None:
    value = body.get(key)
    return value if isinstance(value, str) else None


def _row(doc: Document, text: str) -> tuple[Any, ...]:
    b = doc.body
    updated = b.get("updated_at_ms") if doc.kind == "run" else b.get("at_ms")
    return (
        doc.doc_id, doc.kind, doc.run_id, doc.tenant, doc.seq, text, _str(b, "workflow"),
        _str(b, "version"), _str(b, "plan_digest"), _str(b, "status"), _str(b, "intent"),
        _str(b, "trigger"),
        _str(b, "requester"), updated if isinstance(updated, int) else None,
    )  # fmt: skip


def _fts(text: str) -> str:
    """Bare words as an FTS5 query: every word, each quoted (no operator gets through)."""
    return " ".join('"' + w.replace('"', '""') + '"' for w in text.split())


def where(q: SearchQuery) -> tuple[str, list[Any]]:
    """The ``WHERE`` clause of a run search (SQLite dialect) and its parameters."""
    sql: list[str] = ["kind = 'run'"]
    args: list[Any] = []
    if q.tenants is not None:
        sql.append(f"tenant IN ({','.join('?' * len(q.tenants))})")
        args.extend(q.tenants)
    for column, value in (
        ("workflow", q.workflow), ("status", q.status), ("intent", q.intent),
        ("trig", q.trigger), ("requester", q.requester), ("run_id", q.run_id),
    ):  # fmt: skip
        if value:
            sql.append(f"{column} = ?")
            args.append(value)
    if q.version:
        escaped = q.version.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        sql.append("(version = ? OR digest LIKE ? ESCAPE '\\')")
        args.extend([q.version, escaped + "%"])
    if q.since_ms is not None:
        sql.append("updated_at >= ?")
        args.append(q.since_ms)
    if q.until_ms is not None:
        sql.append("updated_at <= ?")
        args.append(q.until_ms)
    if q.stage:
        if q.stage_status == "failed":
            sql.append("EXISTS (SELECT 1 FROM json_each(body, '$.failed_stages') WHERE value = ?)")
            args.append(q.stage)
        elif q.stage_status:
            sql.append(
                "EXISTS (SELECT 1 FROM json_each(body, '$.stages') WHERE key = ? "
                "AND json_extract(value, '$.status') = ?)"
            )
            args.extend([q.stage, q.stage_status])
        else:
            sql.append(
                "EXISTS (SELECT 1 FROM json_each(body, '$.stages') WHERE key = ? "
                "AND json_extract(value, '$.status') NOT IN ('pending', 'skipped'))"
            )
            args.append(q.stage)
    if q.text.strip():
        sql.append("id IN (SELECT rowid FROM projection_words WHERE words MATCH ?)")
        args.append(_fts(q.text))
    return " AND ".join(sql), args


class SqliteProjection:
    def __init__(self, db: Database, *, max_doc_bytes: int = DEFAULT_MAX_DOC_BYTES) -> None:
        self.db = db
        self.max_doc_bytes = max_doc_bytes
        db.ensure_schema(SCHEMA)

    @classmethod
    def from_url(cls, url: str) -> SqliteProjection:
        path, opts = parse_sqlite_url(url, {"synchronous", "busy_timeout_ms", "max_doc_bytes"})
        db = Database(
            path,
            synchronous=opts.get("synchronous", "NORMAL"),
            busy_timeout_ms=rules.int_option(opts, "busy_timeout_ms", 5000),
        )
        limit = rules.int_option(opts, "max_doc_bytes", DEFAULT_MAX_DOC_BYTES)
        return cls(db, max_doc_bytes=limit)

    async def upsert(self, documents: Sequence[Document], now_ms: int) -> list[IndexOutcome]:
        encoded: list[tuple[Document, str | None, str]] = []
        for doc in documents:
            try:
                text = encode_body(doc)
            except (ValueError, TypeError) as exc:
                encoded.append((doc, None, f"not encodable: {exc}"))
                continue
            if len(text.encode()) > self.max_doc_bytes:
                size = len(text.encode())
                encoded.append((doc, None, f"document of {size} bytes > max_doc_bytes"))
                continue
            encoded.append((doc, text, ""))

        def write(conn: sqlite3.Connection) -> list[IndexOutcome]:
            out: list[IndexOutcome] = []
            for doc, text, error in encoded:
                if text is None:
                    out.append(IndexOutcome(doc.doc_id, "failed", error))
                    continue
                changed = conn.execute(_UPSERT, _row(doc, text)).rowcount
                if changed and doc.kind == "run":  # its words row shares the document's id
                    (rowid,) = conn.execute(
                        "SELECT id FROM projection_docs WHERE doc_id = ?", (doc.doc_id,)
                    ).fetchone()
                    conn.execute("DELETE FROM projection_words WHERE rowid = ?", (rowid,))
                    conn.execute(
                        "INSERT INTO projection_words (rowid, words) VALUES (?, ?)",
                        (rowid, search_text(doc.body)),
                    )
                out.append(IndexOutcome(doc.doc_id, "indexed" if changed else "unchanged"))
            return out

        return await self.db.write(write, "projection upsert")

    async def get(self, doc_id: str) -> Document | None:
        def read(conn: sqlite3.Connection) -> Document | None:
            row = conn.execute(
                "SELECT doc_id, kind, run_id, tenant, seq, body FROM projection_docs "
                "WHERE doc_id = ?",
                (doc_id,),
            ).fetchone()
            return None if row is None else _doc(row)

        return await self.db.read(read, "projection get")

    async def documents(self, run_id: str) -> list[Document]:
        def read(conn: sqlite3.Connection) -> list[Document]:
            rows = conn.execute(
                "SELECT doc_id, kind, run_id, tenant, seq, body FROM projection_docs "
                "WHERE run_id = ? ORDER BY doc_id",
                (run_id,),
            ).fetchall()
            return [_doc(r) for r in rows]

        return await self.db.read(read, "projection documents")

    async def search(self, query: SearchQuery) -> SearchResult:
        clause, args = where(query)

        def read(conn: sqlite3.Connection) -> SearchResult:
            marks = dict(conn.execute("SELECT name, value FROM projection_marks").fetchall())
            if query.tenants == ():
                return SearchResult([], 0, {k: {} for k in FACETS}, *_marks(marks))
            page, page_args = clause, list(args)
            if query.after is not None:  # keyset: after the cursor's place in the order
                page += " AND (updated_at < ? OR (updated_at = ? AND doc_id > ?))"
                page_args.extend([query.after[0], query.after[0], query.after[1]])
            rows = conn.execute(
                f"SELECT body FROM projection_docs WHERE {page} "
                "ORDER BY updated_at DESC, doc_id LIMIT ?",
                [*page_args, max(0, query.limit)],
            ).fetchall()
            total = conn.execute(
                f"SELECT count(*) FROM projection_docs WHERE {clause}", args
            ).fetchone()[0]
            status = conn.execute(
                f"SELECT status, count(*) FROM projection_docs WHERE {clause} GROUP BY status",
                args,
            ).fetchall()
            version = conn.execute(
                "SELECT workflow || '@' || coalesce(nullif(version, ''), substr(digest, 1, 19)), "
                f"count(*) FROM projection_docs WHERE {clause} GROUP BY 1",
                args,
            ).fetchall()
            listed: dict[str, dict[str, int]] = {}
            for name, key in (("failed_stage", "failed_stages"),
                              ("failure_class", "failure_classes")):  # fmt: skip
                # the body is canonical JSON: a text search skips the (most) runs whose list is
                # empty without parsing them
                listed[name] = dict(conn.execute(
                    f"SELECT j.value, count(*) FROM (SELECT body FROM projection_docs "
                    f"WHERE {clause} AND instr(body, '\"{key}\":[]') = 0) d, "
                    f"json_each(d.body, '$.{key}') j GROUP BY j.value",
                    args,
                ).fetchall())  # fmt: skip
            tenant = conn.execute(
                f"SELECT tenant, count(*) FROM projection_docs WHERE {clause} GROUP BY tenant",
                args,
            ).fetchall()
            return SearchResult(
                [json.loads(r[0]) for r in rows],
                int(total),
                {
                    "status": dict(status),
                    "version": dict(version),
                    **listed,
                    "tenant": dict(tenant),
                },
                *_marks(marks),
            )

        try:
            return await self.db.read(read, "projection search")
        except Exception as exc:
            if "fts5" in str(exc).lower():
                raise ValueError(f"search words {query.text!r}: {exc}") from exc
            raise

    async def run_ids(self, limit: int = 1000, after: str = "") -> list[str]:
        def read(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                "SELECT doc_id FROM projection_docs WHERE kind = 'run' AND doc_id > ? "
                "ORDER BY doc_id LIMIT ?",
                (after, limit),
            ).fetchall()
            return [r[0] for r in rows]

        return await self.db.read(read, "projection run ids")

    async def record_failures(self, failures: Sequence[FailedDocument]) -> None:
        def write(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO projection_failures (doc_id, run_id, error, attempts, failed_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (doc_id) DO UPDATE SET error = excluded.error,"
                " attempts = projection_failures.attempts + excluded.attempts,"
                " failed_at = excluded.failed_at",
                [(f.doc_id, f.run_id, f.error, f.attempts, f.failed_at_ms) for f in failures],
            )

        await self.db.write(write, "projection failures")

    async def failures(self, limit: int = 1000) -> list[FailedDocument]:
        def read(conn: sqlite3.Connection) -> list[FailedDocument]:
            rows = conn.execute(
                "SELECT doc_id, run_id, error, attempts, failed_at FROM projection_failures "
                "ORDER BY failed_at, doc_id LIMIT ?",
                (limit,),
            ).fetchall()
            return [FailedDocument(*r) for r in rows]

        return await self.db.read(read, "projection failures")

    async def clear_failures(self, doc_ids: Sequence[str]) -> None:
        def write(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "DELETE FROM projection_failures WHERE doc_id = ?", [(d,) for d in doc_ids]
            )

        await self.db.write(write, "projection clear failures")

    async def mark(self, indexed_through_ms: int, now_ms: int) -> None:
        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO projection_marks VALUES ('indexed_through_ms', ?) ON CONFLICT (name)"
                " DO UPDATE SET value = max(value, excluded.value)",
                (indexed_through_ms,),
            )
            conn.execute(
                "INSERT INTO projection_marks VALUES ('projected_at_ms', ?) ON CONFLICT (name)"
                " DO UPDATE SET value = excluded.value",
                (now_ms,),
            )

        await self.db.write(write, "projection mark", durable=False)

    async def reset(self) -> None:
        def write(conn: sqlite3.Connection) -> None:
            for table in ("projection_docs", "projection_words", "projection_failures",
                          "projection_marks"):  # fmt: skip
                conn.execute(f"DELETE FROM {table}")

        await self.db.write(write, "projection reset")

    async def close(self) -> None:
        await self.db.close()


def _doc(row: Sequence[Any]) -> Document:
    return Document(row[0], row[1], row[2], row[3], int(row[4]), json.loads(row[5]))


def _marks(marks: dict[str, int]) -> tuple[int, int]:
    return int(marks.get("indexed_through_ms", 0)), int(marks.get("projected_at_ms", 0))
