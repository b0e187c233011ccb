"""The Etsy connector against the Etsy test double over real sockets: one listing per model
whatever is repeated, every class of Etsy rejection, and the policy artefact applied and recorded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from accord_worker_marketplace_etsy.claims import PREFIX, CreateClaims
from accord_worker_marketplace_etsy.client import EtsyClient
from accord_worker_marketplace_etsy.handler import external_id, publish
from accord_worker_marketplace_etsy.wire import to_form
from tests.etsy_double.app import EtsyDouble, Fault, serve
from tests.etsy_double.support import (
    CONTRACTS,
    config,
    context,
    png,
    refresh,
    request,
    thumbnails,
)

from accord.contracts.sources import load_catalog
from accord.objects.fs import FileObjectStore
from accord.worker.sdk import RetryableError, TerminalError
from accord.worker.storage import StorageMap


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


def test_create_claims_one_winner_a_dead_holder_superseded_and_released(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path / "claims")
    live = CreateClaims(store, lease_s=60, owner="a")
    dead = CreateClaims(store, lease_s=0, owner="dead")  # its claims are expired when written
    first = live.take(1, "acc-0123456789abcdef")
    assert first is not None and first.generation == 1
    assert CreateClaims(store, owner="b").take(1, "acc-0123456789abcdef") is None  # live: held
    assert live.take(1, "acc-0123456789abcdef") is None  # even for its own owner: one at a time
    assert CreateClaims(store).take(1, "acc-fedcba9876543210") is not None  # another id: free
    live.release(first)
    gone = dead.take(1, "acc-0123456789abcdef")
    assert gone is not None and gone.generation == 1  # released: the generation is free again
    taken = CreateClaims(store, owner="c").take(1, "acc-0123456789abcdef")
    assert taken is not None and taken.generation == 2, "an expired claim is superseded"
    prefix = f"{PREFIX}/1/acc-0123456789abcdef/"
    assert store.list(prefix) == [f"{prefix}00000001.json", f"{prefix}00000002.json"]
    CreateClaims(store).release(taken)
    assert store.list(prefix) == []  # the claim and the one it superseded


def _with_images(root: Path, model_id: str = "cube") -> dict[str, object]:
    return request(model_id) | {"previewKeys": thumbnails(root, "demo", model_id)}


def _ranked(double: EtsyDouble) -> list[tuple[int, str, int]]:
    """(rank, file name, width) of every image on the one listing."""
    (listing_id,) = double.listings
    return [(i["rank"], i["_file"], i["full_width"]) for i in double.images[listing_id]]


def test_images_are_uploaded_once_at_their_ranks_and_a_repeat_uploads_nothing(
    double: EtsyDouble, url: str, policies: Path, tmp_path: Path
) -> None:
    storage = StorageMap.local(tmp_path / "objects")
    ctx = context(config(url, policies), storage=storage)
    payload = _with_images(tmp_path / "objects")
    first = publish(payload, ctx)
    ext = first["externalId"]
    assert _ranked(double) == [(1, f"{ext}-1.png", 64), (2, f"{ext}-2.png", 65)]
    # the listing's images were read before the uploads
    assert double.received[-3:] == ["getListingImages", "uploadListingImage", "uploadListingImage"]
    again = publish(payload, ctx)  # a duplicate delivery, a retry, another run of the model
    assert again["reconciled"] is True and again["listingId"] == first["listingId"]
    assert len(double.uploads) == 2 and double.received[-1] == "getListingImages"
    assert double.count("createListing") == 1


def test_an_upload_whose_answer_is_lost_is_found_not_repeated(
    double: EtsyDouble, url: str, policies: Path, tmp_path: Path
) -> None:
    double.slow_upload_after_write(1.5, times=1)  # stored, the answer after the client quit
    storage = StorageMap.local(tmp_path / "objects")
    ctx = context(config(url, policies, read_timeout_s=0.5), storage=storage)
    result = publish(_with_images(tmp_path / "objects"), ctx)
    ext = result["externalId"]
    assert _ranked(double) == [(1, f"{ext}-1.png", 64), (2, f"{ext}-2.png", 65)]
    assert len(double.uploads) == 2, "the first image was not uploaded a second time"
    assert double.received.count("getListingImages") == 2  # before, and after the lost answer


def test_an_attempt_that_failed_between_create_and_upload_is_completed_by_the_next(
    double: EtsyDouble, url: str, policies: Path, tmp_path: Path
) -> None:
    double.inject("uploadListingImage", Fault(503))  # nothing stored, the create stands
    storage = StorageMap.local(tmp_path / "objects")
    cfg = config(url, policies)
    payload = _with_images(tmp_path / "objects")
    with pytest.raises(RetryableError) as failed:
        publish(payload, context(cfg, attempt=1, storage=storage))
    assert failed.value.failure_code == "ambiguous-upload"
    assert len(double.listings) == 1 and double.images == {}
    result = publish(payload, context(cfg, attempt=2, storage=storage))
    assert result["reconciled"] is True
    ext = result["externalId"]
    assert _ranked(double) == [(1, f"{ext}-1.png", 64), (2, f"{ext}-2.png", 65)]
    assert double.count("createListing") == 1


def test_the_double_checks_the_upload_against_the_document(
    double: EtsyDouble, url: str, policies: Path
) -> None:
    client = EtsyClient(config(url, policies), "token-shop-1")
    try:
        listing = client.create_listing(1, to_form(request()["listing"]))
        listing_id = int(listing["listing_id"])
        with pytest.raises(TerminalError) as not_image:
            client.upload_image(1, listing_id, "x.png", b"not an image", 1)
        assert not_image.value.failure_code == "image-rejected"
        assert "image: not a JPEG, PNG or GIF" in not_image.value.reason
        with pytest.raises(TerminalError) as no_listing:
            client.upload_image(1, listing_id + 999, "x.png", png(4, 4), 1)
        assert no_listing.value.failure_code == "shop-not-found"  # Etsy's 404
        assert client.listing_images(1, listing_id) == []
    finally:
        client.close()
    base = {"x-api-key": "double-api-key", "authorization": "Bearer token-shop-1"}
    path = f"{url}/v3/application/shops/1/listings/{listing_id}/images"
    as_form = httpx.post(path, data={"rank": "1"}, headers=base)
    assert as_form.status_code == 400 and "multipart/form-data" in as_form.json()["error"]
    bad_rank = httpx.post(path, files={"image": ("a.png", png(2, 2))}, data={"rank": "x"},
                          headers=base)  # fmt: skip
    assert bad_rank.status_code == 400 and "rank" in bad_rank.json()["error"]
    not_a_file = httpx.post(path, files={"rank": (None, "1"), "image": (None, "text")},
                            headers=base)  # fmt: skip
    assert not_a_file.status_code == 400 and "file part" in not_a_file.json()["error"]
    read_only = httpx.post(path, files={"image": ("a.png", png(2, 2))},
                           headers=base | {"authorization": "Bearer token-read-only"})  # fmt: skip
    assert read_only.status_code == 403  # uploadListingImage needs the listings_w scope
    ok = httpx.post(path, files={"image": ("a.png", png(3, 2))}, headers=base)
    assert ok.status_code == 200 and ok.json()["rank"] == 1 and ok.json()["full_width"] == 3
