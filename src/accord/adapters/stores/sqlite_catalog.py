"""The SQLite store's catalogue side: run search, plans and capability announcements.

Separate from :mod:`accord.adapters.stores.sqlite` (the transition path) because none of it is on
the hot path. Plans are immutable: storing a digest again with the same canonical text is a no-op,
with different text an :class:`~accord.errors.ImmutableArtefactError`. Activations are an
append-only log per workflow; the newest row is the active plan. An announcement replaces the
worker's previous set; :meth:`live_capabilities` ignores expired rows.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from accord.adapters import _store_rules as rules
from accord.adapters._sqlite import Database
from accord.engine.ports import Clock, StoredRun
from accord.errors import ImmutableArtefactError, StoreError

__all__ = ["SqliteCatalog"]


class SqliteCatalog:
    """Mixed into :class:`~accord.adapters.stores.sqlite.SqliteStore`."""

    db: Database
    clock: Clock

    async def list_runs(self, limit: int = 100, **filters: str) -> list[StoredRun]:
        where, params = rules.run_filters_sql(filters)
        sql = (
            f"SELECT run_id, version, state FROM accord_runs {where}"
            " ORDER BY updated_at DESC, run_id LIMIT ?"
        )

        def read(conn: sqlite3.Connection) -> list[StoredRun]:
            rows = conn.execute(sql, (*params, limit))
            return [StoredRun(r[0], r[1], json.loads(r[2])) for r in rows]

        return await self.db.read(read, "list_runs")

    async def put_plan(self, digest: str, document: dict[str, Any]) -> None:
        text = rules.dump(document, "plan")
        now = self.clock.now_ms()

        def put(conn: sqlite3.Connection) -> None:
            row = conn.execute(
                "SELECT document FROM accord_plans WHERE digest = ?", (digest,)
            ).fetchone()
            if row is None:
                conn.execute("INSERT INTO accord_plans VALUES (?, ?, ?)", (digest, text, now))
            elif row[0] != text:
                raise ImmutableArtefactError(rules.plan_changed(digest))

        await self.db.write(put, "put_plan")

    async def get_plan(self, digest: str) -> dict[str, Any] | None:
        def read(conn: sqlite3.Connection) -> dict[str, Any] | None:
            row = conn.execute(
                "SELECT document FROM accord_plans WHERE digest = ?", (digest,)
            ).fetchone()
            return None if row is None else dict(json.loads(row[0]))

        return await self.db.read(read, "get_plan")

    async def set_active(self, workflow: str, digest: str) -> None:
        now = self.clock.now_ms()

        def activate(conn: sqlite3.Connection) -> None:
            if conn.execute("SELECT 1 FROM accord_plans WHERE digest = ?", (digest,)).fetchone():
                conn.execute(
                    "INSERT INTO accord_activations (workflow, digest, activated_at)"
                    " VALUES (?, ?, ?)",
                    (workflow, digest, now),
                )
            else:
                raise StoreError(rules.unknown_plan(workflow, digest))

        await self.db.write(activate, "set_active")

    async def get_active(self, workflow: str) -> str | None:
        versions = await self._activations(workflow, latest_only=True)
        return versions[-1]["digest"] if versions else None

    async def plan_versions(self, workflow: str) -> list[dict[str, Any]]:
        """Every activation of ``workflow``, oldest first: ``digest``, ``activated_at_ms``,
        ``active`` (true on the newest only)."""
        return await self._activations(workflow, latest_only=False)

    async def _activations(self, workflow: str, *, latest_only: bool) -> list[dict[str, Any]]:
        sql = (
            "SELECT digest, activated_at FROM accord_activations WHERE workflow = ?"
            " ORDER BY id DESC" + (" LIMIT 1" if latest_only else "")
        )

        def read(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            rows = conn.execute(sql, (workflow,)).fetchall()
            return rules.activation_rows([(r[0], r[1]) for r in reversed(rows)])

        return await self.db.read(read, "plan_versions")

    async def announce(
        self, worker_id: str, capabilities: Sequence[str], expires_at_ms: int
    ) -> None:
        rows = [(worker_id, c, expires_at_ms) for c in dict.fromkeys(capabilities)]

        def put(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM accord_capabilities WHERE worker_id = ?", (worker_id,))
            conn.executemany("INSERT INTO accord_capabilities VALUES (?, ?, ?)", rows)

        await self.db.write(put, "announce")

    async def live_capabilities(self, now_ms: int) -> dict[str, list[str]]:
        def read(conn: sqlite3.Connection) -> dict[str, list[str]]:
            rows = conn.execute(
                "SELECT capability, worker_id FROM accord_capabilities WHERE expires_at > ?"
                " ORDER BY capability, worker_id",
                (now_ms,),
            )
            live: dict[str, list[str]] = {}
            for capability, worker in rows:
                live.setdefault(capability, []).append(worker)
            return live

        return await self.db.read(read, "live_capabilities")
