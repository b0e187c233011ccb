"""The stage-result cache on a real S3 server (SeaweedFS): every read outcome produced for real —
hit, miss (explicit not-found), denied (an identity without read access), unavailable (the server
stopped), corrupt (the object altered), invalid-against-contract, expired — plus conditional
writes across two cache instances and coalesced misses."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.services import SeaweedFS, ensure_seaweedfs

from accord.actions.cache import ResultCache, cache_key
from accord.adapters.objects.s3 import S3ObjectStore
from accord.contracts.catalog import Catalog
from accord.contracts.sources import load_catalog

ROOT = Path(__file__).resolve().parents[2]
KEY = cache_key("sha256:" + "1" * 64, "metadata.extract@2", {"computeVolume": True}, "acme")
CONTRACT = "technical-metadata@1"
BUCKET = "accord-cache"
_CATALOG: list[Catalog] = []


def catalog() -> Catalog:
    if not _CATALOG:
        _CATALOG.append(load_catalog(ROOT / "schemas" / "contracts"))
    return _CATALOG[0]


def metadata(model_id: str = "m1", faces: int = 12) -> dict[str, Any]:
    point = {"x": 0.0, "y": 0.0, "z": 0.0}
    return {
        "modelId": model_id, "format": "stl", "units": "mm", "vertexCount": 8, "faceCount": faces,
        "components": 1, "bounds": {"min": point, "max": {"x": 1.0, "y": 1.0, "z": 1.0}},
        "extents": {"x": 1.0, "y": 1.0, "z": 1.0}, "surfaceArea": 6.0, "volume": 1.0,
        "watertight": True, "windingConsistent": True,
    }  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


_opened: list[S3ObjectStore] = []


def s3(server: SeaweedFS, prefix: str, identity: str = "admin") -> S3ObjectStore:
    access, secret = server.credentials(identity)
    store = S3ObjectStore(BUCKET, endpoint=server.endpoint, prefix=prefix, access_key=access,
                          secret_key=secret)  # fmt: skip
    if identity == "admin":
        store.ensure_bucket()
    _opened.append(store)
    return store


@pytest.fixture(autouse=True)
def _close() -> Iterator[None]:
    yield
    while _opened:
        _opened.pop().close()


@pytest.fixture
def prefix() -> str:
    return f"c-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cache(prefix: str, clock: Clock) -> ResultCache:
    return ResultCache(store=s3(ensure_seaweedfs(), prefix), catalog=catalog(), now_ms=clock)


def test_hit_after_put_and_miss_only_on_explicit_not_found(cache: ResultCache) -> None:
    assert cache.get(KEY, "acme").outcome == "miss"
    object_key = cache.put(KEY, "acme", CONTRACT, metadata(), ttl_ms=60_000)
    read = cache.get(KEY, "acme")
    assert read.outcome == "hit" and read.value is not None and read.value["faceCount"] == 12
    assert read.object_key == object_key and object_key.startswith("cache/objects/sha256/")
    assert read.expires_at_ms == 1_700_000_060_000


def test_denied_for_an_identity_without_read_access(prefix: str, clock: Clock) -> None:
    server = ensure_seaweedfs()
    full = ResultCache(store=s3(server, prefix), catalog=catalog(), now_ms=clock)
    full.put(KEY, "acme", CONTRACT, metadata(), ttl_ms=60_000)
    writer = ResultCache(store=s3(server, prefix, "writer"), catalog=catalog(), now_ms=clock)
    read = writer.get(KEY, "acme")
    assert read.outcome == "denied" and "AccessDenied" in read.reason
    absent = cache_key("sha256:" + "2" * 64, "metadata.extract@2", {}, "acme")
    assert writer.get(absent, "acme").outcome == "denied"  # never a miss without read access
    assert full.get(KEY, "globex").outcome == "denied"  # another tenant's entry


def test_unavailable_when_the_server_is_stopped(tmp_path: Path, clock: Clock) -> None:
    server = SeaweedFS(tmp_path / "seaweed").start()
    try:
        cache = ResultCache(store=s3(server, "p"), catalog=catalog(), now_ms=clock)
        cache.put(KEY, "acme", CONTRACT, metadata(), ttl_ms=60_000)
        assert cache.get(KEY, "acme").outcome == "hit"
        server.stop()
        read = cache.get(KEY, "acme")
        assert read.outcome == "unavailable", read
        assert "cannot be reached" in read.reason
        server.start()
        assert cache.get(KEY, "acme").outcome == "hit"  # the data survived the restart
    finally:
        server.stop()


@pytest.mark.parametrize("damage", ["object-altered", "object-deleted", "entry-garbage"])
def test_corrupt_when_the_stored_bytes_are_altered(
    cache: ResultCache, prefix: str, damage: str
) -> None:
    object_key = cache.put(KEY, "acme", CONTRACT, metadata(), ttl_ms=60_000)
    raw = s3(ensure_seaweedfs(), prefix)
    if damage == "object-altered":
        blob = raw.get(object_key).data.replace(b'"faceCount":12', b'"faceCount":13')
        raw.put(object_key, blob)
    elif damage == "object-deleted":
        raw.delete(object_key)
    else:
        raw.put(cache.entry_key(KEY), b"\x00 not json")
    read = cache.get(KEY, "acme")
    assert read.outcome == "corrupt", read


def test_invalid_against_contract(cache: ResultCache) -> None:
    cache.put(KEY, "acme", CONTRACT, metadata() | {"format": "dwg"}, ttl_ms=60_000)
    read = cache.get(KEY, "acme")
    assert read.outcome == "invalid-against-contract" and "format" in read.reason


def test_expiry_is_the_documents_absolute_time_not_object_metadata(
    cache: ResultCache, clock: Clock, prefix: str
) -> None:
    cache.put(KEY, "acme", CONTRACT, metadata(), ttl_ms=1_000)
    raw = s3(ensure_seaweedfs(), prefix)
    entry = raw.get(cache.entry_key(KEY))
    assert entry.metadata["accord-expires-at"] == "2023-11-14T22:13:21.000Z"
    # metadata named TTL expires nothing: rewrite the entry with a 0-second "ttl" header
    raw.put(cache.entry_key(KEY), entry.data, metadata={"ttl": "0", "expires": "0"})
    clock.now += 999
    assert cache.get(KEY, "acme").outcome == "hit"
    clock.now += 1
    read = cache.get(KEY, "acme")
    assert read.outcome == "expired" and "2023-11-14T22:13:21.000Z" in read.reason


def test_concurrent_writers_in_two_processes_write_one_entry(prefix: str, clock: Clock) -> None:
    server = ensure_seaweedfs()
    caches = [ResultCache(store=s3(server, prefix), catalog=catalog(), now_ms=clock)
              for _ in range(4)]  # fmt: skip
    barrier = threading.Barrier(len(caches))

    def write(n: int) -> None:
        barrier.wait()
        caches[n].put(KEY, "acme", CONTRACT, metadata(faces=12 + n), ttl_ms=60_000)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(len(caches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reads = [c.get(KEY, "acme") for c in caches]
    assert all(r.hit for r in reads)
    assert len({r.digest for r in reads}) == 1  # one entry stands, the same for every reader
    raw = s3(server, prefix)
    assert len(raw.list("cache/entries/")) == 1


async def test_concurrent_misses_fill_once_and_stale_entries_are_replaced(
    cache: ResultCache, clock: Clock
) -> None:
    calls: list[int] = []

    async def fill() -> dict[str, Any]:
        calls.append(1)
        await asyncio.sleep(0.05)
        return metadata(faces=12 + len(calls))

    results = await asyncio.gather(
        *(cache.get_or_fill(KEY, "acme", CONTRACT, 1_000, fill) for _ in range(8))
    )
    assert len(calls) == 1 and [filled for _, filled in results].count(True) == 1
    assert all(read.hit for read, _ in results)
    clock.now += 1_000  # expired: the next fill replaces the entry
    again, filled = await cache.get_or_fill(KEY, "acme", CONTRACT, 1_000, fill)
    assert filled and again.hit and again.value is not None and again.value["faceCount"] == 14
    doc = json.loads(cache.store.get(cache.entry_key(KEY)).data)
    assert doc["expiresAtMs"] == clock.now + 1_000
