"""Runtime validation: the DSL's rules on top of JSON Schema, every failing path reported."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from accord.contracts.model import FieldSpec, MessageContract
from accord.contracts.validate import (
    DEFAULT_MAX_BYTES,
    ShadowRecord,
    ShadowValidator,
    Validator,
    validate,
)
from accord.errors import OversizedMessage, ValidationError
from accord.testing.sample_contracts import plain_note, scan_request

GOOD: dict[str, Any] = {"modelId": "m-1", "secret": "hunter22", "views": [{"angle": 90}]}


def _codes(result: Any) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for v in result.violations:
        out.setdefault(v.path, set()).add(v.code)
    return out


def test_valid_message_is_normalised_with_defaults_only_where_missing() -> None:
    result = validate(scan_request(), GOOD)
    assert result.ok and result.accepted and result.violations == ()
    assert result.value == {
        **GOOD,
        "views": [{"angle": 90, "zoom": 1.0}],
        "mode": "fast",
        "quality": 5,
        "note": None,
        "tags": [],
    }


def test_input_is_never_mutated() -> None:
    message = copy.deepcopy(GOOD)
    validate(scan_request(), message)
    assert message == GOOD


def test_explicit_null_is_not_replaced_by_a_default() -> None:
    nullable = validate(scan_request(), {**GOOD, "note": None})
    assert nullable.ok and nullable.value["note"] is None
    refused = validate(scan_request(), {**GOOD, "quality": None, "mode": None})
    assert not refused.ok
    assert _codes(refused)["quality"] == {"null-not-allowed"}
    assert "null-not-allowed" in _codes(refused)["mode"]


def test_required_field_with_default_is_filled_when_missing() -> None:
    result = validate(scan_request(), {k: v for k, v in GOOD.items()})
    assert result.ok and result.value["mode"] == "fast"


def test_every_failing_path_is_reported_sorted() -> None:
    bad = {
        "secret": "abc",
        "quality": 11,
        "colour": "green",
        "tags": ["", "ok", "x" * 17],
        "views": [{"angle": 10}, {"angle": 400, "label": None, "zoom": 0}, {"extra": 1}],
        "options": {"scale": 0, "credentials": {}},
        "unknown": True,
    }
    result = validate(scan_request(), bad)
    assert not result.ok
    assert result.paths == [
        "colour",
        "modelId",
        "options.credentials.user",
        "options.scale",
        "quality",
        "secret",
        "tags[0]",
        "tags[2]",
        "unknown",
        "views[1].angle",
        "views[1].zoom",
        "views[2].angle",
        "views[2].extra",
    ]
    codes = _codes(result)
    assert codes["modelId"] == {"missing"}
    assert codes["unknown"] == {"unknown-field"}
    assert codes["views[2].extra"] == {"unknown-field"}
    assert codes["views[1].angle"] == {"too-large"}
    assert codes["quality"] == {"too-large"}
    assert codes["tags[0]"] == {"too-short"}
    assert codes["colour"] == {"not-in-enum"}
    assert [v.path for v in result.violations] == sorted(v.path for v in result.violations)


def test_wrong_types_and_formats() -> None:
    result = validate(
        scan_request(),
        {**GOOD, "modelId": 7, "objectKey": "../etc/passwd", "requestedAt": "yesterday"},
    )
    codes = _codes(result)
    assert codes == {"modelId": {"wrong-type"}, "objectKey": {"format"}, "requestedAt": {"format"}}
    assert validate(scan_request(), {**GOOD, "requestedAt": "2026-11-29T17:05:00Z"}).ok
    assert validate(scan_request(), {**GOOD, "objectKey": "models/a/b.stl"}).ok


def test_booleans_are_not_integers_and_root_must_be_an_object() -> None:
    assert _codes(validate(scan_request(), {**GOOD, "quality": True})) == {
        "quality": {"wrong-type"}
    }
    assert _codes(validate(plain_note(), [1, 2])) == {"": {"wrong-type"}}


def test_open_object_field_accepts_any_members() -> None:
    assert validate(scan_request(), {**GOOD, "extras": {"a": [1, {"b": None}]}}).ok


def test_unknown_fields_refused_unless_the_declared_tolerance_applies() -> None:
    message = {
        **GOOD,
        "hint": "x",
        "views": [{"angle": 1, "tilt": 3}],
        "options": {"scale": 1, "shadow": True},
    }
    strict = validate(scan_request(), message)
    assert strict.paths == ["hint", "options.shadow", "views[0].tilt"]
    tolerant = validate(scan_request(), message, tolerate=True)
    assert tolerant.ok
    assert tolerant.ignored == ("hint", "options.shadow", "views[0].tilt")
    assert "hint" not in tolerant.value and "tilt" not in tolerant.value["views"][0]
    undeclared = validate(scan_request(), {**GOOD, "other": 1}, tolerate=True)
    assert undeclared.paths == ["other"]


def test_bytes_are_parsed_strictly_with_stable_codes() -> None:
    v = Validator.for_contract(scan_request())
    assert v.validate(json.dumps(GOOD).encode()).ok
    cases = {
        b'{"modelId": "a", "modelId": "b"}': "duplicate-key",
        b'{"quality": NaN}': "non-finite-number",
        b'{"quality": Infinity}': "non-finite-number",
        b'{"modelId": "\xff"}': "not-utf8",
        b'{"modelId": "\\ud800"}': "lone-surrogate",
        b'{"modelId": ': "malformed-json",
        b"[" * 70 + b"]" * 70: "too-deep",
    }
    for data, code in cases.items():
        result = v.validate(data)
        assert not result.ok and not result.decoded and result.value is None, data
        assert [x.code for x in result.violations] == [code], data


def test_oversized_input_is_refused_before_parsing() -> None:
    contract = scan_request()
    v = Validator.for_contract(contract)
    too_big = b"{" + b" " * (contract.max_bytes or 0) + b"}"  # would not even parse
    result = v.validate(too_big)
    assert [x.code for x in result.violations] == ["oversized"]
    with pytest.raises(OversizedMessage) as info:
        v.check(too_big)
    assert info.value.violations[0].path == ""
    unbounded = Validator.for_contract(plain_note())
    assert unbounded.max_bytes == DEFAULT_MAX_BYTES
    assert not unbounded.validate("x" * (DEFAULT_MAX_BYTES + 1)).ok


def test_check_returns_normalised_value_or_raises_with_every_path() -> None:
    v = Validator.for_contract(scan_request())
    assert v.check(GOOD)["quality"] == 5
    with pytest.raises(ValidationError) as info:
        v.check({"secret": "hunter22", "views": []})
    assert [x.path for x in info.value.violations] == ["modelId", "views"]
    assert "scan-request@3" in str(info.value)


def test_error_messages_never_echo_values() -> None:
    result = validate(scan_request(), {**GOOD, "secret": 12345678, "options": {"scale": "s3cr3t"}})
    assert result.paths == ["options.scale", "secret"]
    assert all("12345678" not in v.message and "s3cr3t" not in v.message for v in result.violations)


def test_validators_are_compiled_once_and_shared() -> None:
    a = Validator.for_contract(scan_request())
    assert Validator.for_contract(scan_request()) is a  # equal contracts share one validator
    assert Validator.for_contract(scan_request(), tolerate=True) is not a
    changed = MessageContract(
        name="scan-request",
        wire_version=3,
        owner="testing",
        payload={"modelId": FieldSpec(type="integer")},
    )
    assert Validator.for_contract(changed) is not a


def test_shadow_mode_records_every_violation_without_refusing() -> None:
    records: list[ShadowRecord] = []
    shadow = ShadowValidator(scan_request(), records)
    bad = {"modelId": "m", "secret": "x", "views": [{"angle": -1}], "junk": 1}
    assert shadow.check(bad)["quality"] == 5  # passed through, best-effort normalised
    assert shadow.check(GOOD)["mode"] == "fast"
    assert (shadow.seen, shadow.failed) == (2, 1)
    assert len(records) == 1 and records[0].contract == "scan-request@3"
    assert [v.path for v in records[0].violations] == ["junk", "secret", "views[0].angle"]
    seen: list[ShadowRecord] = []
    result = validate(scan_request(), bad, mode="shadow", sink=seen.append)
    assert result.accepted and not result.ok and seen[0].violations == result.violations
    with pytest.raises(ValidationError):
        shadow.check(b"{not json")


def test_non_json_values_are_refused_not_crashed_on() -> None:
    result = validate(plain_note(), {"text": {1, 2}})
    assert not result.ok and result.violations[0].code == "not-json"


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("a/b", True),
        ("models/example/model.stl", True),
        (".hidden/x", True),
        ("..x/y", True),
        ("a b/c", True),
        (".", False),
        ("..", False),
        ("a/./b", False),
        ("a/../b", False),
        ("../x", False),
        ("/x", False),
        ("a//b", False),
        ("a/", False),
        ("", False),
        ("a\\b", False),
        ("a\x01b", False),
    ],
)
def test_object_key_format(key: str, ok: bool) -> None:
    result = validate(scan_request(), {**GOOD, "objectKey": key})
    assert result.ok is ok
    assert ok or _codes(result) == {"objectKey": {"format"}}
