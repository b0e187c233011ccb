"""`accord triggers list|next|pause|resume|fires` and the same over the API's schedule routes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tests.integration._triggers_kit import MESSAGE, WEBHOOK, plan, schedule
from typer.testing import CliRunner

from accord.adapters import open_store
from accord.cli import app
from accord.engine.runtime.plans import PlanBook
from accord.engine.runtime.schedules import schedule_state

runner = CliRunner()


async def _register(tmp: Path) -> str:
    url = f"sqlite:///{tmp / 'cli.db'}"
    store = open_store(url)
    try:
        triggers = "\n".join(
            [schedule(name="nightly", cron="30 2 * * *", tz="Europe/Berlin"), WEBHOOK,
             MESSAGE.replace("{queue}", "uploads")]
        )  # fmt: skip
        await PlanBook(store).register(plan(triggers, name="clied"))
    finally:
        await store.close()
    return url


def _store_with_plan(tmp: Path) -> str:
    return asyncio.run(_register(tmp))


def _json(args: list[str]) -> tuple[int, dict[str, object]]:
    result = runner.invoke(app, [*args, "--json"])
    return result.exit_code, json.loads(result.stdout)


def test_list_next_pause_resume_and_fires(tmp_path: Path) -> None:
    url = _store_with_plan(tmp_path)
    code, doc = _json(["triggers", "list", "clied", "--store", url])
    assert code == 0, doc
    items = doc["triggers"]
    assert isinstance(items, list)
    assert [t["type"] for t in items] == ["schedule", "webhook", "message"]
    assert len(items[0]["next"]) == 5 and items[0]["paused"] is False

    code, doc = _json(["triggers", "next", "clied", "nightly", "--store", url, "--count", "3"])
    assert code == 0 and isinstance(doc["next"], list) and len(doc["next"]) == 3
    assert all(str(x["local"]).startswith(str(x["local"])[:10]) for x in doc["next"])
    assert all(
        "T02:30:00" in str(x["local"]) or "T03:00:00" in str(x["local"]) for x in doc["next"]
    )

    code, doc = _json(["triggers", "pause", "clied", "nightly", "--store", url])
    assert code == 0 and doc["state"]["paused"] is True  # type: ignore[index]

    async def read() -> object:
        store = open_store(url)
        try:
            return await schedule_state(store, "clied", "nightly")
        finally:
            await store.close()

    state = asyncio.run(read())
    assert isinstance(state, dict) and state["paused"] is True
    code, doc = _json(["triggers", "list", "clied", "--store", url])
    assert doc["triggers"][0]["paused"] is True and doc["triggers"][0]["next"] == []  # type: ignore[index]
    code, doc = _json(["triggers", "resume", "clied", "nightly", "--store", url])
    assert code == 0 and doc["state"]["paused"] is False  # type: ignore[index]
    code, doc = _json(["triggers", "fires", "clied", "nightly", "--store", url])
    assert code == 0 and doc["fires"] == []


def test_refusals_are_one_json_document_with_an_exit_code(tmp_path: Path) -> None:
    url = _store_with_plan(tmp_path)
    code, doc = _json(["triggers", "next", "clied", "upload-webhook", "--store", url])
    assert code == 1 and doc["ok"] is False and "no schedule trigger" in str(doc["error"])
    code, doc = _json(["triggers", "list", "missing", "--store", url])
    assert code == 1 and "no active plan" in str(doc["error"])
    code, doc = _json(["triggers", "list", "clied", "--store", "nope://x"])
    assert code == 2 and doc["ok"] is False
    human = runner.invoke(app, ["triggers", "pause", "clied", "nope", "--store", url])
    assert human.exit_code == 1 and "Traceback" not in human.output


def test_records_of_other_kinds_are_not_listed_as_runs(tmp_path: Path) -> None:
    """A schedule's fire records share the store with runs; `accord runs list` shows runs only."""
    from accord.engine.ports import Commit

    url = f"sqlite:///{tmp_path / 'accord.db'}"

    async def put() -> None:
        store = open_store(url)
        try:
            await store.commit(
                Commit(
                    "fire-1",
                    0,
                    {"kind": "schedule-fire", "workflow": "w", "trigger": "t"},
                    index={"status": "schedule-fire", "workflow": "w", "trigger": "t"},
                )
            )
            assert [s.run_id for s in await store.list_runs(10)] == ["fire-1"]
        finally:
            await store.close()

    asyncio.run(put())
    done = CliRunner().invoke(app, ["runs", "list", "--store", url, "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output) == []
