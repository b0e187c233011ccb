"""Fixtures derived from the feature-complete sample contract hold for the Python validator.

The committed fixtures cover the real contracts (tests/golden); this covers what they may not
use: nullable enums, nested sensitive objects, arrays of objects with defaults, exclusive bounds,
multipleOf, open objects and deprecated fields.
"""

from __future__ import annotations

from accord.contracts.fixtures import derive_fixtures, file_slug
from accord.contracts.validate import Validator
from accord.testing.sample_contracts import scan_request


def test_derivation_is_deterministic_and_covers_every_case_kind() -> None:
    first, second = derive_fixtures(scan_request()), derive_fixtures(scan_request())
    assert first == second
    kinds = {name.split("/")[1].split("-")[0].removesuffix(".json") for name in first}
    assert {
        "minimal",
        "full",
        "null",
        "missing",
        "unknown",
        "type",
        "enum",
        "pattern",
        "format",
        "too",
        "fraction",
        "item",
        "many",
        "not",
    } <= kinds
    assert "valid/null-views-0-label.json" in first  # nested nullable
    assert "invalid/null-views-0-zoom.json" in first  # nested default-bearing, not nullable
    assert "invalid/unknown-views-0-unexpectedField.json" in first
    assert "invalid/item-type-views.json" in first


def test_every_derived_fixture_holds() -> None:
    validator = Validator.for_contract(scan_request())
    fixtures = derive_fixtures(scan_request())
    assert len(fixtures) > 60
    for name, fixture in fixtures.items():
        result = validator.validate(fixture["message"])
        expect = fixture["expect"]
        assert (result.ok, result.paths) == (expect["ok"], expect["paths"]), name
        assert name.startswith("valid/" if expect["ok"] else "invalid/")
        if expect["ok"]:
            assert result.value == expect["normalised"], name


def test_minimal_fixture_fills_nested_defaults_only_inside_present_objects() -> None:
    minimal = derive_fixtures(scan_request())["valid/minimal.json"]
    assert minimal["message"] == {"modelId": "A", "secret": "example"}
    assert minimal["expect"]["normalised"] == {
        "modelId": "A",
        "secret": "example",
        "mode": "fast",
        "quality": 5,
        "note": None,
        "tags": [],
    }


def test_file_slugs_are_safe() -> None:
    assert file_slug("views[0].angle") == "views-0-angle"
    assert file_slug('a["x/y"]') == "a-x-y"
    assert file_slug("") == "root"
