"""The remote worker on real sockets: signed jobs in, signed outcome callbacks out."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from accord_worker_metadata_extract_http import LoopbackServer, RemoteWorker, Settings
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from accord.adapters.ingress.webhooks import WebhookVerifier, sign_headers
from accord.contracts.sources import load_catalog
from accord.worker.storage import StorageMap

ROOT = Path(__file__).resolve().parents[3]
SECRET = "whsec_" + base64.b64encode(b"w" * 32).decode()
TENANT = "acme"


def _cube() -> bytes:
    corners = [(x, y, z) for z in (0, 1) for y in (0, 1) for x in (0, 1)]
    quads = [(0, 2, 3, 1), (4, 5, 7, 6), (0, 1, 5, 4), (2, 6, 7, 3), (1, 3, 7, 5), (0, 4, 6, 2)]
    tris = [t for a, b, c, d in quads for t in ((a, b, c), (a, c, d))]
    out = bytearray(b"cube".ljust(80, b" ") + struct.pack("<I", len(tris)))
    for tri in tris:
        out += struct.pack("<3f", 0, 0, 0)
        for i in tri:
            out += struct.pack("<3f", *corners[i])
        out += b"\0\0"
    return bytes(out)


@dataclass
class Receiver:
    """The callback end: verifies each signature and keeps what came."""

    verifier: WebhookVerifier = field(
        default_factory=lambda: WebhookVerifier({"k1": SECRET}, tolerance_s=60)
    )
    outcomes: list[dict[str, Any]] = field(default_factory=list)

    async def take(self, request: Request) -> Response:
        body = await request.body()
        verified = self.verifier.verify(body, request.headers)
        assert verified.webhook_id == json.loads(body)["messageId"]
        self.outcomes.append(json.loads(body))
        return JSONResponse({"status": "accepted"}, 202)

    async def wait(self, kind: str, count: int = 1) -> list[dict[str, Any]]:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = [o for o in self.outcomes if o["messageType"] == kind]
            if len(got) >= count:
                return got
            await asyncio.sleep(0.02)
        pytest.fail(f"no {kind} outcome: {self.outcomes}")


@dataclass
class Service:
    worker: RemoteWorker
    receiver: Receiver
    client: httpx.AsyncClient

    async def send(self, doc: dict[str, Any], webhook_id: str | None = None) -> httpx.Response:
        body = json.dumps(doc).encode()
        headers = sign_headers("k1", SECRET, webhook_id or uuid.uuid4().hex, body)
        return await self.client.post("/v1/jobs", content=body, headers=headers)


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    (tmp_path / TENANT / "models").mkdir(parents=True)
    (tmp_path / TENANT / "models" / "cube.stl").write_bytes(_cube())
    receiver = Receiver()
    callbacks = Starlette(routes=[Route("/v1/callbacks", receiver.take, methods=["POST"])])
    async with LoopbackServer(callbacks) as cb:
        worker = RemoteWorker(
            Settings(
                callback_url=f"{cb.url}/v1/callbacks", key_id="k1", secret=SECRET,
                job_secrets={"k1": SECRET}, storage=StorageMap.local(tmp_path),
                catalog=load_catalog(ROOT / "schemas" / "contracts"), heartbeat_ms=100,
            )
        )  # fmt: skip
        async with (
            LoopbackServer(worker.app) as server,
            httpx.AsyncClient(base_url=server.url) as client,
        ):
            yield Service(worker, receiver, client)


def _job(**payload: Any) -> dict[str, Any]:
    return {
        "messageId": f"msg_{uuid.uuid4().hex}", "messageType": "metadata-extraction-request",
        "contractVersion": 1, "correlationId": "run_1", "producer": "accord-engine",
        "occurredAt": "2026-01-01T00:00:00.000Z", "runId": "run_1", "stage": "technical-metadata",
        "attempt": 1, "fence": uuid.uuid4().hex, "tenant": TENANT, "resultSchemaVersion": 1,
        "payload": payload or {"modelId": "cube", "objectKey": "models/cube.stl"},
    }  # fmt: skip


async def test_a_job_is_accepted_measured_and_answered_by_signed_callback(
    service: Service,
) -> None:
    job = _job()
    got = await service.send(job)
    assert got.status_code == 202, got.text
    assert got.json()["acceptanceId"].startswith("acc_")
    [done] = await service.receiver.wait("succeeded")
    assert done["messageId"] == f"{job['messageId']}:succeeded"
    assert (done["fence"], done["attempt"], done["tenant"]) == (job["fence"], 1, TENANT)
    assert (done["payload"]["vertexCount"], done["payload"]["volume"]) == (8, 1.0)


async def test_a_job_delivered_again_gets_its_first_acceptance_and_runs_once(
    service: Service,
) -> None:
    job = _job()
    first = (await service.send(job)).json()["acceptanceId"]
    await service.receiver.wait("succeeded")
    again = await service.send(job)
    assert again.json()["acceptanceId"] == first
    await service.receiver.wait("succeeded", 2)  # the recorded outcome, sent again
    assert service.worker.handled == 1


async def test_unsigned_replayed_and_poison_jobs_are_refused(service: Service) -> None:
    body = json.dumps(_job()).encode()
    unsigned = await service.client.post("/v1/jobs", content=body)
    assert (unsigned.status_code, unsigned.json()["code"]) == (401, "missing-signature")
    assert (await service.send(_job(), webhook_id="same")).status_code == 202
    replayed = await service.send(_job(), webhook_id="same")
    assert (replayed.status_code, replayed.json()["code"]) == (409, "replayed")
    poison = {k: v for k, v in _job().items() if k != "fence"}
    got = await service.send(poison)
    assert (got.status_code, got.json()["code"]) == (422, "poison-job")


async def test_a_request_that_breaks_its_contract_is_a_terminal_failure(
    service: Service,
) -> None:
    assert (await service.send(_job(modelId="not valid!"))).status_code == 202
    [failed] = await service.receiver.wait("failed")
    assert (failed["payload"]["code"], failed["payload"]["retryable"]) == (
        "invalid-request", False
    )  # fmt: skip
    assert service.worker.handled == 0


async def test_cancellation_for_no_running_attempt_is_acknowledged(service: Service) -> None:
    request = {  # as the engine writes one (docs/protocol.md §7)
        "attempt": 1, "fence": "f" * 32, "job_id": f"job_{'0' * 32}",
        "kind": "request-cancellation", "queue": "metadata", "reason": "run cancelled",
        "stage": "technical-metadata",
    }  # fmt: skip
    body = json.dumps(request).encode()
    headers = sign_headers("k1", SECRET, uuid.uuid4().hex, body)
    got = await service.client.post("/v1/cancel", content=body, headers=headers)
    assert (got.status_code, got.json()) == (202, {"cancelled": False})
