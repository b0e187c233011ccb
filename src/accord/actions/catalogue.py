"""``catalogue.publish@2``: the model catalogue, an SQLite table (``.accord/catalogue.db``).

One row per ``(tenant, modelId)``. Publishing is idempotent on the envelope's idempotency key: a
duplicate delivery of the same publish (a republished outbox entry, a retried attempt) finds its
key recorded and returns the stored entry unchanged — same entry, one row. A later run of the
same model (a new key) updates that row and bumps its revision. Each row records what produced
it: the capability, the pinned contract versions of the run, the plan digest, and the listing
policy applied (``marketplace-listing-limits@1``) with its digest.

The entry's tags and format come from the run's derived results in the stage result cache (the
semantic analysis and technical metadata), read through the same keys the lookup uses, and are
trimmed to the policy's limits; an entry is ``listed`` only when it is not private and its format
is one the policy allows, else a ``draft``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from accord.actions._sqlite import open_table_file
from accord.actions.cache import iso
from accord.actions.config import PlatformConfig
from accord.actions.lookup import keys_for
from accord.canonical import digest_of
from accord.engine.runtime.actions import ActionContext

__all__ = ["POLICY", "Catalogue", "catalogue_publish"]

POLICY = "marketplace-listing-limits@1"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS catalogue (
    tenant TEXT NOT NULL, model_id TEXT NOT NULL, entry_id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL, revision INTEGER NOT NULL, entry TEXT NOT NULL,
    produced_by TEXT NOT NULL, PRIMARY KEY (tenant, model_id));
"""


class Catalogue:
    def __init__(self, path: Path) -> None:
        self._db, self._lock = open_table_file(path, _SCHEMA)

    def publish(
        self, tenant: str, key: str, entry: dict[str, Any], produced_by: dict[str, Any]
    ) -> dict[str, Any]:
        """Write ``entry`` unless ``key`` was already published; the entry now stored."""
        model_id = entry["modelId"]
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(
                    "SELECT idempotency_key, revision, entry FROM catalogue "
                    "WHERE tenant = ? AND model_id = ?",
                    (tenant, model_id),
                ).fetchone()
                if row is not None and row[0] == key:
                    self._db.execute("COMMIT")
                    return dict(json.loads(row[2]))
                revision = 1 if row is None else int(row[1]) + 1
                self._db.execute(
                    "INSERT INTO catalogue VALUES (?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (tenant, model_id) DO UPDATE SET idempotency_key = excluded."
                    "idempotency_key, revision = excluded.revision, entry = excluded.entry, "
                    "produced_by = excluded.produced_by",
                    (tenant, model_id, entry["entryId"], key, revision, json.dumps(entry),
                     json.dumps(produced_by, sort_keys=True)),
                )  # fmt: skip
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return entry

    def rows(self, tenant: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT tenant, model_id, revision, entry, produced_by FROM catalogue"
        args: tuple[str, ...] = ()
        if tenant is not None:
            sql, args = sql + " WHERE tenant = ?", (tenant,)
        with self._lock:
            found = self._db.execute(sql + " ORDER BY tenant, model_id", args).fetchall()
        return [
            {"tenant": t, "modelId": m, "revision": r, "entry": json.loads(e),
             "producedBy": json.loads(p)}
            for t, m, r, e, p in found
        ]  # fmt: skip

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _derived(config: PlatformConfig, tenant: str, model_id: str) -> dict[str, dict[str, Any]]:
    """The cached derived results of the model, by result contract (blocking)."""
    path = config.model_path(tenant, model_id)
    if path is None:
        return {}
    keys = keys_for(config, tenant, model_id, config.input_digest(path))
    reads = [config.cache.get(k, tenant) for k in keys.values()]
    return {r.contract: r.value for r in reads if r.hit and r.value is not None}


async def catalogue_publish(
    config: PlatformConfig, catalogue: Catalogue, payload: dict[str, Any], ctx: ActionContext
) -> dict[str, Any]:
    model_id, tenant = str(payload["modelId"]), ctx.tenant
    rules = _rules(config)
    derived = await asyncio.to_thread(_derived, config, tenant, model_id)
    analysis = derived.get("semantic-analysis@1", {})
    metadata = derived.get("technical-metadata@1", {})
    max_tags, tag_len = int(rules.get("maxTags", 20)), int(rules.get("tagMaxLength", 40))
    tags = [str(t["label"])[:tag_len] for t in analysis.get("tags", [])][:max_tags]
    visibility = str(payload.get("visibility", "private"))
    listable = metadata.get("format") in set(rules.get("allowedFormats", ()))
    run = await config.load_run(ctx.run_id) if config.load_run else None
    entry = {
        "entryId": f"cat_{digest_of([tenant, model_id])[7:31]}",
        "modelId": model_id,
        "status": "listed" if visibility != "private" and listable else "draft",
        "visibility": visibility,
        "publishedAt": iso(config.cache.now_ms()),
        "policy": POLICY,
        "tags": tags,
    }
    produced_by = {
        "capability": ctx.capability,
        "runId": ctx.run_id,
        "plan": ctx.envelope.get("definitionDigest"),
        "contracts": dict((run or {}).get("contracts", {})),
        "policy": POLICY,
        "policyDigest": config.catalog.digest(POLICY) if config.catalog else None,
        "derivedFrom": sorted(derived),
    }
    stored = await asyncio.to_thread(
        catalogue.publish, tenant, ctx.idempotency_key, entry, produced_by
    )
    return stored


def _rules(config: PlatformConfig) -> dict[str, Any]:
    policy = config.catalog.policy(POLICY) if config.catalog else None
    return dict(policy.rules) if policy else {}
