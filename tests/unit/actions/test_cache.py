"""The stage result cache: every read outcome, expiry, coalescing, and the key's inputs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accord.actions.cache import ResultCache, cache_key
from accord.contracts.catalog import Catalog
from accord.contracts.sources import load_catalog

ROOT = Path(__file__).resolve().parents[3]
KEY = cache_key("sha256:" + "0" * 64, "metadata.extract@2", {"computeVolume": True}, "acme")
CONTRACT = "technical-metadata@1"
_CATALOG: list[Catalog] = []


def catalog() -> Catalog:
    if not _CATALOG:
        _CATALOG.append(load_catalog(ROOT / "schemas" / "contracts"))
    return _CATALOG[0]


def metadata(model_id: str = "m1") -> dict[str, Any]:
    point = {"x": 0.0, "y": 0.0, "z": 0.0}
    return {
        "modelId": model_id, "format": "stl", "units": "mm", "vertexCount": 8, "faceCount": 12,
        "components": 1, "bounds": {"min": point, "max": {"x": 1.0, "y": 1.0, "z": 1.0}},
        "extents": {"x": 1.0, "y": 1.0, "z": 1.0}, "surfaceArea": 6.0, "volume": 1.0,
        "watertight": True, "windingConsistent": True,
    }  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cache(tmp_path: Path, clock: Clock) -> ResultCache:
    return ResultCache(tmp_path / "cache", catalog=catalog(), now_ms=clock)


def entry_path(cache: ResultCache, key: str) -> Path:
    hexd = key.removeprefix("sha256:")
    return cache.root / "entries" / hexd[:2] / f"{hexd}.json"


def test_hit_returns_the_verified_result(cache: ResultCache) -> None:
    object_key = cache.put(KEY, "acme", CONTRACT, metadata(), ttl_ms=60_000)
    read = cache.get(KEY, "acme")
    assert read.outcome == "hit" and read.hit
    assert read.value is not None and read.value["faceCount"] == 12
    assert read.object_key == object_key and read.digest is not None
    assert read.expires_at_ms == 1_700_000_060_000


def test_only_an_explicit_not_found_is_a_miss(cache: ResultCache) -> None:
    assert cache.get(KEY, "acme").outcome == "miss"


def test_denied_for_a_tenant_without_access_and_for_another_tenants_entry(
    tmp_path: Path, clock: Clock, cache: ResultCache
) -> None:
    cache.put(KEY, "acme", CONTRACT, metadata(), ttl_ms=60_000)
    assert cache.get(KEY, "globex").outcome == "denied"  # the entry is acme's
    fenced = ResultCache(cache.root, catalog=catalog(), now_ms=clock, tenants=frozenset({"acme"}))
    assert fenced.get(KEY, "initech").outcome == "denied"
    assert fenced.get(KEY, "acme").outcome == "hit"


def test_unavailable_when_the_store_cannot_be_read(tmp_path: Path, clock: Clock) -> None:
    (tmp_path / "cache").write_text("a file where the cache directory should be")
    read = ResultCache(tmp_path / "cache", now_ms=clock).get(KEY, "acme")
    assert read.outcome == "unavailable" and "NotADirectoryError" in read.reason


@pytest.mark.parametrize("damage", ["metadata-garbage", "metadata-shape", "object-gone", "tamper"])
def test_corrupt_entries_are_never_hits_or_misses(cache: ResultCache, damage: str) -> None:
    object_key = cache.put(KEY, "acme", CONTRACT, metadata(), ttl_ms=60_000)
    meta_path, obj = entry_path(cache, KEY), cache.object_path(object_key)
    if damage == "metadata-garbage":
        meta_path.write_bytes(b"\x00\x01 not json")
    elif damage == "metadata-shape":
        doc = json.loads(meta_path.read_bytes())
        doc["expiresAtMs"] = "tomorrow"
        meta_path.write_text(json.dumps(doc))
    elif damage == "object-gone":
        obj.unlink()
    else:
        obj.write_bytes(obj.read_bytes().replace(b'"faceCount":12', b'"faceCount":13'))
    assert cache.get(KEY, "acme").outcome == "corrupt"


def test_a_result_breaking_its_contract_is_invalid(cache: ResultCache) -> None:
    broken = metadata() | {"format": "dwg"}
    cache.put(KEY, "acme", CONTRACT, broken, ttl_ms=60_000)
    read = cache.get(KEY, "acme")
    assert read.outcome == "invalid-against-contract" and "format" in read.reason


def test_expiry_is_absolute_and_checked_on_read(cache: ResultCache, clock: Clock) -> None:
    cache.put(KEY, "acme", CONTRACT, metadata(), ttl_ms=1_000)
    clock.now += 999
    assert cache.get(KEY, "acme").outcome == "hit"
    clock.now += 1
    assert cache.get(KEY, "acme").outcome == "expired"


async def test_concurrent_misses_for_one_key_are_filled_once(cache: ResultCache) -> None:
    calls: list[int] = []

    async def fill() -> dict[str, Any]:
        calls.append(1)
        await asyncio.sleep(0.05)
        return metadata()

    results = await asyncio.gather(
        *(cache.get_or_fill(KEY, "acme", CONTRACT, 60_000, fill) for _ in range(8))
    )
    assert len(calls) == 1 and cache.fills == 1
    assert [filled for _, filled in results].count(True) == 1
    assert all(read.outcome == "hit" for read, _ in results)
    again, filled = await cache.get_or_fill(KEY, "acme", CONTRACT, 60_000, fill)
    assert again.hit and not filled and len(calls) == 1


async def test_a_failed_fill_reaches_every_waiter_and_caches_nothing(cache: ResultCache) -> None:
    async def fill() -> dict[str, Any]:
        await asyncio.sleep(0.02)
        raise OSError("renderer gone")

    outcomes = await asyncio.gather(
        *(cache.get_or_fill(KEY, "acme", CONTRACT, 60_000, fill) for _ in range(3)),
        return_exceptions=True,
    )
    assert all(isinstance(o, OSError) for o in outcomes)
    assert cache.get(KEY, "acme").outcome == "miss"


async def test_concurrent_lookups_share_one_read(cache: ResultCache) -> None:
    cache.put(KEY, "acme", CONTRACT, metadata(), ttl_ms=60_000)
    reads = await asyncio.gather(*(cache.fetch(KEY, "acme") for _ in range(6)))
    assert all(r.hit for r in reads) and cache.reads == 1


parts = st.tuples(
    st.text("0123456789abcdef", min_size=64, max_size=64).map(lambda h: f"sha256:{h}"),
    st.sampled_from(["thumbnail.render@3", "thumbnail.render@4", "metadata.extract@2"]),
    st.dictionaries(st.sampled_from(["maxEdge", "previewType"]), st.integers(0, 9), max_size=2),
    st.sampled_from(["acme", "globex"]),
)


@given(parts, parts)
def test_the_key_covers_input_capability_parameters_and_tenant(a: Any, b: Any) -> None:
    assert (cache_key(*a) == cache_key(*b)) == (a == b)
