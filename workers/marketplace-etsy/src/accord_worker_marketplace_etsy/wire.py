"""Accord's field names for Etsy's and back: the one mapping table of the connector.

The contract DSL requires lowerCamelCase field names and has no wire-name declaration, so the
contracts ``etsy-create-listing-request@1`` and ``etsy-shop-listing@1`` name fields Accord's way
and this table maps each to the snake_case name of Etsy's OpenAPI document. The connector's tests
check that every contract field appears here and that every Etsy name is a property of the
vendored document's schema, so the table cannot drift from either side.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["CREATE_FIELDS", "LISTING_FIELDS", "from_listing", "to_form", "wire_to_path"]

# etsy-create-listing-request@1 field -> createListing form field
CREATE_FIELDS: Mapping[str, str] = {
    "quantity": "quantity",
    "title": "title",
    "description": "description",
    "price": "price",
    "whoMade": "who_made",
    "whenMade": "when_made",
    "taxonomyId": "taxonomy_id",
    "type": "type",
    "tags": "tags",
    "materials": "materials",
    "isSupply": "is_supply",
    "isDigital": "is_digital",
    "shouldAutoRenew": "should_auto_renew",
}
# etsy-shop-listing@1 field -> ShopListing member
LISTING_FIELDS: Mapping[str, str] = {
    "listingId": "listing_id",
    "shopId": "shop_id",
    "title": "title",
    "state": "state",
    "url": "url",
    "creationTimestamp": "creation_timestamp",
    "tags": "tags",
}
_FROM_WIRE = {v: k for k, v in CREATE_FIELDS.items()}


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def to_form(listing: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The form pairs of a create request (arrays exploded: ``tags=a&tags=b``)."""
    pairs: list[tuple[str, str]] = []
    for name, wire in CREATE_FIELDS.items():
        value = listing.get(name)
        if value is None:
            continue
        if isinstance(value, list):
            pairs += [(wire, _text(v)) for v in value]
        else:
            pairs.append((wire, _text(value)))
    return pairs


def from_listing(doc: Mapping[str, Any]) -> dict[str, Any]:
    """An etsy-shop-listing@1 document from a ShopListing (members not read are dropped)."""
    return {name: doc[wire] for name, wire in LISTING_FIELDS.items() if wire in doc}


def wire_to_path(wire: str) -> str:
    """The Accord path of a createListing field named in an Etsy error (``listing.whoMade``)."""
    head = wire.split(".", 1)[0]
    return f"listing.{_FROM_WIRE[head]}" if head in _FROM_WIRE else f"listing ({wire})"
