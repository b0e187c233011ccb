"""Nothing sensitive in any operator-facing view: a real run on the embedded SQLite default whose
context carries a canary in ``storageConnectionRef`` (marked ``sensitive`` by
``model-ingest-context@1`` and by the request it is bound into); every ``accord runs …`` view,
in both forms, and the DEBUG log of the engine and worker run must not show it, and must show the
mask where it was. The BullMQ half: a completed run leaves no job hash on the broker."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from engine_shell_support import wait_terminal
from typer.testing import CliRunner

from accord.adapters import open_transport
from accord.cli import _redaction as redaction_module
from accord.cli import app
from accord.cli._redaction import (
    SEALING_KEY_ENV,
    configure_logging,
    note_requests,
    run_observer,
    unconfigure_logging,
)
from accord.contracts.catalog import Catalog
from accord.contracts.fixture_values import message_of
from accord.contracts.redact import MASK, redact_body, redact_document, redact_quarantine_record
from accord.contracts.sources import load_catalog
from accord.errors import TransportError
from accord.worker import Context, RetryableError, Worker
from accord.worker.fleet import ingest_stack
from accord.workflow.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tests/integration is no package: reach tests.* from the root
    sys.path.insert(0, str(ROOT))
import sensitive_support  # noqa: E402
from tests.contract import test_transport as contract  # noqa: E402
from tests.services import REDIS_DB, ensure_redis, held_open  # noqa: E402

CANARY = "canary-7f3a9c"
WORKFLOW = "secret-extract"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(ROOT / "schemas" / "contracts")


def compiled(tmp_path: Path, catalog: Catalog) -> Plan:
    return sensitive_support.compiled(tmp_path, catalog, WORKFLOW)


def extractor(catalog: Catalog) -> Worker:
    """Answers once with a failure that names the secret, then with a valid result; logs the
    request it got at DEBUG and the secret in a traceback, as careless handler code does."""
    contract = catalog.message("technical-metadata@1")
    assert contract is not None
    result = message_of(contract.payload, full=False)
    log = logging.getLogger("accord.worker.handler.extract")
    seen: list[int] = []
    worker = Worker("secret-extract")

    def handle(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        seen.append(1)
        try:
            raise OSError(f"cannot open {payload['storageConnectionRef']}")
        except OSError:
            log.exception("opening the model failed")
        log.debug("request %r", payload)
        log.info("connecting with storageConnectionRef=%s", payload["storageConnectionRef"])
        if len(seen) == 1:
            raise RetryableError(f"storage {payload['storageConnectionRef']} is not reachable")
        return dict(result) | {"modelId": payload["modelId"]}

    worker.bind("metadata.extract@2", handle)
    return worker


async def run_with_canary(tmp_path: Path, catalog: Catalog) -> tuple[str, str, str]:
    """``(store url, run id, the DEBUG log)`` of one run whose context holds the canary."""
    plan = compiled(tmp_path, catalog)
    url = f"sqlite:///{tmp_path / 'accord.db'}"
    stream = io.StringIO()
    redacting = configure_logging(catalog, "DEBUG", stream)
    try:
        async with ingest_stack(url, plan, catalog, [extractor(catalog)], state=tmp_path) as s:
            s.engine.observers.append(run_observer(redacting, s.engine, catalog))
            context = {"modelId": "m1", "storageConnectionRef": CANARY}
            run_id = await s.engine.start_run(plan.name, context, tenant="acme")
            await wait_terminal(s.engine.store, [run_id], 30)
    finally:
        unconfigure_logging()
        logging.getLogger("accord").setLevel(logging.NOTSET)
    return url, run_id, stream.getvalue()


def invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_no_runs_view_shows_a_sensitive_value(tmp_path: Path, catalog: Catalog) -> None:
    url, run_id, _ = asyncio.run(run_with_canary(tmp_path, catalog))
    views = {}
    for command in ("show", "history", "explain"):
        for form in ((), ("--json",)):
            views[(command, *form)] = invoke("runs", command, run_id, "--store", url, *form)
    for form in ((), ("--json",)):
        views[("list", *form)] = invoke("runs", "list", "--store", url, *form)
    leaking = sorted(" ".join(k) for k, out in views.items() if CANARY in out)
    assert leaking == [], f"the canary is shown by: {leaking}"
    shown = json.loads(views[("show", "--json")])
    assert shown["status"] == "completed"
    assert shown["context"] == {"modelId": "m1", "storageConnectionRef": MASK}
    history = json.loads(views[("history", "--json")])
    started = next(h["event"] for h in history if h["event"]["kind"] == "run-started")
    assert started["context"]["storageConnectionRef"] == MASK
    failed = next(h["event"] for h in history if h["event"]["kind"] == "stage-failed")
    assert f"storage {MASK} is not reachable" in failed["message"]


def test_the_debug_log_shows_no_sensitive_value(tmp_path: Path, catalog: Catalog) -> None:
    _, _, log = asyncio.run(run_with_canary(tmp_path, catalog))
    assert "opening the model failed" in log and "OSError: cannot open" in log
    assert "request {" in log and "connecting with" in log
    assert CANARY not in log, [line for line in log.splitlines() if CANARY in line]
    assert f"cannot open {MASK}" in log
    assert f"storageConnectionRef=={MASK}" not in log
    assert f"storageConnectionRef={MASK}" in log
    assert f"'storageConnectionRef': '{MASK}'" in log


def test_a_quarantine_record_keeps_no_sensitive_value(catalog: Catalog) -> None:
    contracts = catalog.messages()
    job = {"messageId": "j1", "payload": {"modelId": "m1", "storageConnectionRef": CANARY},
           "note": f"retry of {CANARY}"}  # fmt: skip
    shown = redact_document(job, contracts)
    assert shown["payload"] == {"modelId": "m1", "storageConnectionRef": MASK}
    assert shown["note"] == f"retry of {MASK}"
    body = redact_body(json.dumps(job).encode(), contracts)
    assert CANARY not in body and MASK in body
    assert len(redact_body(b"x" * 100_000, contracts)) == 4096
    reason = f"payload.storageConnectionRef: {CANARY!r} is longer than 256"
    record = {"queue": "q", "message_id": "j1", "reason": reason, "body": json.dumps(job)}
    kept = redact_quarantine_record(record, contracts)
    assert CANARY not in json.dumps(kept), kept
    assert json.loads(kept["body"])["payload"]["storageConnectionRef"] == MASK
    assert kept["reason"] == f"payload.storageConnectionRef: '{MASK}' is longer than 256"
    cut = json.dumps({"data": json.dumps(job)})[:120]  # JSON in a JSON string, cut: unparseable
    assert CANARY in cut
    kept = redact_quarantine_record({**record, "body": cut}, contracts)
    assert CANARY not in kept["body"] and f'storageConnectionRef\\": \\"{MASK}' in kept["body"]
    assert (
        len(redact_quarantine_record({**record, "body": "y" * 70_000}, contracts)["body"]) == 4096
    )


def test_a_worker_process_scrubs_the_values_of_its_requests(catalog: Catalog) -> None:
    """`accord worker run` wraps each handler so that its request's sensitive values are known
    to the log filter before the handler runs: a bare echo of one is masked too."""
    log = logging.getLogger("accord.worker.handler.probe")
    worker = Worker("probe")

    def handle(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        log.error("cannot open %s", payload["storageConnectionRef"])
        return {}

    worker.bind("metadata.extract@2", handle)
    stream = io.StringIO()
    note_requests(worker, configure_logging(catalog, stream=stream), catalog)
    try:
        worker.bindings["metadata.extract@2"].handler(
            {"modelId": "m1", "storageConnectionRef": CANARY}, cast(Context, None)
        )
    finally:
        unconfigure_logging()
    assert f"cannot open {MASK}" in stream.getvalue() and CANARY not in stream.getvalue()


# -- BullMQ: completed and failed jobs do not stay on the broker ---------------------------------


def bullmq_url(prefix: str, opts: str) -> str:
    return f"bullmq://127.0.0.1:6379/{REDIS_DB}?prefix={prefix}&{opts}"


@pytest.fixture
def prefix() -> Any:
    ensure_redis()
    name = f"rd-{uuid.uuid4().hex[:10]}"
    yield name
    client = held_open(redis.Redis(port=6379, db=REDIS_DB))
    keys = list(client.scan_iter(match=f"{name}:*", count=1000))
    if keys:
        client.delete(*keys)


def job_hashes(prefix: str) -> dict[str, str]:
    """Every job hash under ``prefix``: key → the job's data."""
    client = held_open(redis.Redis(port=6379, db=REDIS_DB, decode_responses=True))
    pattern = re.compile(rf"^{re.escape(prefix)}:.+:m-[^:]+$")
    keys = [k for k in client.scan_iter(match=f"{prefix}:*", count=1000) if pattern.match(k)]
    return {k: str(client.hget(k, "data") or "") for k in keys if client.type(k) == "hash"}


async def test_a_finished_runs_jobs_leave_the_broker(
    tmp_path: Path, catalog: Catalog, prefix: str
) -> None:
    plan = compiled(tmp_path, catalog)
    transport = bullmq_url(prefix, "visibility_ms=1000&dedup_ms=1000&done_count=2&stalled_ms=300")
    url = f"sqlite:///{tmp_path / 'accord.db'}"
    stack = ingest_stack(
        url, plan, catalog, [extractor(catalog)], state=tmp_path, transport=transport
    )
    async with stack as s:
        context = {"modelId": "m1", "storageConnectionRef": CANARY}
        first = await s.engine.start_run(plan.name, context, tenant="acme")
        await wait_terminal(s.engine.store, [first], 30)
        kept = job_hashes(prefix)
        assert any(CANARY in data for data in kept.values())  # the request travelled in clear
        await asyncio.sleep(1.2)  # past dedup_ms: the next finish of each queue trims them
        later = {"modelId": "m2", "storageConnectionRef": "other-ref"}
        second = await s.engine.start_run(plan.name, later, tenant="acme")
        await wait_terminal(s.engine.store, [second], 30)
        done = await s.engine.load(second)
        assert done is not None and done.status == "completed"
        await s.engine.executor.wait_idle()
    left = job_hashes(prefix)
    assert not kept.keys() & left.keys(), sorted(kept.keys() & left.keys())
    assert not any(CANARY in data for data in left.values())
    client = held_open(redis.Redis(port=6379, db=REDIS_DB, decode_responses=True))
    completed = [k for k in client.scan_iter(match=f"{prefix}:*:completed")]
    assert completed and all(client.zcard(k) <= 2 for k in completed)  # done_count=2


async def test_dead_letters_are_kept_for_dead_ms_and_dead_count_only(prefix: str) -> None:
    transport = open_transport(
        bullmq_url(prefix, "visibility_ms=1000&max_deliveries=1&dead_ms=1000&dead_count=1")
    )
    try:
        for message_id in ("dead-1", "dead-2"):
            await transport.publish("q", message_id, f'{{"ref": "{CANARY}"}}'.encode())
            async with contract.consumer(transport) as stream:
                (got,) = await contract.take(stream)
                await transport.nack(got)
        dead = await transport.dead_letters("q")
        assert [d.message_id for d in dead] == ["dead-2"]  # dead_count=1: the older one is gone
        assert sorted(job_hashes(prefix)) == [f"{prefix}:q:m-dead-2"]
    finally:
        await transport.close()


def test_bad_retention_options_are_refused_naming_the_option() -> None:
    with pytest.raises(TransportError, match="dead_count"):
        open_transport(bullmq_url("x", "dead_count=0"))
    with pytest.raises(TransportError, match="done_count"):
        open_transport(bullmq_url("x", "done_count=many"))


# -- the embedded default says that it keeps sensitive values in clear ---------------------------


def engine_run_stderr(tmp_path: Path, **env: str) -> str:
    """``accord engine run`` in a child process, stopped early by a workflow it cannot watch."""
    url = f"sqlite:///{tmp_path / 'w.db'}"
    args = ["engine", "run", "--store", url, "--transport", url, "--workflow", "nope"]
    args += ["--state", str(tmp_path / "state")]
    child_env = {k: v for k, v in os.environ.items() if k != SEALING_KEY_ENV} | env
    done = subprocess.run(
        [sys.executable, "-c", "from accord.cli import main; main()", *args],
        capture_output=True, text=True, cwd=ROOT, env=child_env, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    return done.stderr


def test_engine_run_warns_once_that_sensitive_values_are_stored_in_clear(tmp_path: Path) -> None:
    stderr = engine_run_stderr(tmp_path)
    assert stderr.count("sensitive values are stored in clear at rest") == 1, stderr
    assert SEALING_KEY_ENV in stderr
    sealed = engine_run_stderr(tmp_path, **{SEALING_KEY_ENV: "configured"})
    assert "stored in clear" not in sealed, sealed


@pytest.mark.node
def test_the_demo_warns_once_that_sensitive_values_are_stored_in_clear(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for part in ("schemas/contracts", "workflows"):
        shutil.copytree(ROOT / part, tmp_path / part)
    typescript = ROOT / "bindings" / "typescript"
    shutil.copytree(
        typescript,
        tmp_path / "bindings" / "typescript",
        ignore=shutil.ignore_patterns("node_modules", "dist"),
    )
    (tmp_path / "bindings" / "typescript" / "node_modules").symlink_to(typescript / "node_modules")
    (tmp_path / "models").mkdir()
    shutil.copy(ROOT / "examples" / "models" / "cube.3mf", tmp_path / "models" / "cube.3mf")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(SEALING_KEY_ENV, raising=False)
    monkeypatch.setattr(redaction_module, "_warned", set())  # a fresh process's start-up
    args = ["demo", "--models", str(tmp_path / "models"), "--state", str(tmp_path / "state")]
    try:
        result = CliRunner().invoke(app, [*args, "--json"], env={"COLUMNS": "200"})
    finally:
        unconfigure_logging()
    assert result.exit_code == 0, result.output
    assert result.stderr.count("sensitive values are stored in clear at rest") == 1, result.stderr
    assert "stored in clear" not in result.stdout


async def test_the_engines_quarantine_records_mask_sensitive_fields(
    catalog: Catalog, tmp_path: Path
) -> None:
    """An outcome intake cannot take is kept on ``<queue>.quarantine`` with the fields the
    engine's contracts mark sensitive masked, in the body and in the reason alike."""
    from accord.adapters import open_engine
    from accord.engine.runtime.orchestrator import EngineOptions
    from accord.engine.runtime.wire import quarantine_queue, read_quarantine

    url = f"sqlite:///{tmp_path / 'q.db'}"
    engine = open_engine(url, url, options=EngineOptions(poll_ms=10), catalog=catalog)
    forged = {"messageId": "o1", "payload": {"storageConnectionRef": CANARY}, "kind": "nope"}
    await engine.transport.publish(engine.intake.queue, "o1", json.dumps(forged).encode())
    await engine.start(reconcile_first=False)
    try:
        for _ in range(200):
            if engine.intake.quarantined:
                break
            await asyncio.sleep(0.02)
    finally:
        await engine.stop()
    assert engine.intake.quarantined, "the forged outcome was not quarantined"
    transport = open_transport(url)
    try:
        kept = await transport.dead_letters(quarantine_queue(engine.intake.queue))
        records = [d.body for d in kept]
        async for delivery in transport.consume(quarantine_queue(engine.intake.queue)):
            records.append(delivery.body)
            break
    finally:
        await transport.close()
    assert records
    record = read_quarantine(records[0])
    assert CANARY not in json.dumps(record), record
    assert MASK in record["body"]
