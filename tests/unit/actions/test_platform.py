"""The platform actions as the engine calls them: cache.lookup@1, catalogue.publish@2 and
audit.run-terminal@1 over real files, with every answer checked against its result contract."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from accord.actions import Platform, PlatformConfig, register_platform_actions
from accord.contracts.validate import Validator
from accord.engine.runtime.actions import ActionContext, ActionRegistry
from tests.unit.actions.test_cache import Clock, catalog, metadata

ANALYSIS = {
    "modelId": "m1",
    "descriptors": ["elongated"],
    "tags": [{"label": f"tag {i}", "confidence": 0.5} for i in range(30)],
    "confidence": 0.7,
}
THUMB = {"modelId": "m1", "previews": [{
    "previewType": "gallery", "objectKey": "thumbs/m1.png", "contentType": "image/png",
    "width": 64, "height": 64, "sizeBytes": 10, "digest": "sha256:" + "ab" * 32}]}  # fmt: skip
RESULTS: dict[str, dict[str, Any]] = {"thumbnail.render@3": THUMB, "semantic.analyse@4": ANALYSIS,
           "metadata.extract@2": metadata()}  # fmt: skip


def ctx(capability: str, *, tenant: str = "acme", key: str = "idem_1", run: str = "run_1") -> Any:
    envelope = {"definitionDigest": "sha256:" + "cd" * 32, "idempotencyKey": key}
    return ActionContext(run, "publish", 1, "f", capability, key, tenant, envelope)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def platform(tmp_path: Path, clock: Clock) -> Any:
    model = tmp_path / "objects" / "acme" / "models" / "m1.stl"
    model.parent.mkdir(parents=True)
    model.write_bytes(b"solid m1\nendsolid m1\n")
    runs = {"run_1": {"context": {"modelId": "m1"}, "contracts": {"catalogue.publish": "2"}}}

    async def load_run(run_id: str) -> Any:
        return runs.get(run_id)

    config = PlatformConfig(tmp_path, catalog=catalog(), load_run=load_run, now_ms=clock)
    p = register_platform_actions(ActionRegistry(), config)
    yield p
    p.close()


async def call(p: Platform, capability: str, payload: dict[str, Any], **kw: Any) -> Any:
    registry = ActionRegistry()
    registry2 = register_platform_actions(registry, p.config)  # same files, fresh handlers
    handler = registry.get(capability)
    assert handler is not None
    try:
        result = await handler(payload, ctx(capability, **kw))
    finally:
        registry2.close()
    contract = catalog().message(str(catalog().capability(capability).result))  # type: ignore[union-attr]
    assert contract is not None
    checked = Validator.for_contract(contract).validate(result)
    assert checked.ok, checked.violations
    return result


def fill(p: Platform, skip: str | None = None) -> None:
    for capability, result in RESULTS.items():
        if capability != skip:
            assert p.writer.write("acme", "m1", capability, result)


async def test_lookup_misses_then_hits_once_every_result_is_cached(platform: Platform) -> None:
    first = await call(platform, "cache.lookup@1", {"modelId": "m1"})
    assert first["hit"] is False and first["outcome"] == "miss" and first["results"] == []
    fill(platform, skip="metadata.extract@2")
    partial = await call(platform, "cache.lookup@1", {"modelId": "m1"})
    assert partial["outcome"] == "miss"  # all or nothing: the workers still run
    fill(platform)
    hit = await call(platform, "cache.lookup@1", {"modelId": "m1"})
    assert hit["hit"] is True and hit["outcome"] == "hit"
    assert {r["contract"] for r in hit["results"]} == {
        "thumbnail-generated@1", "semantic-analysis@1", "technical-metadata@1"}  # fmt: skip
    assert hit["cacheKey"] == first["cacheKey"] and hit["expiresAt"] is not None


async def test_lookup_reports_the_most_serious_outcome(platform: Platform, clock: Clock) -> None:
    fill(platform)
    key = platform.cache.root / "entries"
    victim = sorted(key.rglob("*.json"))[0]
    victim.write_text("{")
    assert (await call(platform, "cache.lookup@1", {"modelId": "m1"}))["outcome"] == "corrupt"
    clock.now += platform.config.ttl_ms
    assert (await call(platform, "cache.lookup@1", {"modelId": "m1"}))["outcome"] == "corrupt"
    fill(platform)
    clock.now += platform.config.ttl_ms
    assert (await call(platform, "cache.lookup@1", {"modelId": "m1"}))["outcome"] == "expired"


async def test_lookup_is_denied_to_a_tenant_without_access(platform: Platform) -> None:
    platform.config.tenants = frozenset({"globex"})
    platform.config._cache = None
    result = await call(platform, "cache.lookup@1", {"modelId": "m1"})
    assert result == {"hit": False, "outcome": "denied", "expiresAt": None, "results": []}


async def test_lookup_of_an_unknown_model_is_not_a_miss(platform: Platform) -> None:
    result = await call(platform, "cache.lookup@1", {"modelId": "nope"})
    assert result["outcome"] == "unavailable" and not result["hit"]


async def test_publish_is_idempotent_under_duplicate_delivery(platform: Platform) -> None:
    fill(platform)
    copies = await asyncio.gather(
        *(call(platform, "catalogue.publish@2", {"modelId": "m1"}, key="idem_A") for _ in range(4))
    )
    assert all(c == copies[0] for c in copies)
    rows = platform.catalogue.rows()
    assert len(rows) == 1 and rows[0]["revision"] == 1
    entry, produced = rows[0]["entry"], rows[0]["producedBy"]
    assert entry == copies[0] and entry["policy"] == "marketplace-listing-limits@1"
    assert len(entry["tags"]) == 20  # the policy's maxTags, not the analysis's 30
    assert produced["policyDigest"].startswith("sha256:")
    assert produced["contracts"] == {"catalogue.publish": "2"}
    assert "semantic-analysis@1" in produced["derivedFrom"]
    later = await call(platform, "catalogue.publish@2", {"modelId": "m1"}, key="idem_B")
    rows = platform.catalogue.rows()
    assert len(rows) == 1 and rows[0]["revision"] == 2 and later["entryId"] == entry["entryId"]


async def test_publish_lists_only_allowed_formats_that_are_not_private(
    platform: Platform,
) -> None:
    fill(platform)
    public = await call(platform, "catalogue.publish@2", {"modelId": "m1", "visibility": "public"})
    assert public["status"] == "listed"
    private = await call(platform, "catalogue.publish@2", {"modelId": "m1"}, key="idem_P")
    assert private["status"] == "draft"


async def test_audit_writes_one_record_per_run(platform: Platform) -> None:
    payload = {"runId": "run_1", "workflow": "model-ingest", "intent": "completed", "error": None}
    first = await call(platform, "audit.run-terminal@1", payload)
    again = await call(platform, "audit.run-terminal@1", payload | {"intent": "failed"})
    assert first == again and first["terminalState"] == "completed"
    assert first["modelId"] == "m1"
    assert platform.audit.rows() == [first]
