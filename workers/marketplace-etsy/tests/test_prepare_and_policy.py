"""The connector's pure parts: preparing a listing, the policy check, the wire mapping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from accord_worker_marketplace_etsy.handler import PREPARE, external_id, prepare
from accord_worker_marketplace_etsy.policy import check
from accord_worker_marketplace_etsy.wire import from_listing, to_form, wire_to_path

from accord.contracts.sources import load_catalog
from accord.contracts.validate import Validator
from accord.worker.sdk import Context, TerminalError

ROOT = Path(__file__).resolve().parents[3]
RULES: dict[str, Any] = {
    "titleMaxLength": 60,
    "titlePattern": r"[\w\s.,()×-]+",
    "tagMaxLength": 20,
    "tagPattern": r"[\w '-]+",
    "maxTags": 3,
    "taxonomyIds": [1],
    "priceMin": 1,
    "priceMax": 100,
}


def _ctx() -> Context:
    return Context("r", "prepare-listing", 1, "f", "demo", PREPARE, "k", envelope={})


def _request(**override: Any) -> dict[str, Any]:
    return {
        "modelId": "plate-with-hole",
        "format": "stl",
        "descriptors": ["principal extents 40 × 40 × 3", "has-through-holes: genus 1"],
        "tags": [
            {"label": "has-through-holes", "confidence": 0.95},
            {"label": "thin-walls", "confidence": 0.7},
            {"label": "convex", "confidence": 0.2},
        ],
        "previewKeys": ["thumbnails/plate/gallery.png"],
        "price": 12.5,
        "taxonomyId": 1,
        "quantity": 1,
        "minTagConfidence": 0.5,
    } | override


def test_a_prepared_listing_is_an_etsy_create_listing_request() -> None:
    draft = prepare(_request(), _ctx())
    contract = load_catalog(ROOT / "schemas" / "contracts").message("etsy-create-listing-request@1")
    assert contract is not None
    assert Validator.for_contract(contract).validate(draft["listing"]).ok
    listing = draft["listing"]
    assert (
        listing["title"]
        == "Plate with hole 3D printable model, has through holes, thin walls (STL)"
    )
    assert listing["tags"] == ["has-through-holes", "thin-walls"]  # the 0.2 tag is below the floor
    assert "principal extents 40 × 40 × 3" in listing["description"]
    assert draft["previewKeys"] == ["thumbnails/plate/gallery.png"]


def test_nothing_to_list_is_terminal() -> None:
    with pytest.raises(TerminalError) as failed:
        prepare(_request(descriptors=[], tags=[]), _ctx())
    assert failed.value.failure_code == "nothing-to-list"


def test_the_policy_check_names_every_path_it_refuses() -> None:
    listing = {
        "title": "A title with a ™ that is far too long for the policy under test here",
        "tags": ["ok", "bad!", "x" * 21, "four"],
        "taxonomyId": 2,
        "price": 0.5,
    }
    found = check(listing, RULES)
    paths = [f.split(":", 1)[0] for f in found]
    assert paths == [
        "listing.title", "listing.title", "listing.tags", "listing.tags[1]", "listing.tags[2]",
        "listing.taxonomyId", "listing.price",
    ]  # fmt: skip
    assert "'™'" in found[1] and "'!'" in found[3]
    ok = {"title": "Cube (STL)", "tags": ["cube"], "taxonomyId": 1, "price": 5}
    assert check(ok, RULES) == []


def test_the_external_id_is_deterministic_and_fits_an_etsy_tag() -> None:
    a = external_id("demo", 1, "cube")
    assert a == external_id("demo", 1, "cube") and len(a) == 20
    assert len({a, external_id("other", 1, "cube"), external_id("demo", 2, "cube")}) == 3


def test_the_wire_mapping_goes_both_ways() -> None:
    form = to_form({"whoMade": "i_did", "tags": ["a", "b"], "isDigital": True, "type": None})
    assert form == [("who_made", "i_did"), ("tags", "a"), ("tags", "b"), ("is_digital", "true")]
    assert from_listing({"listing_id": 7, "shop_id": 1, "views": 3}) == {
        "listingId": 7,
        "shopId": 1,
    }
    assert wire_to_path("taxonomy_id") == "listing.taxonomyId"
    assert wire_to_path("tags.2") == "listing.tags"
    assert wire_to_path("colour") == "listing (colour)"
