"""The Etsy connector against the Etsy test double over real sockets: one listing per model
whatever is repeated, every class of Etsy rejection, and the policy artefact applied and recorded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from accord_worker_marketplace_etsy.client import EtsyClient
from accord_worker_marketplace_etsy.handler import external_id, publish
from accord_worker_marketplace_etsy.wire import to_form
from tests.etsy_double.app import EtsyDouble, Fault, serve
from tests.etsy_double.support import CONTRACTS, config, context, refresh, request

from accord.contracts.sources import load_catalog
from accord.worker.sdk import RetryableError, TerminalError


@pytest.fixture
def double() -> EtsyDouble:
    return EtsyDouble(tokens={"token-shop-1": ("listings_r", "listings_w"),
                              "token-read-only": ("listings_r",)})  # fmt: skip


@pytest.fixture
def url(double: EtsyDouble) -> Iterator[str]:
    with serve(double) as base:
        yield base


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    folder = tmp_path / "policies"
    refresh(folder, tmp_path)
    return folder


def test_a_publication_creates_one_listing_carrying_its_external_id(
    double: EtsyDouble, url: str, policies: Path
) -> None:
    result = publish(request(), context(config(url, policies)))
    ext = external_id("demo", 1, "cube")
    assert result["externalId"] == ext and result["reconciled"] is False
    assert result["policy"] == "marketplace-listing-limits/etsy@1"
    assert double.count("createListing", 201) == 1
    (stored,) = double.listings.values()
    assert stored["listing_id"] == result["listingId"] and ext in stored["tags"]
    # the reconciliation query came first, before the create
    assert double.received == ["findAllActiveListingsByShop", "createListing"]


def test_a_repeated_publication_reconciles_and_creates_nothing(
    double: EtsyDouble, url: str, policies: Path
) -> None:
    cfg = config(url, policies)
    first = publish(request(), context(cfg, run_id="r1"))
    again = publish(request(), context(cfg, run_id="r1", attempt=2))
    other_run = publish(request(), context(cfg, run_id="r2"))
    assert again["listingId"] == other_run["listingId"] == first["listingId"]
    assert again["reconciled"] and other_run["reconciled"]
    assert double.count("createListing") == 1 and len(double.listings) == 1


def test_concurrent_deliveries_of_one_job_create_one_listing(
    double: EtsyDouble, url: str, policies: Path
) -> None:
    double.slow_after_write(0.5)  # the first create is in flight while the others arrive
    cfg = config(url, policies)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: publish(request(), context(cfg)), range(4)))
    assert len({r["listingId"] for r in results}) == 1
    assert sum(not r["reconciled"] for r in results) == 1
    assert double.received.count("createListing") == 1 and len(double.listings) == 1


def test_another_tenant_or_model_is_another_listing(
    double: EtsyDouble, url: str, policies: Path
) -> None:
    cfg = config(url, policies)
    a = publish(request("cube"), context(cfg, tenant="demo"))
    b = publish(request("cube"), context(cfg, tenant="other"))
    c = publish(request("torus"), context(cfg, tenant="demo"))
    assert len({a["listingId"], b["listingId"], c["listingId"]}) == 3
    assert len({a["externalId"], b["externalId"], c["externalId"]}) == 3


def test_a_timeout_after_the_write_is_reconciled_not_created_again(
    double: EtsyDouble, url: str, policies: Path
) -> None:
    double.slow_after_write(3.0)
    result = publish(request(), context(config(url, policies, read_timeout_s=0.5)))
    assert result["reconciled"] is True
    assert len(double.listings) == 1
    assert double.received == [
        "findAllActiveListingsByShop", "createListing", "findAllActiveListingsByShop"
    ]  # fmt: skip


def test_a_server_error_on_create_is_retryable_and_the_retry_reconciles_first(
    double: EtsyDouble, url: str, policies: Path
) -> None:
    double.inject("createListing", Fault(503, retry_after=1))
    cfg = config(url, policies)
    with pytest.raises(RetryableError) as failed:
        publish(request(), context(cfg))
    assert failed.value.failure_code == "ambiguous-create" and failed.value.retryable
    result = publish(request(), context(cfg, attempt=2))
    assert result["reconciled"] is False and len(double.listings) == 1
    assert double.received == [
        "findAllActiveListingsByShop", "createListing", "findAllActiveListingsByShop",  # 1st
        "findAllActiveListingsByShop", "createListing",  # the retry reconciles before creating
    ]  # fmt: skip


def test_a_rate_limit_is_honoured_for_its_retry_after(
    double: EtsyDouble, url: str, policies: Path
) -> None:
    double.inject("findAllActiveListingsByShop", Fault(429, retry_after=1))
    began = time.monotonic()
    result = publish(request(), context(config(url, policies)))
    assert time.monotonic() - began >= 1.0
    assert result["listingId"] and double.count("findAllActiveListingsByShop", 429) == 1


def test_a_rate_limit_longer_than_an_attempt_waits_is_retryable(
    double: EtsyDouble, url: str, policies: Path
) -> None:
    double.inject("findAllActiveListingsByShop", Fault(429, retry_after=120))
    with pytest.raises(RetryableError) as failed:
        publish(request(), context(config(url, policies)))
    assert failed.value.failure_code == "rate-limited" and "Retry-After 120" in failed.value.reason
    assert double.listings == {}


def test_repeated_server_errors_are_retryable(double: EtsyDouble, url: str, policies: Path) -> None:
    double.inject("findAllActiveListingsByShop", Fault(500, times=3, retry_after=0))
    with pytest.raises(RetryableError) as failed:
        publish(request(), context(config(url, policies)))
    assert failed.value.failure_code == "marketplace-unavailable"
    assert double.count("findAllActiveListingsByShop", 500) == 3


def test_a_validation_rejection_is_terminal_with_the_field_paths(
    double: EtsyDouble, url: str, policies: Path
) -> None:
    double.inject("createListing", Fault(400, error="title: too long; who_made: not allowed"))
    with pytest.raises(TerminalError) as failed:
        publish(request(), context(config(url, policies)))
    assert failed.value.failure_code == "listing-rejected" and not failed.value.retryable
    assert "listing.title, listing.whoMade" in failed.value.reason


@pytest.mark.parametrize(("ref", "status"), [("revoked", 401), ("read-only-shop", 403)])
def test_an_auth_rejection_is_terminal_and_alerts_without_the_token(
    url: str, policies: Path, caplog: pytest.LogCaptureFixture, ref: str, status: int
) -> None:
    with caplog.at_level(logging.ERROR, logger="accord.alerts"), pytest.raises(TerminalError) as f:
        publish(request(ref=ref), context(config(url, policies)))
    assert f.value.failure_code == "marketplace-auth" and str(status) in f.value.reason
    alerts = [r for r in caplog.records if r.name == "accord.alerts"]
    assert alerts and str(status) in alerts[0].getMessage()
    assert not any(t in r.getMessage() for r in caplog.records for t in ("gone", "token-read"))


def test_an_unknown_credentials_reference_is_terminal_before_any_call(
    double: EtsyDouble, url: str, policies: Path
) -> None:
    with pytest.raises(TerminalError) as failed:
        publish(request(ref="nobody"), context(config(url, policies)))
    assert failed.value.failure_code == "credentials-unknown" and double.calls == []


def test_an_unknown_shop_is_terminal(double: EtsyDouble, url: str, policies: Path) -> None:
    body = request() | {"shopId": 7}
    with pytest.raises(TerminalError) as failed:
        publish(body, context(config(url, policies)))
    assert failed.value.failure_code == "shop-not-found"


def test_an_unreachable_etsy_is_retryable(tmp_path: Path, policies: Path) -> None:
    with pytest.raises(RetryableError) as failed:
        publish(request(), context(config("http://127.0.0.1:9", policies)))
    assert failed.value.failure_code == "marketplace-unavailable"


def test_a_listing_off_the_etsy_contract_is_terminal_with_its_path(
    double: EtsyDouble, url: str, policies: Path
) -> None:
    with pytest.raises(TerminalError) as failed:
        publish(request(whoMade="a_robot"), context(config(url, policies)))
    assert (
        failed.value.failure_code == "invalid-listing" and "listing.whoMade" in failed.value.reason
    )
    assert double.calls == []


def test_a_policy_refresh_changes_the_verdict_without_a_contract_change(
    tmp_path: Path, double: EtsyDouble, url: str
) -> None:
    policies = tmp_path / "policies"
    before = dict(_digests())
    first = refresh(policies, tmp_path)
    cfg = config(url, policies)
    ok = publish(request("cube"), context(cfg))
    assert ok["policy"] == first["version"] == "marketplace-listing-limits/etsy@1"
    assert ok["policyDigest"] == first["digest"]
    stricter = refresh(policies, tmp_path, maxTags=2, taxonomyIds=[66])
    assert stricter["version"] == "marketplace-listing-limits/etsy@2" and stricter["written"]
    with pytest.raises(TerminalError) as refused:
        publish(request("torus"), context(cfg))
    reason = refused.value.reason
    assert refused.value.failure_code == "policy-violation"
    assert reason.startswith("marketplace-listing-limits/etsy@2 refuses")
    assert "listing.tags: 3 tags, more than 2" in reason and "listing.taxonomyId" in reason
    assert len(double.listings) == 1  # nothing was sent for the refused listing
    assert dict(_digests()) == before, "a policy change is no contract change"
    assert refresh(policies, tmp_path, maxTags=2, taxonomyIds=[66])["written"] is False


def test_a_tampered_policy_artefact_is_not_applied(
    tmp_path: Path, double: EtsyDouble, url: str
) -> None:
    policies = tmp_path / "policies"
    refresh(policies, tmp_path)
    current = policies / "etsy" / "marketplace-listing-limits" / "current.json"
    current.write_text(current.read_text().replace('"maxTags": 13', '"maxTags": 99'))
    with pytest.raises(RetryableError) as failed:
        publish(request(), context(config(url, policies)))
    assert failed.value.failure_code == "policy-unavailable" and "digest" in failed.value.reason
    assert double.calls == []


@pytest.mark.parametrize("duplicates", ["create", "reject"])
def test_the_double_repeats_a_blind_create_as_configured(
    double: EtsyDouble, url: str, policies: Path, duplicates: str
) -> None:
    """What the connector guards against: Etsy itself makes a second listing for a second
    identical create (``create``); the double can refuse it instead (``reject``)."""
    double.duplicates = duplicates  # type: ignore[assignment]
    client = EtsyClient(config(url, policies), "token-shop-1")
    form = to_form(request()["listing"])
    try:
        client.create_listing(1, form)
        if duplicates == "create":
            client.create_listing(1, form)
            assert len(double.listings) == 2
        else:
            with pytest.raises(TerminalError, match="duplicate of listing"):
                client.create_listing(1, form)
            assert len(double.listings) == 1
    finally:
        client.close()


def _digests() -> list[tuple[str, str]]:
    catalog = load_catalog(CONTRACTS)
    return [(f"{c.kind}:{c.ref}", catalog.digest(c)) for c in catalog]
