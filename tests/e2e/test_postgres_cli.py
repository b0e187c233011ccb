"""PostgreSQL from the command line: `accord store migrate` and `accord demo --store postgresql://…`.

``migrate`` creates a fresh schema at the code's version, is a no-op the second time, and refuses
a schema a newer accord migrated (and an unreachable server) with exit 1 and one JSON document.
The demo runs each model through the reference workers with the store and the queue in one
PostgreSQL schema (no ``--transport``: the store's URL names both), read back here.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import psycopg
import pytest
from tests.e2e.test_demo import scratch  # noqa: F401 - the scratch repository fixture
from tests.services import postgres_url
from typer.testing import CliRunner

from accord.adapters import open_store
from accord.adapters.stores.postgres._db import parse_url
from accord.adapters.stores.postgres._schema import SCHEMA_VERSION
from accord.cli import app
from accord.engine.machine.state import HistoryEntry, RunState


def _migrate(url: str) -> tuple[int, dict[str, object]]:
    result = CliRunner().invoke(app, ["store", "migrate", "--store", url, "--json"])
    return result.exit_code, json.loads(result.output)


def test_migrate_applies_once_and_refuses_a_newer_schema() -> None:
    url = postgres_url()
    code, report = _migrate(url)
    assert code == 0, report
    assert (report["version_before"], report["version"]) == (0, SCHEMA_VERSION)
    assert report["applied"] == list(range(1, SCHEMA_VERSION + 1))
    code, report = _migrate(url)
    assert (code, report["applied"], report["version_before"]) == (0, [], SCHEMA_VERSION)

    target = parse_url(url)
    with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{target.schema}".accord_schema (version) VALUES (%s)',
            (SCHEMA_VERSION + 1,),
        )
    code, report = _migrate(url)
    assert code == 1 and report["ok"] is False
    assert f"version {SCHEMA_VERSION + 1}, newer than this accord knows" in str(report["error"])
    # the store refuses it too, before touching anything
    with pytest.raises(Exception, match="newer than this accord knows"):
        asyncio.run(_load(url))


async def _load(url: str) -> None:
    store = open_store(url)
    try:
        await store.load("r1")
    finally:
        await store.close()


def test_migrate_names_an_unreachable_server_and_a_bad_schema_name() -> None:
    code, report = _migrate("postgresql://postgres@127.0.0.1:1/test?schema=t_nowhere")
    assert code == 1 and "postgresql migrate failed" in str(report["error"])
    code, report = _migrate("postgresql://postgres@127.0.0.1/test?schema=Bad-Name")
    assert code == 1 and "option schema='Bad-Name'" in str(report["error"])
    result = CliRunner().invoke(app, ["store", "migrate", "--store", "sqlite:///x.db"])
    assert result.exit_code == 0 and "nothing to migrate" in result.output


async def _recorded(url: str, run_id: str) -> tuple[RunState, list[HistoryEntry]]:
    store = open_store(url)
    try:
        stored = await store.load(run_id)
        assert stored is not None, f"run {run_id} is not in {url}"
        history = [HistoryEntry.from_json(h) for h in await store.history(run_id)]
        return RunState.from_json(stored.state), history
    finally:
        await store.close()


@pytest.mark.node  # the contract phase generates the TypeScript bindings too
@pytest.mark.slow
def test_the_demo_runs_on_postgresql(scratch: Path) -> None:  # noqa: F811
    url = postgres_url()
    args = ["demo", "--models", str(scratch / "models"), "--state", str(scratch / "state"),
            "--store", url, "--json"]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output[result.output.index("[") :])
    assert sorted(r["modelId"] for r in rows) == ["cube", "plate-with-hole"]
    for row in rows:
        assert row["status"] == "completed" and row["route"] == "workers", row
        run, history = asyncio.run(_recorded(url, row["runId"]))
        assert run.status == "completed"
        kinds = {(h.event.get("kind"), h.event.get("stage")) for h in history if h.accepted}
        for stage in ("render-thumbnail", "semantic-analysis", "technical-metadata"):
            assert ("stage-accepted", stage) in kinds, f"{stage} was not served by a worker"
    assert not (scratch / "state" / "accord.db").exists()  # nothing went to the SQLite default
