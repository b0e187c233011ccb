"""Alerts evaluated continuously by a real `accord engine run` process, and its `/metrics`.

The engine runs as its own process with ``--alert-rules every=200ms,queued=300ms`` and ``--metrics
127.0.0.1:0``. A run request is published for a workflow whose one stage is served by a capability
a worker announces; once the run has started the worker withdraws, the stage waits in its queue
with no live worker, and the engine's periodic evaluation raises ``no-live-worker`` by itself —
logged once (one line) however many evaluations find it again, open in ``STATE/alerts.db`` with its
since-when, counted on the engine's ``/metrics`` over a real socket (``accord_alerts_open``,
``accord_alert_transitions_total``, with the engine's own dispatch counter and the projector's lag
beside them, under bounded labels only). A worker announcing the capability resolves it: one more
line, the gauge back to 0, a ``resolved`` transition. ``accord serve --no-engine`` on the same
state folder shows the record on ``GET /v1/alerts``. A bad ``--alert-rules``, ``--metrics`` or
``--trace-sample`` is exit 2 naming the option. Engines sharing a book resolve only the alerts they
raised last (another may still see what it dispatched waiting) or whose owner has not raised them
for three evaluation periods, and a book written before alerts had owners is taken as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from test_api_support import IDLE, plan
from typer.testing import CliRunner

from accord.adapters import open_engine, open_store, open_transport
from accord.adapters.clock import SystemClock
from accord.adapters.telemetry.alerts import Alert, AlertBook, Alerting, AlertRules
from accord.adapters.telemetry.metrics import LABELS
from accord.cli import app
from accord.engine.machine.effects import EmitTelemetry
from accord.engine.runtime.orchestrator import Delivered, Engine, EngineOptions
from accord.engine.runtime.requests import RUNS_QUEUE, request_message_id, request_run_id

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = ROOT / "schemas" / "contracts"
ACCORD = Path(sys.executable).parent / "accord"
CAPABILITY = "test.work@1"
ALERT = f"no-live-worker:{CAPABILITY}"


def _env() -> dict[str, str]:
    return os.environ | {"PYTHONUNBUFFERED": "1", "COLUMNS": "200"}


@contextlib.asynccontextmanager
async def _control(url: str) -> AsyncIterator[Engine]:
    """An engine handle on the store that dispatches nothing: to register plans and announce."""
    clock = SystemClock()
    engine = Engine(open_store(url, clock=clock), open_transport(url, clock=clock), clock,
                    options=EngineOptions(dispatch=False), owns_ports=True)  # fmt: skip
    try:
        yield engine
    finally:
        await engine.stop()


@contextlib.asynccontextmanager
async def _process(cwd: Path, name: str, *args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    log = (cwd / f"{name}.log").open("ab")
    proc = await asyncio.create_subprocess_exec(
        str(ACCORD), *args, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=log, env=_env()
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 30)
        log.close()
        assert code == 0, f"{name} exited {code}: {(cwd / f'{name}.log').read_text()[-3000:]}"


async def _line(proc: asyncio.subprocess.Process, starts: str, cwd: Path, name: str) -> str:
    assert proc.stdout is not None
    async with asyncio.timeout(60):
        while True:
            line = (await proc.stdout.readline()).decode()
            assert line, f"{name} ended: {(cwd / f'{name}.log').read_text()[-3000:]}"
            if starts in line:
                return line


async def _alert(book: Path, state: str, timeout_s: float = 20) -> Alert:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if book.is_file():
            opened = AlertBook(book)
            try:
                found = opened.get(ALERT)
            finally:
                opened.close()
            if found is not None and found.state == state and (state != "open" or found.count >= 3):
                return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"{ALERT} not {state} within {timeout_s}s: {book}")


async def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with httpx.AsyncClient(timeout=10) as client:
        got = await client.get(url)
        missing = await client.get(url.replace("/metrics", "/nothing"))
    assert got.status_code == 200 and got.headers["content-type"].startswith("text/plain")
    assert missing.status_code == 404
    out = {}
    for family in text_string_to_metric_families(got.text):
        for s in family.samples:
            assert set(s.labels) - {"le"} <= LABELS, (s.name, s.labels)
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if v))
            out[(s.name, labels)] = s.value
    return out


async def _published(url: str, tenant: str, key: str) -> None:
    body = {"workflow": "alerting", "context": {"modelId": "m1"}, "tenant": tenant,
            "idempotencyKey": key, "requester": "cli:test",
            "requestedAt": "2026-01-01T00:00:00.000Z"}  # fmt: skip
    transport = open_transport(url)
    try:
        await transport.publish(RUNS_QUEUE, request_message_id(tenant, key),
                                json.dumps(body, sort_keys=True).encode())  # fmt: skip
    finally:
        await transport.close()


async def test_a_real_engine_raises_logs_counts_and_resolves_an_alert(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'accord.db'}"
    state = tmp_path / "state"
    async with _control(url) as control:
        await control.register_plan(plan("alerting", IDLE))
        await control.announce("brief", [CAPABILITY], 600_000)  # admission admits the run
    args = ["engine", "run", "--store", url, "--transport", url, "--no-platform",
            "--contracts", str(CONTRACTS), "--state", str(state), "--poll-ms", "20",
            "--alert-rules", "every=200ms,queued=300ms", "--metrics", "127.0.0.1:0"]  # fmt: skip
    async with _process(tmp_path, "engine", *args) as engine:
        metrics_url = (await _line(engine, "metrics on ", tmp_path, "engine")).split()[2]
        assert metrics_url.startswith("http://127.0.0.1:"), metrics_url
        await _line(engine, "running on", tmp_path, "engine")
        await _published(url, "acme", "alert-1")
        run_id = request_run_id("acme", "alert-1")
        async with _control(url) as control:
            async with asyncio.timeout(30):
                while await control.store.load(run_id) is None:
                    await asyncio.sleep(0.02)
            await control.announce("brief", [], 1)  # the worker goes away: its stage waits
        opened = await _alert(state / "alerts.db", "open")  # found by three evaluations or more
        assert opened.runs == [run_id] and "no live worker" in opened.detail
        assert opened.to_json()["since_ms"] == opened.first_at_ms and opened.to_json()["since"]
        figures = await _metrics(metrics_url)
        assert figures[("accord_alerts_open", (("rule", "no-live-worker"),))] == 1
        firing = (("outcome", "firing"), ("rule", "no-live-worker"))
        assert figures[("accord_alert_transitions_total", firing)] == 1
        dispatched = (("capability", CAPABILITY), ("stage", "work"), ("version", "1.0.0"),
                      ("workflow", "alerting"))  # fmt: skip
        assert figures[("accord_stage_dispatches_total", dispatched)] == 1
        assert ("accord_projector_lag_seconds", ()) in figures  # the projector beside the store
        assert not any(run_id in v or "acme" in v for _, lb in figures for _, v in lb)

        async with _control(url) as control:
            await control.announce("worker-1", [CAPABILITY], 600_000)
        resolved = await _alert(state / "alerts.db", "resolved")
        assert resolved.since_ms == resolved.last_at_ms >= opened.first_at_ms
        figures = await _metrics(metrics_url)
        assert figures[("accord_alerts_open", (("rule", "no-live-worker"),))] == 0
        gone = (("outcome", "resolved"), ("rule", "no-live-worker"))
        assert figures[("accord_alert_transitions_total", gone)] == 1
        assert figures[("accord_alert_transitions_total", firing)] == 1

        # the API beside the engine shows the same record, with its since-when
        code, out, err = await _accord(tmp_path, "keys", "create", "--role", "viewer",
                                       "--tenant", "acme", "--store", url, "--json")  # fmt: skip
        assert code == 0, err
        key = json.loads(out)["key"]
        api_args = ["serve", "--no-engine", "--port", "0", "--store", url, "--transport", url,
                    "--contracts", str(CONTRACTS), "--state", str(state),
                    "--no-platform"]  # fmt: skip
        async with _process(tmp_path, "serve", *api_args) as server:
            base = (await _line(server, "serving on ", tmp_path, "serve")).split()[2]
            async with httpx.AsyncClient(base_url=base, timeout=30) as client:
                shown = await client.get("/v1/alerts",
                                         headers={"Authorization": f"Bearer {key}"})  # fmt: skip
        assert shown.status_code == 200, shown.text
        [record] = shown.json()["alerts"]
        assert record["alert_id"] == ALERT and record["state"] == "resolved"
        assert record["since_ms"] == resolved.last_at_ms and shown.json()["evaluating"] is True
    log = (tmp_path / "engine.log").read_text()
    assert log.count(f"alert firing: {ALERT}: ") == 1, log
    assert log.count(f"alert resolved: {ALERT} (open since ") == 1, log


async def _accord(cwd: Path, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        str(ACCORD), *args, cwd=cwd, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=_env(),
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def test_bad_alert_rules_and_metrics_options_are_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'accord.db'}"
    base = ["engine", "run", "--store", url, "--transport", url, "--no-platform"]
    for option, value, named in (("--alert-rules", "every=soon", "every=soon"),
                                 ("--alert-rules", "often=1s", "often=1s"),
                                 ("--metrics", "localhost:http", "HOST:PORT")):  # fmt: skip
        got = CliRunner().invoke(app, [*base, option, value])
        assert got.exit_code == 2, got.output
        assert option in got.output and named in got.output, got.output
    serve = ["serve", "--store", url, "--transport", url, "--port", "0"]
    for args in ([*base, "--trace-sample", "2"], [*serve, "--trace-sample", "lots"],
                 [*serve, "--alert-rules", "every=0s"]):  # fmt: skip
        got = CliRunner().invoke(app, args)
        assert got.exit_code == 2, got.output
        assert args[-2] in got.output, got.output
    assert not (tmp_path / "accord.db").exists()  # refused before anything was opened


async def test_engines_sharing_a_book_resolve_only_what_they_raised(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'accord.db'}"
    old = sqlite3.connect(tmp_path / "alerts.db")  # a book written before alerts had owners
    old.execute(
        "CREATE TABLE alerts (alert_id TEXT PRIMARY KEY, rule TEXT NOT NULL, subject TEXT NOT"
        " NULL, state TEXT NOT NULL, detail TEXT NOT NULL, runs TEXT NOT NULL, count INTEGER NOT"
        " NULL, first_at_ms INTEGER NOT NULL, last_at_ms INTEGER NOT NULL, action TEXT NOT NULL"
        " DEFAULT '')"
    )
    old.close()
    book = AlertBook(tmp_path / "alerts.db")
    engines = [
        open_engine(url, url, options=EngineOptions(owner=name, dispatch=False))
        for name in ("engine-a", "engine-b")
    ]
    try:
        rules = AlertRules(queued_ms=0)
        a, b = (Alerting(e, book, rules) for e in engines)
        attrs = {"stage": "work", "capability": CAPABILITY}
        dispatched = EmitTelemetry(event_id="d", name="stage.dispatched", attributes=attrs)
        a(Delivered("run_shared1", 1, None, (dispatched,), ()))  # only engine-a dispatched it
        assert [x.alert_id for x in await a.evaluate()] == [ALERT]
        assert await b.evaluate() == []  # engine-b sees nothing waiting, yet leaves it open
        found = book.get(ALERT)
        assert found is not None and (found.state, found.owner) == ("open", "engine-a")
        assert b.open_by_rule["no-live-worker"] == 1 and not b.transitions
        await engines[0].announce("w1", [CAPABILITY], 60_000)
        assert await a.evaluate() == []
        found = book.get(ALERT)
        assert found is not None and found.state == "resolved"
        assert [t[:2] for t in a.transitions] == [(ALERT, "firing"), (ALERT, "resolved")]

        # an owner that stopped raising it for three evaluation periods: anyone resolves it
        a(Delivered("run_shared2", 1, None, (dispatched,), ()))
        await engines[0].announce("w1", [], 1)
        assert [x.alert_id for x in await a.evaluate()] == [ALERT]
        quick = Alerting(engines[1], book, AlertRules(queued_ms=0, every_ms=1))
        await asyncio.sleep(0.01)  # three of its evaluation periods pass
        assert await quick.evaluate() == []
        found = book.get(ALERT)
        assert found is not None and found.state == "resolved"
    finally:
        for e in engines:
            await e.stop()
        book.close()
