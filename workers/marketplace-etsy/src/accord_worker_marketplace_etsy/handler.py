"""``marketplace.etsy.prepare-listing@1`` and ``marketplace.etsy.publish-listing@2`` (and @1).

Publishing is irreversible and Etsy's createListing takes no idempotency key, so the connector
makes a create safe to repeat itself:

1. the listing carries a deterministic external id, ``acc-`` + 16 hex digits of
   sha256(tenant, shop, model), as one of its tags (createListing has no SKU field in the
   recorded revision; a tag is the one member that is both sent and searchable);
2. every attempt begins with the reconciliation query (findAllActiveListingsByShop with the
   external id as keyword, filtered to an exact tag match): a listing found is the result, marked
   ``reconciled``, and nothing is created;
3. only then is the listing created; a create whose answer is lost (a timeout or a reset once the
   request was sent, a 5xx) is ambiguous and is followed at once by the reconciliation query,
   never by a blind second create; if that finds nothing the attempt fails as retryable
   ``ambiguous-create`` and the next attempt starts again at step 2.

Within one worker process creates of the same external id are serialised by a lock, so two
deliveries of one job in flight at once cannot both miss the query and both create. Across
processes, with a shared claim store configured (``EtsyConfig.create_claims``,
``ACCORD_ETSY_CREATE_CLAIMS``), a create is made only under a *create claim* taken with a
conditional write keyed by the external id (:mod:`.claims`): the winner queries once more (a
holder before it may have just created the listing) and creates; a process that finds another's
live claim waits, querying, until the listing shows (``reconciled``) or the claim is released or
expires (then it takes the claim itself); past the claim's lease it fails as retryable
``create-in-progress``. A claim store that cannot answer is retryable
``create-claim-unavailable``: nothing is created without a claim.

Images: a request that carries ``previewKeys`` (the gallery thumbnails model-ingest rendered)
has them read from the tenant's store (``services["storage"]``, else the ``local`` folder) before
anything is sent, and uploaded once the listing exists, created or found — so an attempt that
died between the create and the uploads is completed by the next. Each goes with
uploadListingImage (multipart) at its deterministic rank (1, 2, … in the order given) under a
deterministic file name (``<externalId>-<rank>.<ext>``); the listing's images are read first
(getListingImages) and a rank already there is not uploaded again, and an upload whose answer is
lost is checked the same way (still missing: retryable ``ambiguous-upload``). Uploads ask Etsy to
overwrite the rank, so even two deliveries racing replace rather than add.

Before anything is sent, the listing is validated against ``etsy-create-listing-request@1``
(terminal ``invalid-listing`` with the field paths) and checked against the current policy
artefact (terminal ``policy-violation`` naming the paths and the policy version); the result
records the policy version and digest it was checked against.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from accord.contracts.sources import load_catalog
from accord.contracts.validate import Validator
from accord.objects.ports import ObjectError
from accord.worker.sdk import Context, RetryableError, TerminalError, Worker
from accord.worker.storage import StorageMap
from accord_worker_marketplace_etsy.claims import Claim, CreateClaims
from accord_worker_marketplace_etsy.client import Ambiguous, EtsyClient
from accord_worker_marketplace_etsy.config import EtsyConfig, config_of
from accord_worker_marketplace_etsy.policy import PolicyUnavailable, check, current
from accord_worker_marketplace_etsy.wire import from_listing, to_form

__all__ = ["PREPARE", "PUBLISH", "PUBLISH_V1", "external_id", "worker"]

PREPARE = "marketplace.etsy.prepare-listing@1"
PUBLISH = "marketplace.etsy.publish-listing@2"
# @1 (no gallery images) is still served on the same queue, for runs of plans that name it:
# the runtime gives each job to the version whose request contract it names
PUBLISH_V1 = "marketplace.etsy.publish-listing@1"
LISTING_CONTRACT = "etsy-create-listing-request@1"
ANSWER_CONTRACT = "etsy-shop-listing@1"
_LOG = logging.getLogger(__name__)
_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()
_VALIDATORS: dict[str, Validator] = {}

worker = Worker("marketplace-etsy")


def external_id(tenant: str, shop_id: int, model_id: str) -> str:
    digest = hashlib.sha256(f"{tenant}\x00{shop_id}\x00{model_id}".encode()).hexdigest()
    return f"acc-{digest[:16]}"


def prepare(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """A listing from the analysis (title, description, tags), metadata (format) and previews."""
    descriptors = [str(d) for d in payload["descriptors"]]
    floor = float(payload["minTagConfidence"])
    labels = [str(t["label"]) for t in payload["tags"] if float(t["confidence"]) >= floor]
    if not descriptors and not labels:
        raise TerminalError("no descriptors and no confident tags to list", "nothing-to-list")
    model_id, fmt = str(payload["modelId"]), str(payload["format"])
    name = model_id.replace("-", " ").replace("_", " ").strip()
    traits = ", ".join(label.replace("-", " ") for label in labels[:2])
    title = f"{name[:1].upper()}{name[1:]} 3D printable model" + (f", {traits}" if traits else "")
    title += f" ({fmt.upper()})"
    lines = [*descriptors, f"File format: {fmt.upper()}. Model {model_id}."]
    listing = {
        "quantity": int(payload["quantity"]),
        "title": title,
        "description": "\n".join(lines),
        "price": float(payload["price"]),
        "whoMade": "i_did",
        "whenMade": "made_to_order",
        "taxonomyId": int(payload["taxonomyId"]),
        "type": "download",
        "isDigital": True,
        "tags": list(dict.fromkeys(labels)),
    }
    return {"modelId": model_id, "listing": listing, "previewKeys": payload["previewKeys"]}


def _validator(ctx: Context, ref: str) -> Validator:
    """The validator of contract ``ref``, from ``services["catalog"]`` or ``ACCORD_CONTRACTS``."""
    catalog = ctx.services.get("catalog")
    key = f"{ref} {'default' if catalog is None else id(catalog)}"
    if key not in _VALIDATORS:
        if catalog is None:
            catalog = load_catalog(_contracts_dir())
        contract = catalog.message(ref)
        assert contract is not None, ref
        _VALIDATORS[key] = Validator.for_contract(contract)
    return _VALIDATORS[key]


def _contracts_dir() -> Path:
    return Path(os.environ.get("ACCORD_CONTRACTS", "schemas/contracts"))


def _lock(key: str) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(key, threading.Lock())


def publish(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Publish the listing once (see the module docstring): its publication record."""
    config: EtsyConfig = config_of(ctx.services)
    model_id, shop_id = str(payload["modelId"]), int(payload["shopId"])
    verdict = _validator(ctx, LISTING_CONTRACT).validate(payload["listing"])
    if not verdict.ok:
        paths = "; ".join(f"listing.{v.path}: {v.message}" for v in verdict.violations)
        raise TerminalError(f"not an {LISTING_CONTRACT}: {paths}", "invalid-listing")
    listing = dict(verdict.value or {})
    ext = external_id(ctx.tenant, shop_id, model_id)
    listing["tags"] = [*(listing.get("tags") or []), ext]
    try:
        policy = current(config.policies)
    except PolicyUnavailable as exc:
        raise RetryableError(str(exc), "policy-unavailable") from None
    broken = check(listing, policy.rules)
    if broken:
        raise TerminalError(f"{policy.version} refuses the listing: " + "; ".join(broken),
                            "policy-violation")  # fmt: skip
    token = config.tokens.get(str(payload["credentialsRef"]))
    if token is None:
        raise TerminalError("credentialsRef names no credentials in the connector's "
                            "configuration", "credentials-unknown")  # fmt: skip
    images = _images(payload, ctx)
    client = EtsyClient(config, token)
    try:
        with _lock(ext):
            found, reconciled = _reconcile(client, shop_id, ext), True
            if found is None and config.create_claims is None:
                found, reconciled = _create(client, shop_id, ext, listing)
            elif found is None:
                found, reconciled = _create_claimed(client, config, shop_id, ext, listing)
            _upload_images(client, shop_id, int(found["listing_id"]), ext, images)
    finally:
        client.close()
    answer = _validator(ctx, ANSWER_CONTRACT).validate(from_listing(found))
    if not answer.ok:
        paths = "; ".join(f"{v.path}: {v.message}" for v in answer.violations)
        raise RetryableError(f"Etsy's answer is not an {ANSWER_CONTRACT}: {paths}",
                             "marketplace-unavailable")  # fmt: skip
    shown = dict(answer.value or {})
    return {
        "modelId": model_id,
        "marketplace": "etsy",
        "shopId": shop_id,
        "externalId": ext,
        "listingId": int(shown["listingId"]),
        "state": str(shown["state"]),
        "url": str(shown["url"]),
        "policy": policy.version,
        "policyDigest": policy.digest,
        "reconciled": reconciled,
        "publishedAt": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    }


def _images(payload: dict[str, Any], ctx: Context) -> list[tuple[str, bytes]]:
    """The bytes of the request's ``previewKeys``, from the tenant's store, in order."""
    keys = [str(k) for k in payload.get("previewKeys") or []]
    if not keys:
        return []
    storage = (ctx.services.get("storage") or StorageMap.local()).open(
        payload.get("storageConnectionRef"), ctx.tenant
    )
    return [(key, storage.get_path(key).read_bytes()) for key in keys]


def _ranks(client: EtsyClient, shop_id: int, listing_id: int) -> set[int]:
    try:
        return {int(i["rank"]) for i in client.listing_images(shop_id, listing_id)}
    except Ambiguous as exc:
        raise RetryableError(f"listing images: {exc}", "marketplace-unavailable") from None


def _upload_images(
    client: EtsyClient, shop_id: int, listing_id: int, ext: str, images: list[tuple[str, bytes]]
) -> None:
    """Each image at its rank, unless the listing has an image at that rank already."""
    if not images:
        return
    present = _ranks(client, shop_id, listing_id)
    for rank, (key, data) in enumerate(images, start=1):
        if rank in present:
            continue
        suffix = key.rpartition(".")[2].lower() if "." in key.rpartition("/")[2] else "png"
        name = f"{ext}-{rank}.{suffix}"
        try:
            client.upload_image(shop_id, listing_id, name, data, rank)
        except Ambiguous as exc:
            _LOG.info("upload of %s ambiguous (%s); checking the listing", name, exc)
            if rank not in _ranks(client, shop_id, listing_id):
                why = f"upload of image {rank} ({key}) ambiguous and not on listing {listing_id}"
                raise RetryableError(why, "ambiguous-upload") from None


def _reconcile(client: EtsyClient, shop_id: int, ext: str) -> dict[str, Any] | None:
    """The listing that carries ``ext`` (the oldest, should there be several), or None."""
    try:
        hits = [x for x in client.find_by_keyword(shop_id, ext) if ext in x.get("tags", [])]
    except Ambiguous as exc:
        raise RetryableError(f"reconciliation query: {exc}", "marketplace-unavailable") from None
    if len(hits) > 1:
        _LOG.warning("%d Etsy listings carry external id %s", len(hits), ext)
    return min(hits, key=lambda x: int(x["listing_id"])) if hits else None


def _create(
    client: EtsyClient, shop_id: int, ext: str, listing: dict[str, Any]
) -> tuple[dict[str, Any], bool]:
    """The listing created, or found by the query after an ambiguous create (then True)."""
    try:
        return client.create_listing(shop_id, to_form(listing)), False
    except Ambiguous as exc:
        _LOG.info("create of %s ambiguous (%s); reconciling", ext, exc)
        found = _reconcile(client, shop_id, ext)
        if found is None:
            raise RetryableError(f"create ambiguous and no listing carries {ext}",
                                 "ambiguous-create") from None  # fmt: skip
        return found, True


def _create_claimed(
    client: EtsyClient, config: EtsyConfig, shop_id: int, ext: str, listing: dict[str, Any]
) -> tuple[dict[str, Any], bool]:
    """Create under a create claim, or find the listing another process created under its own
    (see the module docstring and :mod:`.claims`)."""
    assert config.create_claims is not None
    claims = CreateClaims(config.create_claims, lease_s=config.claim_lease_s)
    deadline = time.monotonic() + config.claim_lease_s
    while True:
        try:
            claim = claims.take(shop_id, ext)
        except ObjectError as exc:
            raise RetryableError(f"create claim for {ext}: the claim store failed: {exc}",
                                 "create-claim-unavailable") from None  # fmt: skip
        if claim is not None:
            return _create_holding(client, claims, claim, shop_id, listing=listing)
        found = _reconcile(client, shop_id, ext)  # another process holds the claim
        if found is not None:
            return found, True
        if time.monotonic() > deadline:
            raise RetryableError(f"another connector process is creating {ext} and it has not "
                                 "shown yet", "create-in-progress")  # fmt: skip
        time.sleep(config.claim_poll_s)


def _create_holding(
    client: EtsyClient,
    claims: CreateClaims,
    claim: Claim,
    shop_id: int,
    *,
    listing: dict[str, Any],
) -> tuple[dict[str, Any], bool]:
    """Holding ``claim``: query once more, then create. The claim is released once the listing
    exists or the create was refused; after an ambiguous create it is kept until its lease ends,
    so nobody creates while the lost write may still show."""
    ext = claim.external_id
    try:
        found = _reconcile(client, shop_id, ext)  # a holder before this one may have created it
        result = (found, True) if found is not None else _create(client, shop_id, ext, listing)
    except RetryableError as exc:
        if exc.failure_code != "ambiguous-create":
            claims.release(claim)
        raise
    except TerminalError:
        claims.release(claim)
        raise
    claims.release(claim)
    return result


worker.bind(PREPARE, prepare)
worker.bind(PUBLISH, publish)
worker.bind(PUBLISH_V1, publish)
