"""Signed callbacks on real sockets: ``POST /v1/callbacks`` on uvicorn, httpx as the remote worker,
the engine in process on the embedded default (SQLite store and queue).

The test plays the remote worker: it takes the job the engine dispatched to ``metadata`` off the
queue and answers it with signed ``outcome@1`` callbacks. Each rule of the signature table must
answer its status and stable code and leave the run untouched; callbacks that pass the signature
go through the engine's own intake, which records a stale fence as ``stale``, a callback after
the run ended as ``late``, and refuses a result that breaks ``technical-metadata@1``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from accord_worker_metadata_extract_http import LoopbackServer
from fastapi import FastAPI

from accord.adapters import open_engine
from accord.adapters.ingress.callbacks import CALLBACKS_PATH, CallbackIntake, router
from accord.adapters.ingress.remote import parse_remote_config
from accord.adapters.ingress.webhooks import sign_headers
from accord.contracts.catalog import Catalog
from accord.contracts.sources import load_catalog
from accord.engine.machine.state import HistoryEntry, RunState
from accord.engine.runtime.checks import contract_result_check
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.engine.runtime.wire import encode_batch
from accord.worker.wire import Job, outcome, read_job
from accord.workflow.compiler import compile_workflow

ROOT = Path(__file__).resolve().parents[2]
TENANT, STAGE = "acme", "technical-metadata"
WORKFLOW = """\
name: remote-metadata
version: "1.0.0"
entry: technical-metadata
stages:
  - name: technical-metadata
    type: worker
    queue: metadata
    worker: metadata.extract@2
    input:
      modelId: "${context.modelId}"
    retry: { max_attempts: 1 }
    on_success: completed
    on_failure: failed
terminals: [completed, failed]
"""


def _secret(fill: bytes) -> str:
    return "whsec_" + base64.b64encode(fill * 32).decode()


OLD, NEW, OTHER = _secret(b"o"), _secret(b"n"), _secret(b"x")
CONFIG = f"""\
callbacks:
  tolerance_s: 60
remotes:
  metadata:
    capability: metadata.extract@2
    url: http://127.0.0.1:9/v1/jobs
    allow_http: true
    allow: [127.0.0.1/32]
    signing_key: k-new
    secrets:
      k-old: {OLD}
      k-new: {NEW}
"""
RESULT = {
    "modelId": "m1", "format": "stl", "units": "unknown", "vertexCount": 8, "faceCount": 12,
    "components": 1,
    "bounds": {"min": {"x": 0.0, "y": 0.0, "z": 0.0}, "max": {"x": 1.0, "y": 1.0, "z": 1.0}},
    "extents": {"x": 1.0, "y": 1.0, "z": 1.0}, "surfaceArea": 6.0, "volume": 1.0,
    "volumeUnavailableReason": None, "watertight": True, "windingConsistent": True,
}  # fmt: skip


@dataclass
class Stack:
    engine: Engine
    client: httpx.AsyncClient
    catalog: Catalog
    intake: CallbackIntake

    async def job(self, run_id: str) -> Job:
        """The job the engine dispatched for ``run_id`` (taken off the queue and acked)."""
        stream = self.engine.transport.consume("metadata")
        try:
            while True:
                delivery = await asyncio.wait_for(anext(stream), 10)
                await self.engine.transport.ack(delivery)
                job, _ = read_job(delivery.body, self.catalog, "metadata-extraction-request@1")
                if job.run_id == run_id:
                    return job
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    async def post(
        self,
        body: bytes,
        *,
        key_id: str = "k-new",
        secret: str = NEW,
        webhook_id: str | None = None,
        timestamp: int | None = None,
        signed_body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        hid = webhook_id or f"wh_{time.monotonic_ns()}"
        signed = sign_headers(key_id, secret, hid, signed_body or body, timestamp=timestamp)
        sent = {**signed, "content-type": "application/json", **(headers or {})}
        return await self.client.post(CALLBACKS_PATH, content=body, headers=sent)

    async def start(self) -> tuple[str, Job]:
        run_id = await self.engine.start_run("remote-metadata", {"modelId": "m1"}, tenant=TENANT)
        return run_id, await self.job(run_id)

    async def until(
        self, run_id: str, found: Callable[[list[HistoryEntry]], bool], seconds: float = 10
    ) -> list[HistoryEntry]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            history = await self.engine.history(run_id)
            if found(history):
                return history
            await asyncio.sleep(0.02)
        pytest.fail(f"run {run_id}: history never matched: {[h.to_json() for h in history]}")

    async def finished(self, run_id: str) -> RunState:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            run = await self.engine.load(run_id)
            if run is not None and run.terminal:
                return run
            await asyncio.sleep(0.02)
        pytest.fail(f"run {run_id} not terminal within 10 s")


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    catalog = load_catalog(ROOT / "schemas" / "contracts")
    plan = compile_workflow(WORKFLOW, "remote-metadata.yaml", catalog).unwrap()
    url = f"sqlite:///{tmp_path / 'engine.db'}"
    engine = open_engine(
        url, url, options=EngineOptions(poll_ms=10), result_checks=[contract_result_check(catalog)]
    )
    await engine.register_plan(plan)
    await engine.start()
    intake = CallbackIntake.from_config(parse_remote_config(CONFIG), engine.transport)
    app = FastAPI()
    app.include_router(router)
    app.state.callbacks = intake
    try:
        async with LoopbackServer(app) as server, httpx.AsyncClient(base_url=server.url) as client:
            yield Stack(engine, client, catalog, intake)
    finally:
        await engine.stop()


def _kinds(history: list[HistoryEntry]) -> list[tuple[str, bool, str | None]]:
    return [(str(h.event.get("kind")), h.accepted, h.reason) for h in history]


def _accepted_body(job: Job) -> bytes:
    return outcome(job, "accepted", {}, worker_id="remote-test")[1]


# -- the signature table: every refusal answers 401 with its code and changes nothing ----------


def _tamper(body: bytes) -> bytes:
    return body.replace(b'"remote-test"', b'"remote-evil"')


SIGNATURE_TABLE: list[tuple[str, dict[str, Any], int, str]] = [
    ("unsigned", {"headers": {"webhook-signature": ""}}, 401, "missing-signature"),
    ("no key id", {"headers": {"accord-key-id": ""}}, 401, "missing-key-id"),
    ("unknown key id", {"key_id": "k-gone", "secret": OLD}, 401, "unknown-key"),
    ("wrong secret for the key", {"secret": OTHER}, 401, "bad-signature"),
    ("old key signing as the new", {"key_id": "k-new", "secret": OLD}, 401, "bad-signature"),
    ("expired timestamp", {"timestamp": int(time.time()) - 3600}, 401, "timestamp-expired"),
    ("timestamp too far ahead", {"timestamp": int(time.time()) + 3600}, 401, "timestamp-in-future"),
    (
        "timestamp not a number",
        {"headers": {"webhook-timestamp": "soon"}},
        401,
        "malformed-signature",
    ),
    (
        "signature without a version",
        {"headers": {"webhook-signature": "abc"}},
        401,
        "malformed-signature",
    ),
    (
        "signature of bad base64",
        {"headers": {"webhook-signature": "v1,abc"}},
        401,
        "malformed-signature",
    ),
    ("tampered body", {"tamper": True}, 401, "bad-signature"),
]


@pytest.mark.parametrize(
    ("case", "how", "status", "code"), SIGNATURE_TABLE, ids=[c[0] for c in SIGNATURE_TABLE]
)
async def test_signature_rule_table(
    stack: Stack, case: str, how: dict[str, Any], status: int, code: str
) -> None:
    run_id, job = await stack.start()
    body = _accepted_body(job)
    how = dict(how)
    if how.pop("tamper", False):
        how["signed_body"], body = body, _tamper(body)
    got = await stack.post(body, **how)
    assert got.status_code == status, got.text
    problem = got.json()
    assert got.headers["content-type"].startswith("application/problem+json")
    assert (problem["code"], problem["status"]) == (code, status), problem
    assert problem["type"].endswith(code) and problem["detail"]
    await asyncio.sleep(0.1)
    assert "stage-accepted" not in [k for k, _, _ in _kinds(await stack.engine.history(run_id))]


async def test_old_and_new_keys_are_both_accepted_during_rotation(stack: Stack) -> None:
    run_id, job = await stack.start()
    got = await stack.post(_accepted_body(job), key_id="k-old", secret=OLD)
    assert got.status_code == 202, got.text
    assert got.json()["outcomes"] == [f"{job.message_id}:accepted"]
    await stack.until(run_id, lambda h: ("stage-accepted", True, None) in _kinds(h))
    _, done = outcome(job, "succeeded", RESULT, worker_id="remote-test")
    assert (await stack.post(done, key_id="k-new", secret=NEW)).status_code == 202
    run = await stack.finished(run_id)
    assert run.status == "completed", run.error
    assert run.stages[STAGE].result == RESULT


async def test_replayed_webhook_id_is_refused_with_409(stack: Stack) -> None:
    run_id, job = await stack.start()
    body = _accepted_body(job)
    first = await stack.post(body, webhook_id="wh-once")
    assert first.status_code == 202, first.text
    again = await stack.post(body, webhook_id="wh-once")
    assert (again.status_code, again.json()["code"]) == (409, "replayed")
    # the same outcome under a new id is taken; the queue knows its messageId and drops the
    # copy (a broker that does not deduplicate delivers it, and the engine records a duplicate)
    assert (await stack.post(body, webhook_id="wh-twice")).status_code == 202
    await asyncio.sleep(0.3)
    history = await stack.until(run_id, lambda h: ("stage-accepted", True, None) in _kinds(h))
    assert [k for k, a, _ in _kinds(history) if a].count("stage-accepted") == 1


async def test_validly_signed_callback_with_a_stale_fence_is_recorded_stale(stack: Stack) -> None:
    run_id, job = await stack.start()
    wrong = Job(job.envelope, job.run_id, job.stage, job.attempt, "0" * 32)
    _, body = outcome(wrong, "succeeded", RESULT, worker_id="remote-test")
    assert (await stack.post(body)).status_code == 202
    history = await stack.until(run_id, lambda h: ("stage-succeeded", False, "stale") in _kinds(h))
    run = await stack.engine.load(run_id)
    assert run is not None and not run.terminal and run.stages[STAGE].result is None
    assert [k for k, a, _ in _kinds(history) if a].count("stage-succeeded") == 0


async def test_callback_after_the_run_ended_is_recorded_late(stack: Stack) -> None:
    run_id, job = await stack.start()
    _, done = outcome(job, "succeeded", RESULT, worker_id="remote-test")
    assert (await stack.post(done)).status_code == 202
    assert (await stack.finished(run_id)).status == "completed"
    _, beat = outcome(job, "heartbeat", {"at": time.time()}, seq=1, worker_id="remote-test")
    assert (await stack.post(beat)).status_code == 202
    await stack.until(run_id, lambda h: ("heartbeat", False, "late") in _kinds(h))
    run = await stack.engine.load(run_id)
    assert run is not None and run.status == "completed" and run.stages[STAGE].result == RESULT


async def test_signed_result_that_breaks_the_result_contract_fails_the_attempt(
    stack: Stack,
) -> None:
    run_id, job = await stack.start()
    bad = {**RESULT, "vertexCount": "eight"}
    _, body = outcome(job, "succeeded", bad, worker_id="remote-test")
    assert (await stack.post(body)).status_code == 202
    run = await stack.finished(run_id)
    assert run.status == "failed"
    failed = [h.event for h in await stack.engine.history(run_id) if h.accepted]
    codes = [e.get("code") for e in failed if e.get("kind") == "stage-failed"]
    assert codes == ["invalid-result"], failed
    assert run.stages[STAGE].result is None


async def test_signed_batch_is_applied_in_order(stack: Stack) -> None:
    run_id, job = await stack.start()
    members = [
        outcome(job, "accepted", {}, worker_id="remote-test"),
        outcome(job, "succeeded", RESULT, worker_id="remote-test"),
    ]
    batch_id, body = encode_batch(members)
    got = await stack.post(body)
    assert got.status_code == 202, got.text
    assert got.json()["messageId"] == batch_id
    assert got.json()["outcomes"] == [m for m, _ in members]
    assert (await stack.finished(run_id)).status == "completed"


BODY_TABLE: list[tuple[str, bytes, int, str]] = [
    ("not JSON", b"{not json", 400, "malformed-body"),
    ("not an object", b"[1, 2]", 400, "malformed-body"),
    ("not UTF-8", b'{"a": "\xff"}', 400, "malformed-body"),
    ("no fence", json.dumps({"messageType": "accepted", "messageId": "m", "runId": "r",
                             "stage": "s", "attempt": 1}).encode(), 422, "invalid-outcome"),
    ("unknown kind", b"{}", 422, "invalid-outcome"),
    ("empty batch", b'{"messageType": "batch", "outcomes": []}', 422, "invalid-outcome"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "body", "status", "code"), BODY_TABLE, ids=[c[0] for c in BODY_TABLE]
)
async def test_signed_body_that_is_no_outcome_is_refused(
    stack: Stack, case: str, body: bytes, status: int, code: str
) -> None:
    if case == "not UTF-8":  # standardwebhooks signs text: sign the bytes as the sender did
        got = await stack.post(body, signed_body=b'{"a": "?"}')
    else:
        got = await stack.post(body)
    assert (got.status_code, got.json()["code"]) == (status, code), got.text


async def test_outcome_without_its_contract_version_is_refused(stack: Stack) -> None:
    _, job = await stack.start()
    doc = json.loads(_accepted_body(job))
    del doc["contractVersion"]
    got = await stack.post(json.dumps(doc).encode())
    assert (got.status_code, got.json()["code"]) == (422, "invalid-outcome")
    assert "contractVersion" in got.json()["detail"]


async def test_oversized_body_is_refused_before_verification(stack: Stack) -> None:
    body = b'{"pad": "' + b"x" * 1_100_000 + b'"}'
    got = await stack.client.post(CALLBACKS_PATH, content=body)
    assert (got.status_code, got.json()["code"]) == (413, "body-too-large")


async def test_unconfigured_server_answers_503_not_500() -> None:
    app = FastAPI()
    app.include_router(router)
    async with LoopbackServer(app) as server, httpx.AsyncClient(base_url=server.url) as client:
        got = await client.post(CALLBACKS_PATH, content=b"{}")
    assert (got.status_code, got.json()["code"]) == (503, "callbacks-not-configured")


async def test_outcome_queue_failure_answers_503_and_frees_the_webhook_id(
    stack: Stack, tmp_path: Path
) -> None:
    run_id, job = await stack.start()
    body = _accepted_body(job)
    real = stack.intake.transport

    class Closed:
        async def publish(self, *_: Any, **__: Any) -> None:
            raise ConnectionError("queue away")

    stack.intake.transport = Closed()  # type: ignore[assignment]
    try:
        got = await stack.post(body, webhook_id="wh-retry")
    finally:
        stack.intake.transport = real
    assert (got.status_code, got.json()["code"]) == (503, "outcome-queue-unavailable")
    retry = await stack.post(body, webhook_id="wh-retry")
    assert retry.status_code == 202, retry.text
    await stack.until(run_id, lambda h: ("stage-accepted", True, None) in _kinds(h))
