"""The TypeScript worker opens sealed fields as the Python runtime does.

The worker process is started with a sealing key in its environment and sent, over the real
Redis through BullMQ, a job whose ``storageConnectionRef`` is a token sealed by the Python
keyring: it must open it and measure the model. A token under a key it does not hold is a
terminal ``unsealable-request`` (never the token taken as the value), and a value that arrived
sealed never comes back in clear in a failure message.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from accord.adapters import open_transport
from accord.adapters.transports.bullmq import BullmqTransport
from accord.contracts.sealing import Keyring

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tests/integration is no package: reach tests.* from the root
    sys.path.insert(0, str(ROOT))
from tests.integration.ts_worker_support import NodeWorker, built_worker, cube_stl  # noqa: E402
from tests.services import REDIS_DB, ensure_redis, held_open  # noqa: E402

pytestmark = pytest.mark.node
TENANT = "acme"
KEY = Keyring.generate_key()
RING = Keyring(("ts1", KEY))


def _key_text(kid: str, key: bytes) -> str:
    return f"{kid}:{base64.b64encode(key).decode()}"


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeWorker]:
    ensure_redis()
    root = tmp_path_factory.mktemp("sealed-objects")
    (root / TENANT / "models").mkdir(parents=True)
    (root / TENANT / "models" / "cube.stl").write_bytes(cube_stl(1.0, (0.0, 0.0, 0.0)))
    prefix = f"tss-{uuid.uuid4().hex[:10]}"
    env = {"ACCORD_SEALING_KEY": _key_text("ts1", KEY)}
    node = NodeWorker(built_worker(), prefix, root, root.parent / f"{prefix}.log", env=env)
    yield node
    node.stop()
    assert node.proc.returncode == 0, node.stderr()
    client = held_open(redis.Redis(port=6379, db=REDIS_DB))
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture
async def transport(worker: NodeWorker) -> AsyncIterator[BullmqTransport]:
    t = open_transport(worker.url)
    assert isinstance(t, BullmqTransport)
    try:
        yield t
    finally:
        await t.close()


def _envelope(ref: str) -> dict[str, Any]:
    return {
        "messageId": f"msg_{uuid.uuid4().hex}", "messageType": "metadata-extraction-request",
        "contractVersion": 1, "correlationId": "run_sealed", "producer": "accord-engine",
        "occurredAt": "2026-01-01T00:00:00.000Z", "runId": "run_sealed",
        "stage": "technical-metadata", "attempt": 1, "fence": uuid.uuid4().hex, "tenant": TENANT,
        "payload": {"modelId": "cube", "objectKey": "models/cube.stl",
                    "storageConnectionRef": ref},
    }  # fmt: skip


async def _answer(t: BullmqTransport, envelope: dict[str, Any]) -> dict[str, Any]:
    """Publish ``envelope`` and return the final outcome answering it."""
    outcomes = t.consume("accord.outcomes", 8)
    try:
        await t.publish("metadata", envelope["messageId"], json.dumps(envelope).encode())
        while True:
            delivery = await asyncio.wait_for(anext(outcomes), 20)
            await t.ack(delivery)
            doc = json.loads(delivery.body)
            if doc["messageType"] in ("succeeded", "failed"):
                return dict(doc)
    finally:
        await outcomes.aclose()  # type: ignore[attr-defined]


async def test_a_sealed_storage_ref_is_opened_and_the_model_measured(
    transport: BullmqTransport,
) -> None:
    token = RING.seal("local")
    final = await _answer(transport, _envelope(token))
    assert final["messageType"] == "succeeded", final
    assert final["payload"]["volume"] == pytest.approx(1.0)


async def test_a_token_under_an_unknown_key_is_refused_not_taken_as_the_value(
    transport: BullmqTransport,
) -> None:
    other = Keyring(("elsewhere", Keyring.generate_key()))
    final = await _answer(transport, _envelope(other.seal("local")))
    assert final["messageType"] == "failed"
    assert (final["payload"]["code"], final["payload"]["retryable"]) == (
        "unsealable-request",
        False,
    )
    assert "elsewhere" in final["payload"]["message"]


async def test_an_opened_value_never_comes_back_in_clear(transport: BullmqTransport) -> None:
    canary = f"canary-{uuid.uuid4().hex}"
    final = await _answer(transport, _envelope(RING.seal(canary)))
    assert final["messageType"] == "failed"
    assert final["payload"]["code"] == "storage-unavailable"
    assert canary not in json.dumps(final)
