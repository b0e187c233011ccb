"""Alert rules over a real engine (SQLite store and queue): a stage queued for a capability that
no live worker announces raises ``no-live-worker`` naming the capability and the waiting run,
counted up when raised again and resolved once a worker announces it; a run reporting
divergence raises ``divergence-found`` and starts the reconciler, whose pass is recorded on the
alert. ``accord alerts list --json`` and ``GET /v1/alerts`` (a viewer key) show the records; a bad
``state`` is a 422 naming the field, no key a 401."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import uvicorn
from test_api_support import IDLE, catalog, plan
from typer.testing import CliRunner

from accord.adapters import open_engine
from accord.adapters.ingress.app import create_app
from accord.adapters.ingress.control import ControlStore
from accord.adapters.telemetry.alerts import AlertBook, Alerting, AlertRules
from accord.cli import app
from accord.engine.machine.effects import EmitTelemetry
from accord.engine.runtime.orchestrator import Delivered, EngineOptions


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def test_alerts_are_raised_acted_on_resolved_and_shown(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'accord.db'}"
    engine = open_engine(url, url, options=EngineOptions(poll_ms=10), catalog=catalog())
    book = AlertBook(tmp_path / "state" / "alerts.db")
    alerting = Alerting(engine, book, AlertRules(queued_ms=0))
    idle = plan("alerting", IDLE)
    await engine.register_plan(idle)
    await engine.start()
    try:
        run_id = await engine.start_run("alerting", {"modelId": "m1"}, tenant="acme")
        async with asyncio.timeout(10):
            while not (await alerting.evaluate()):
                await asyncio.sleep(0.05)
        first = book.get("no-live-worker:test.work@1")
        assert first is not None and first.state == "open", book.list()
        assert first.runs == [run_id] and "no live worker" in first.detail
        await alerting.evaluate()
        again = book.get("no-live-worker:test.work@1")
        assert again is not None and again.count == 2
        await engine.announce("w1", ["test.work@1"], 60_000)
        assert await alerting.evaluate() == []
        resolved = book.get("no-live-worker:test.work@1")
        assert resolved is not None and resolved.state == "resolved"

        # a run that reports divergence: the alert starts a reconcile pass and records it
        run = await engine.load(run_id)
        effect = EmitTelemetry(event_id="x", name="run.needs-reconciliation", attributes={})
        alerting(Delivered(run_id, 1, run, (effect,), ()))
        raised = await alerting.evaluate()
        assert [a.alert_id for a in raised] == ["divergence-found:alerting"]
        diverged = book.get("divergence-found:alerting")
        assert diverged is not None and diverged.runs == [run_id]
        assert diverged.action.startswith("reconcile: ") and "runs checked" in diverged.action

        control = ControlStore(tmp_path / "control.db")
        application = create_app(engine, control, catalog=catalog())
        application.state.alerts = book
        server = _Server(uvicorn.Config(application, host="127.0.0.1", port=0, lifespan="off",
                                        log_level="warning", access_log=False))  # fmt: skip
        serve = asyncio.get_running_loop().create_task(server.serve())
        try:
            async with asyncio.timeout(10):
                while not server.started:
                    await asyncio.sleep(0.01)
            base = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
            key = control.create_key("viewer", ["acme"])[0]
            auth = {"Authorization": f"Bearer {key}"}
            async with httpx.AsyncClient(base_url=base, timeout=30) as client:
                shown = await client.get("/v1/alerts", headers=auth)
                opened = await client.get("/v1/alerts?state=open", headers=auth)
                bad = await client.get("/v1/alerts?state=bogus", headers=auth)
                anonymous = await client.get("/v1/alerts")
        finally:
            server.should_exit = True
            await asyncio.wait_for(serve, 15)
            control.close()
        assert shown.status_code == 200, shown.text
        ids = [a["alert_id"] for a in shown.json()["alerts"]]
        assert set(ids) == {"no-live-worker:test.work@1", "divergence-found:alerting"}
        assert shown.json()["evaluating"] is True
        assert [a["alert_id"] for a in opened.json()["alerts"]] == ["divergence-found:alerting"]
        assert bad.status_code == 422 and "state" in bad.text
        assert anonymous.status_code == 401
    finally:
        await engine.stop()
    listed = await asyncio.to_thread(
        CliRunner().invoke, app, ["alerts", "list", "--alerts", str(book_path(tmp_path)), "--json"]
    )
    book.close()
    assert listed.exit_code == 0, listed.output
    doc = json.loads(listed.output)
    assert {a["rule"] for a in doc["alerts"]} == {"no-live-worker", "divergence-found"}
    missing = CliRunner().invoke(app, ["alerts", "list", "--alerts", str(tmp_path / "no.db"),
                                       "--json"])  # fmt: skip
    assert missing.exit_code == 2 and json.loads(missing.output)["ok"] is False


def book_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "alerts.db"
