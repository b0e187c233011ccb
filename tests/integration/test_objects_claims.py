"""Claim checks on both object stores (a directory, real SeaweedFS): a payload above the
threshold round-trips as ``payloadRef`` and the envelope stays valid against ``envelope@2``; a
tampered, truncated, missing or another tenant's claim is refused, terminally."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.services import ensure_seaweedfs

from accord.adapters.objects.s3 import S3ObjectStore
from accord.contracts.sources import load_catalog
from accord.contracts.validate import Validator
from accord.errors import StageFailed
from accord.objects.claims import (
    THRESHOLD_BYTES,
    check_in,
    check_in_result,
    check_out,
    check_out_result,
)
from accord.objects.fs import FileObjectStore
from accord.objects.ports import ObjectStore

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["fs", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "fs":
        yield FileObjectStore(tmp_path / "objects")
        return
    server = ensure_seaweedfs()
    access, secret = server.credentials()
    s3 = S3ObjectStore("accord-claims", endpoint=server.endpoint, access_key=access,
                       secret_key=secret, prefix=f"k-{uuid.uuid4().hex[:10]}")  # fmt: skip
    s3.ensure_bucket()
    yield s3
    s3.close()


def envelope(payload: dict[str, Any], tenant: str = "acme") -> dict[str, Any]:
    return {
        "messageId": "msg_1", "messageType": "metadata-extraction-request", "contractVersion": 1,
        "correlationId": "run_1", "causationId": None, "producer": "accord-engine",
        "tenant": tenant, "occurredAt": "2026-12-01T10:00:00.000Z", "payload": payload,
    }  # fmt: skip


def big(n: int = THRESHOLD_BYTES + 10) -> dict[str, Any]:
    return {"modelId": "m1", "notes": "x" * n}


def test_a_payload_above_the_threshold_round_trips_as_a_claim_check(store: ObjectStore) -> None:
    sent = check_in(envelope(big()), store)
    assert "payload" not in sent and set(sent["payloadRef"]) == {"digest", "objectKey", "sizeBytes"}
    assert sent["payloadRef"]["sizeBytes"] > THRESHOLD_BYTES
    assert sent["payloadRef"]["objectKey"].startswith("claims/acme/sha256/")
    contract = load_catalog(ROOT / "schemas" / "contracts").message("envelope@2")
    assert contract is not None
    assert Validator.for_contract(contract).validate(sent).ok
    assert check_out(sent, store)["payload"] == big()
    small = check_in(envelope({"modelId": "m1"}), store)
    assert small["payload"] == {"modelId": "m1"} and "payloadRef" not in small


@pytest.mark.parametrize("damage", ["bytes", "truncate", "delete", "size", "digest"])
def test_a_tampered_claim_is_a_terminal_corrupt_payload(store: ObjectStore, damage: str) -> None:
    sent = check_in(envelope(big()), store)
    ref = sent["payloadRef"]
    blob = store.get(ref["objectKey"]).data
    if damage == "bytes":
        store.put(ref["objectKey"], blob.replace(b"xxxx", b"xxyx", 1))
    elif damage == "truncate":
        store.put(ref["objectKey"], blob[:-1])
    elif damage == "delete":
        store.delete(ref["objectKey"])
    elif damage == "size":
        ref["sizeBytes"] += 1
    else:
        ref["digest"] = "sha256:" + "0" * 64
    with pytest.raises(StageFailed) as refused:
        check_out(sent, store)
    code = "storage-ref-denied" if damage == "digest" else "corrupt-payload"
    assert refused.value.failure_code == code and not refused.value.retryable


def test_another_tenants_claim_is_refused(store: ObjectStore) -> None:
    sent = check_in(envelope(big()), store)
    stolen = envelope({}, tenant="globex") | {"payloadRef": sent["payloadRef"]}
    del stolen["payload"]
    with pytest.raises(StageFailed) as refused:
        check_out(stolen, store)
    assert refused.value.failure_code == "storage-ref-denied"


def test_a_large_result_round_trips_and_a_tampered_one_is_refused(store: ObjectStore) -> None:
    result = big()
    claimed = check_in_result(result, store, "acme")
    assert set(claimed) == {"payloadRef"}
    assert check_out_result(claimed, store, "acme") == result
    assert check_in_result({"modelId": "m1"}, store, "acme") == {"modelId": "m1"}
    key = claimed["payloadRef"]["objectKey"]
    store.put(key, store.get(key).data.replace(b'"m1"', b'"m2"'))
    with pytest.raises(StageFailed) as refused:
        check_out_result(claimed, store, "acme")
    assert refused.value.failure_code == "corrupt-payload"
