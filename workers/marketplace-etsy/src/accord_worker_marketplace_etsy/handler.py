"""``marketplace.etsy.prepare-listing@1`` and ``marketplace.etsy.publish-listing@1``.

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
deliveries of one job in flight at once cannot both miss the query and both create.

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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from accord.contracts.sources import load_catalog
from accord.contracts.validate import Validator
from accord.worker.sdk import Context, RetryableError, TerminalError, Worker
from accord_worker_marketplace_etsy.client import Ambiguous, EtsyClient
from accord_worker_marketplace_etsy.config import EtsyConfig, config_of
from accord_worker_marketplace_etsy.policy import PolicyUnavailable, check, current
from accord_worker_marketplace_etsy.wire import from_listing, to_form

__all__ = ["PREPARE", "PUBLISH", "external_id", "worker"]

PREPARE = "marketplace.etsy.prepare-listing@1"
PUBLISH = "marketplace.etsy.publish-listing@1"
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
    client = EtsyClient(config, token)
    try:
        with _lock(ext):
            found, reconciled = _reconcile(client, shop_id, ext), True
            if found is None:
                found, reconciled = _create(client, shop_id, ext, listing)
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


worker.bind(PREPARE, prepare)
worker.bind(PUBLISH, publish)
