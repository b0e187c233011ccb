"""``audit.run-terminal@1``: one audit record per finished run (``.accord/audit.db``).

It runs as a finaliser, so its payload is the engine's ``{runId, workflow, intent, error}``; the
model comes from the run's context (through :attr:`PlatformConfig.load_run`). The record is keyed
by run id: a finaliser delivered twice writes one record and answers with the first one.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from accord.actions._sqlite import open_table_file
from accord.actions.cache import iso
from accord.actions.config import PlatformConfig
from accord.engine.runtime.actions import ActionContext

__all__ = ["AuditLog", "audit_run_terminal"]

_MODEL = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_STATES = {"completed": "completed", "failed": "failed", "cancelled": "cancelled"}


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS audit (run_id TEXT PRIMARY KEY, tenant TEXT NOT NULL,"
    " workflow TEXT NOT NULL, record TEXT NOT NULL, error TEXT)"
)


class AuditLog:
    def __init__(self, path: Path) -> None:
        self._db, self._lock = open_table_file(path, _SCHEMA)

    def record(
        self, run_id: str, tenant: str, workflow: str, record: dict[str, Any], error: Any
    ) -> dict[str, Any]:
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO audit VALUES (?, ?, ?, ?, ?)",
                (run_id, tenant, workflow, json.dumps(record), json.dumps(error)),
            )
            row = self._db.execute(
                "SELECT record FROM audit WHERE run_id = ?", (run_id,)
            ).fetchone()
        return dict(json.loads(row[0]))

    def rows(self) -> list[dict[str, Any]]:
        with self._lock:
            found = self._db.execute("SELECT record FROM audit ORDER BY rowid").fetchall()
        return [dict(json.loads(r[0])) for r in found]

    def close(self) -> None:
        with self._lock:
            self._db.close()


async def audit_run_terminal(
    config: PlatformConfig, log: AuditLog, payload: dict[str, Any], ctx: ActionContext
) -> dict[str, Any]:
    run_id = str(payload.get("runId") or ctx.run_id)
    run = await config.load_run(run_id) if config.load_run else None
    context = dict((run or {}).get("context", {}))
    model_id = str(payload.get("modelId") or context.get("modelId") or "unknown")
    state = _STATES.get(str(payload.get("intent") or payload.get("terminalState")), "failed")
    record = {
        "auditId": f"audit_{run_id}"[:128],
        "modelId": model_id if _MODEL.match(model_id) else "unknown",
        "terminalState": state,
        "recordedAt": iso(config.cache.now_ms()),
    }
    workflow = str(payload.get("workflow", ""))
    return await asyncio.to_thread(
        log.record, run_id, ctx.tenant, workflow, record, payload.get("error")
    )
