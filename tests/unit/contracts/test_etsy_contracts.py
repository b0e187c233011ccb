"""The Etsy listing contracts agree with Etsy's published OpenAPI document, member by member.

``etsy-create-listing-request@1`` and ``etsy-shop-listing@1`` are derived from the createListing
request body and the ShopListing schema of the vendored ``tests/etsy_double/openapi.json``; the
connector's mapping table (``accord_worker_marketplace_etsy.wire``) joins Accord's names to
Etsy's. These tests fail when a contract field has no Etsy member, a type or enum differs, the
required sets differ, or the table and the contracts drift apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from accord_worker_marketplace_etsy.wire import CREATE_FIELDS, LISTING_FIELDS, to_form
from tests.etsy_double.spec import REVISION, SPEC, _resolve, decode_form, errors_of

from accord.contracts.dsl import load_directory
from accord.contracts.model import FieldSpec, MessageContract
from accord.contracts.validate import Validator

ROOT = Path(__file__).resolve().parents[3]
CREATE_SCHEMA = SPEC["paths"]["/v3/application/shops/{shop_id}/listings"]["post"]["requestBody"][
    "content"
]["application/x-www-form-urlencoded"]["schema"]
LISTING_SCHEMA = SPEC["components"]["schemas"]["ShopListing"]


def _contract(name: str) -> MessageContract:
    for c in load_directory(ROOT / "schemas" / "contracts"):
        if isinstance(c, MessageContract) and c.name == name:
            return c
    raise AssertionError(name)


def _agrees(spec: FieldSpec, member: dict[str, Any]) -> list[str]:
    member = _resolve(member)
    problems = []
    if spec.type != member.get("type"):
        problems.append(f"type {spec.type} != {member.get('type')}")
    if spec.enum is not None and list(spec.enum) != list(member.get("enum", [])):
        problems.append(f"enum {spec.enum} != {member.get('enum')}")
    if spec.type == "array" and spec.items is not None:
        item_type = _resolve(member["items"]).get("type")
        if spec.items.type != item_type:
            problems.append(f"items {spec.items.type} != {item_type}")
    return problems


@pytest.mark.parametrize(
    ("name", "table", "schema"),
    [
        ("etsy-create-listing-request", CREATE_FIELDS, CREATE_SCHEMA),
        ("etsy-shop-listing", LISTING_FIELDS, LISTING_SCHEMA),
    ],
)
def test_every_contract_field_is_an_etsy_member_of_the_same_shape(
    name: str, table: dict[str, str], schema: dict[str, Any]
) -> None:
    contract = _contract(name)
    assert set(contract.payload) == set(table), "mapping table and contract differ"
    props = schema["properties"]
    for field, spec in contract.payload.items():
        wire = table[field]
        assert wire in props, f"{name}.{field}: Etsy has no member {wire!r}"
        assert spec.description and wire in spec.description, f"{field}: description names {wire}"
        assert _agrees(spec, props[wire]) == [], f"{name}.{field} ({wire})"


def test_the_create_contract_requires_exactly_what_etsy_requires() -> None:
    contract = _contract("etsy-create-listing-request")
    required = {CREATE_FIELDS[f] for f, s in contract.payload.items() if s.required}
    assert required == set(CREATE_SCHEMA["required"])


def test_the_listing_contract_reads_only_members_etsy_always_sends() -> None:
    contract = _contract("etsy-shop-listing")
    required = {LISTING_FIELDS[f] for f, s in contract.payload.items() if s.required}
    assert required <= set(LISTING_SCHEMA["required"])


def test_the_contracts_name_the_vendored_revision() -> None:
    assert len(REVISION) == 40
    for name in ("etsy-create-listing-request", "etsy-shop-listing"):
        assert REVISION in (_contract(name).description or "")


def _listing(**override: Any) -> dict[str, Any]:
    return {
        "quantity": 1,
        "title": "Cube",
        "description": "A cube.",
        "price": 4.5,
        "whoMade": "i_did",
        "whenMade": "made_to_order",
        "taxonomyId": 66,
        "type": "download",
        "tags": ["cube", "acc-0123456789abcdef"],
        "isDigital": True,
    } | override


def test_a_valid_listing_is_a_valid_etsy_form_body() -> None:
    listing = _listing()
    assert Validator.for_contract(_contract("etsy-create-listing-request")).validate(listing).ok
    body = decode_form(CREATE_SCHEMA, to_form(listing))
    assert errors_of(CREATE_SCHEMA, body) == []
    assert body["who_made"] == "i_did" and body["tags"] == listing["tags"]
    assert body["is_digital"] is True and body["taxonomy_id"] == 66


@pytest.mark.parametrize(
    ("override", "path", "wire"),
    [
        ({"whoMade": "a_robot"}, "whoMade", "who_made"),
        ({"whenMade": "1850s"}, "whenMade", "when_made"),
        ({"type": "hologram"}, "type", "type"),
    ],
)
def test_a_listing_etsy_refuses_is_refused_by_the_contract_at_the_same_field(
    override: dict[str, Any], path: str, wire: str
) -> None:
    listing = _listing(**override)
    verdict = Validator.for_contract(_contract("etsy-create-listing-request")).validate(listing)
    assert not verdict.ok and [v.path for v in verdict.violations] == [path]
    etsy = errors_of(CREATE_SCHEMA, decode_form(CREATE_SCHEMA, to_form(listing)))
    assert len(etsy) == 1 and etsy[0].startswith(f"{wire}:")


def test_a_missing_required_field_is_refused_by_both() -> None:
    listing = _listing()
    del listing["taxonomyId"]
    verdict = Validator.for_contract(_contract("etsy-create-listing-request")).validate(listing)
    assert [v.path for v in verdict.violations] == ["taxonomyId"]
    etsy = errors_of(CREATE_SCHEMA, decode_form(CREATE_SCHEMA, to_form(listing)))
    assert etsy and "taxonomy_id" in etsy[0]
