"""Approval gates end to end on Redis and BullMQ: a real ``accord serve`` (Redis store, BullMQ
transport, the engine and the platform actions in it) and a real reference worker process
(``metadata-extract``) run a model-ingest variant with a ``review-listing`` gate before
``publish``. One run is approved over HTTP by an operator and completes (published), one is
rejected and fails, and one on a variant with a short gate times out on its durable timer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.integration.test_api_serve import CONTRACTS, ROOT, _accord, _process, _serving_url
from tests.services import ensure_redis, redis_url

MODEL = "cube"
GATE = """  - name: review-listing
    type: approval
    approvers: { role: operator, tenant_scoped: true, min: 1, exclude_requester: true }
    options: [approve, reject]
    on_approve: publish
    on_reject: failed
    timeout_ms: TIMEOUT
    on_timeout: failed
  - name: publish
"""


def _variant(name: str, timeout_ms: int) -> str:
    """model-ingest with the fork taken out (technical metadata only, so one worker serves it)
    and a review gate before publish, which a cache hit reaches too."""
    source = (ROOT / "workflows" / "model-ingest.yaml").read_text(encoding="utf-8")
    start, end = source.index("  - name: render-thumbnail"), source.index("  - name: technical")
    source = source[:start] + source[end:]
    start, end = source.index("  - name: derive-join"), source.index("  - name: publish")
    source = source[:start] + GATE.replace("TIMEOUT", str(timeout_ms)) + source[end + 18 :]
    source = source.replace("next: publish", "next: review-listing")
    source = source.replace("next: render-thumbnail", "next: technical-metadata")
    source = source.replace("on_success: derive-join", "on_success: review-listing")
    return source.replace("name: model-ingest", f"name: {name}", 1)


async def _key(cwd: Path, store: str, role: str) -> str:
    code, out, err = await _accord(
        cwd, "keys", "create", "--role", role, "--tenant", "demo", "--store", store, "--json"
    )
    assert code == 0, err
    return str(json.loads(out)["key"])


async def _waiting(client: httpx.AsyncClient, run_ids: set[str]) -> list[dict[str, Any]]:
    async with asyncio.timeout(60):
        while True:
            listed = (await client.get("/v1/approvals")).json()["approvals"]
            if {g["run_id"] for g in listed} >= run_ids:
                return list(listed)
            await asyncio.sleep(0.1)


async def _ended(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    async with asyncio.timeout(60):
        while True:
            run: dict[str, Any] = (await client.get(f"/v1/runs/{run_id}")).json()
            if run["status"] in ("completed", "failed", "cancelled"):
                return run
            await asyncio.sleep(0.1)


@pytest.mark.timeout(180)
async def test_a_gate_on_redis_and_bullmq_is_approved_rejected_and_times_out_over_http(
    tmp_path: Path,
) -> None:
    ensure_redis()
    store = redis_url(f"ag{uuid.uuid4().hex[:10]}")
    transport = f"bullmq://127.0.0.1:6379/15?prefix=aq{uuid.uuid4().hex[:10]}"
    admin, operator = await _key(tmp_path, store, "admin"), await _key(tmp_path, store, "operator")
    objects = tmp_path / ".accord" / "objects" / "demo" / "models"
    objects.mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "models" / f"{MODEL}.3mf", objects / f"{MODEL}.3mf")
    ports = ["--store", store, "--transport", transport, "--contracts", str(CONTRACTS)]
    async with contextlib.AsyncExitStack() as stack:
        server = await stack.enter_async_context(
            _process(tmp_path, "serve", "serve", "--port", "0", *ports)
        )
        url = await _serving_url(server, tmp_path)
        await stack.enter_async_context(
            _process(tmp_path, "metadata-extract", "worker", "run",
                     "accord_worker_metadata_extract.handler:worker", *ports,
                     "--heartbeat-ms", "500")
        )  # fmt: skip
        as_admin = await stack.enter_async_context(
            httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {admin}"})
        )
        as_operator = await stack.enter_async_context(
            httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {operator}"})
        )
        async with asyncio.timeout(60):  # the worker announces its capability
            while not (await as_admin.get("/v1/capabilities")).json()["workers"]:
                await asyncio.sleep(0.1)
        for name, timeout_ms in (("model-ingest-reviewed", 600_000), ("model-ingest-brief", 2_000)):
            made = await as_admin.post("/v1/workflows", json={"source": _variant(name, timeout_ms)})
            assert made.status_code == 201, made.text
        ids = {}
        for case, workflow in (("approve", "model-ingest-reviewed"),
                               ("reject", "model-ingest-reviewed"),
                               ("timeout", "model-ingest-brief")):  # fmt: skip
            got = await as_admin.post(
                "/v1/runs",
                json={"workflow": workflow, "context": {"modelId": MODEL}},
                headers={"Idempotency-Key": f"gate-{case}"},
            )
            assert got.status_code == 201, got.text
            ids[case] = got.json()["run_id"]

        # the requester (the admin key that started them) may not decide its own runs
        listed = await _waiting(as_operator, {ids["approve"], ids["reject"]})
        assert {g["stage"] for g in listed} == {"review-listing"}
        own = await as_admin.post(f"/v1/runs/{ids['approve']}/stages/review-listing/approve")
        assert own.status_code == 403, own.text
        got = await as_operator.post(
            f"/v1/runs/{ids['approve']}/stages/review-listing/approve", json={"comment": "fine"}
        )
        assert got.status_code == 200, got.text
        got = await as_operator.post(
            f"/v1/runs/{ids['reject']}/stages/review-listing/reject", json={"comment": "no"}
        )
        assert got.status_code == 200, got.text

        approved = await _ended(as_admin, ids["approve"])
        assert approved["status"] == "completed", approved
        stages = approved["stages"]
        assert stages["technical-metadata"]["status"] == "completed"  # the worker process
        assert stages["review-listing"]["status"] == "completed"
        (decision,) = stages["review-listing"]["result"]["decisions"]
        assert decision["decision"] == "approve" and decision["comment"] == "fine"
        assert stages["publish"]["status"] == "completed"
        rejected = await _ended(as_admin, ids["reject"])
        assert rejected["status"] == "failed" and rejected["error"]["code"] == "approval-rejected"
        assert rejected["stages"]["publish"]["status"] == "pending"
        timed = await _ended(as_admin, ids["timeout"])
        assert timed["status"] == "failed" and timed["error"]["code"] == "approval-timeout"
        assert timed["stages"]["review-listing"]["status"] == "timed-out"
        late = await as_operator.post(f"/v1/runs/{ids['timeout']}/stages/review-listing/approve")
        assert late.status_code == 409, late.text
