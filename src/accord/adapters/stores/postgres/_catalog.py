"""The PostgreSQL store's catalogue side: run search, plans and capability announcements.

The same rules as the SQLite catalogue (:mod:`accord.adapters.stores.sqlite_catalog`): plans are
immutable, activations an append-only log per workflow (the newest row is active), an
announcement replaces the worker's previous set.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from accord.adapters import _store_rules as rules
from accord.adapters.stores.postgres._db import Database
from accord.engine.ports import Clock, StoredRun
from accord.errors import ImmutableArtefactError, StoreError

__all__ = ["PostgresCatalog", "run_filters"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def run_filters(filters: Mapping[str, str]) -> tuple[str, list[str]]:
    """``WHERE`` clause (``$1``… placeholders) and parameters for ``list_runs`` filters; names
    are checked identifiers, values always parameters."""
    clauses, params = [], []
    for key, value in sorted(filters.items()):
        if not _NAME.match(key):
            raise StoreError(
                f"list_runs filter {key!r} is not an identifier ([A-Za-z_][A-Za-z0-9_]*)"
            )
        params.append(value)
        if key in rules.COLUMNS:
            clauses.append(f"{key} = ${len(params)}")
        else:
            params.append(key)
            clauses.append(f"labels ->> ${len(params)} = ${len(params) - 1}")
    return ("WHERE " + " AND ".join(clauses)) if clauses else "", params


class PostgresCatalog:
    """Mixed into :class:`~accord.adapters.stores.postgres.PostgresStore`."""

    db: Database
    clock: Clock

    async def list_runs(self, limit: int = 100, **filters: str) -> list[StoredRun]:
        where, params = run_filters(filters)
        sql = (
            f"SELECT run_id, version, state FROM accord_runs {where}"
            f" ORDER BY updated_at DESC, run_id LIMIT ${len(params) + 1}"
        )
        async with self.db.connection("list_runs") as conn:
            rows = await conn.fetch(sql, *params, limit)
        return [StoredRun(r[0], r[1], json.loads(r[2])) for r in rows]

    async def put_plan(self, digest: str, document: dict[str, Any]) -> None:
        text = rules.dump(document, "plan")
        async with self.db.connection("put_plan") as conn:
            stored = await conn.fetchval(
                "WITH i AS (INSERT INTO accord_plans VALUES ($1, $2, $3)"
                " ON CONFLICT (digest) DO NOTHING RETURNING document)"
                " SELECT document FROM i UNION ALL"
                " SELECT document FROM accord_plans WHERE digest = $1 LIMIT 1",
                digest, text, self.clock.now_ms(),
            )  # fmt: skip
        if stored != text:
            raise ImmutableArtefactError(rules.plan_changed(digest))

    async def get_plan(self, digest: str) -> dict[str, Any] | None:
        async with self.db.connection("get_plan") as conn:
            text = await conn.fetchval(
                "SELECT document FROM accord_plans WHERE digest = $1", digest
            )
        return None if text is None else dict(json.loads(text))

    async def set_active(self, workflow: str, digest: str) -> None:
        async with self.db.connection("set_active") as conn:
            done = await conn.fetchval(
                "WITH i AS (INSERT INTO accord_activations (workflow, digest, activated_at)"
                " SELECT $1, $2, $3 WHERE EXISTS (SELECT FROM accord_plans WHERE digest = $2)"
                " RETURNING id) SELECT count(*) FROM i",
                workflow, digest, self.clock.now_ms(),
            )  # fmt: skip
        if not done:
            raise StoreError(rules.unknown_plan(workflow, digest))

    async def get_active(self, workflow: str) -> str | None:
        versions = await self._activations(workflow, latest_only=True)
        return versions[-1]["digest"] if versions else None

    async def plan_versions(self, workflow: str) -> list[dict[str, Any]]:
        """Every activation of ``workflow``, oldest first (see ``SqliteStore.plan_versions``)."""
        return await self._activations(workflow, latest_only=False)

    async def _activations(self, workflow: str, *, latest_only: bool) -> list[dict[str, Any]]:
        sql = (
            "SELECT digest, activated_at FROM accord_activations WHERE workflow = $1"
            " ORDER BY id DESC" + (" LIMIT 1" if latest_only else "")
        )
        async with self.db.connection("plan_versions") as conn:
            rows = await conn.fetch(sql, workflow)
        return rules.activation_rows([(r[0], r[1]) for r in reversed(rows)])

    async def announce(
        self, worker_id: str, capabilities: Sequence[str], expires_at_ms: int
    ) -> None:
        caps = list(dict.fromkeys(capabilities))
        async with self.db.connection("announce") as conn, conn.transaction():
            await conn.execute("DELETE FROM accord_capabilities WHERE worker_id = $1", worker_id)
            await conn.execute(
                "INSERT INTO accord_capabilities SELECT $1, c, $3 FROM unnest($2::text[]) AS c",
                worker_id, caps, expires_at_ms,
            )  # fmt: skip

    async def live_capabilities(self, now_ms: int) -> dict[str, list[str]]:
        async with self.db.connection("live_capabilities") as conn:
            rows = await conn.fetch(
                "SELECT capability, worker_id FROM accord_capabilities WHERE expires_at > $1"
                " ORDER BY capability, worker_id",
                now_ms,
            )
        live: dict[str, list[str]] = {}
        for capability, worker in rows:
            live.setdefault(capability, []).append(worker)
        return live
