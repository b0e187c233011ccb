"""Contract-level changes (outcomes, routing, identity, reserved names), capability diffs, and the
report: actions, modes, SemVer and its stable JSON form."""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pytest

from accord.contracts.compat import DiffReport, diff, diff_capability
from accord.contracts.model import (
    CapabilityContract,
    ContractRef,
    FieldSpec,
    Limits,
    MessageContract,
)

S = FieldSpec
BASE = {"id": S("string", required=True), "size": S("integer", maximum=10)}


def msg(payload: Mapping[str, FieldSpec] = BASE, version: int = 1, **kw: Any) -> MessageContract:
    kw.setdefault("owner", "team")
    return MessageContract(name="m", wire_version=version, payload=payload, **kw)


def cap(version: int = 1, **kw: Any) -> CapabilityContract:
    fields: dict[str, Any] = {
        "kind": "worker",
        "name": "thumbnail.render",
        "version": version,
        "owner": "team",
        "request": ContractRef("thumbnail-request", 1),
        "result": ContractRef("thumbnail-result", 1),
        "queue": "thumbnails",
        "errors": ("input-too-large",),
        "limits": Limits(time_ms=1000, memory_bytes=None, input_bytes=100),
    }
    fields.update(kw)
    return CapabilityContract(**fields)


def rows(report: DiffReport) -> list[tuple[str, str, bool, bool, str]]:
    return [(c.code, c.path, c.backward, c.forward, c.action) for c in report.changes]


def test_row_19_outcome_added_and_removed_both_directions() -> None:
    one, two = msg(outcomes=("done", "progress")), msg(version=2, outcomes=("done", "failed"))
    assert rows(diff(one, two)) == [
        ("outcome-added", "outcomes.failed", True, False, "consumer-analysis"),
        ("outcome-removed", "outcomes.progress", False, True, "new-wire-version"),
    ]
    assert rows(diff(two, one)) == [
        ("outcome-removed", "outcomes.failed", False, True, "new-wire-version"),
        ("outcome-added", "outcomes.progress", True, False, "consumer-analysis"),
    ]


@pytest.mark.parametrize(
    ("change", "path"), [({"queue": "thumbnails-v2"}, "queue"), ({"kind": "action"}, "kind")]
)
def test_row_18_routing_is_dual_route_with_identity_unchanged(
    change: dict[str, Any], path: str
) -> None:
    for old, new in ((cap(), cap(2, **change)), (cap(2, **change), cap())):
        report = diff_capability(old, new)
        assert rows(report) == [("routing-changed", path, True, True, "dual-route")]
        assert report.required_actions == ("dual-route",)
        assert report.compatible("full")


def test_capability_references_errors_limits_and_behaviour() -> None:
    new = cap(
        2,
        request=ContractRef("thumbnail-request", 2),
        errors=("timeout",),
        limits=Limits(time_ms=500, memory_bytes=None, input_bytes=200),
        idempotency="natural-key",
        cacheable=True,
        description="renders previews",
        owner="other",
    )
    assert rows(diff_capability(cap(), new)) == [
        ("cacheable-changed", "cacheable", True, True, "consumer-analysis"),
        ("description-changed", "description", True, True, "none"),
        ("error-code-removed", "errors.input-too-large", False, True, "new-wire-version"),
        ("error-code-added", "errors.timeout", True, False, "consumer-analysis"),
        ("idempotency-changed", "idempotency", True, True, "consumer-analysis"),
        ("limit-relaxed", "limits.inputBytes", True, False, "consumer-analysis"),
        ("limit-tightened", "limits.timeMs", False, True, "new-wire-version"),
        ("owner-changed", "owner", True, True, "none"),
        ("request-changed", "request", False, False, "new-wire-version"),
    ]
    assert rows(diff_capability(cap(), cap())) == []


def test_row_20_contract_description_and_owner_are_cosmetic() -> None:
    report = diff(msg(description="old words"), msg(version=2, description="new", owner="x"))
    assert rows(report) == [
        ("description-changed", "description", True, True, "none"),
        ("owner-changed", "owner", True, True, "none"),
    ]
    assert report.required_actions == ()
    assert report.semver_bump() == "patch"


def test_contract_description_marked_semantic_needs_analysis() -> None:
    report = diff(msg(description="Semantic: sizes in px"), msg(description="Semantic: in mm"))
    assert rows(report) == [("meaning-changed", "description", True, True, "consumer-analysis")]


def test_max_bytes_and_identity() -> None:
    assert rows(diff(msg(max_bytes=1000), msg(max_bytes=10))) == [
        ("limit-tightened", "maxBytes", False, True, "new-wire-version")
    ]
    assert rows(diff(msg(max_bytes=1000), msg())) == [
        ("limit-relaxed", "maxBytes", True, False, "consumer-analysis")
    ]
    renamed = MessageContract(name="other", wire_version=2, owner="team", payload=BASE)
    assert rows(diff(msg(), renamed)) == [
        ("name-changed", "name", False, False, "new-wire-version")
    ]


def test_reusing_a_reserved_name_is_breaking() -> None:
    old = msg(reserved=("legacy",))
    new = msg({**BASE, "legacy": S("string")}, 2)
    assert rows(diff(old, new)) == [
        ("field-added-optional", "payload.legacy", True, False, "tolerant-reader"),
        ("reserved-name-reused", "payload.legacy", False, False, "new-wire-version"),
    ]
    assert rows(diff(msg(), new))[0][0] == "field-added-optional"
    assert len(diff(msg(), new).changes) == 1


def test_report_actions_modes_and_semver() -> None:
    additive = diff(msg(), msg({**BASE, "note": S("string")}, 2))
    assert additive.required_actions == ("tolerant-reader",)
    assert (additive.backward_compatible, additive.forward_compatible) == (True, False)
    assert additive.compatible("backward") and not additive.compatible("forward")
    assert not additive.compatible("full") and additive.compatible("none")
    assert additive.semver_bump() == "minor"

    payload = {"id": S("string", required=True, nullable=True), "size": S("integer", maximum=5)}
    mixed = diff(msg(), msg(payload, 2))
    assert mixed.required_actions == ("new-wire-version", "consumer-analysis")
    assert mixed.semver_bump() == "major"
    assert mixed.keys == ("nullable-added@payload.id", "limit-tightened@payload.size")
    with pytest.raises(ValueError, match="unknown compatibility mode"):
        mixed.compatible("sideways")

    same = diff(msg(), msg(version=2))
    assert same.changes == () and same.semver_bump() == "none" and same.compatible("full")


def test_to_json_is_stable_sorted_and_serialisable() -> None:
    old = msg(outcomes=("b", "a"))
    new = msg({"size": S("integer", maximum=20), "zeta": S("string")}, 2, outcomes=("a", "c"))
    first, second = diff(old, new).to_json(), diff(old, new).to_json()
    assert json.dumps(first) == json.dumps(second) == json.dumps(first, sort_keys=True)
    assert first["old"] == "m@1" and first["new"] == "m@2"
    paths = [c["path"] for c in first["changes"]]
    assert paths == sorted(paths)
    assert first["changes"][0] == {
        "code": "outcome-removed",
        "path": "outcomes.b",
        "key": "outcome-removed@outcomes.b",
        "backward": False,
        "forward": True,
        "action": "new-wire-version",
        "message": "outcome b removed",
        "detail": "",
        "tolerated": False,
    }
    assert first["semver_bump"] == "major"
    assert first["required_actions"] == ["new-wire-version", "consumer-analysis", "tolerant-reader"]


def test_defaults_compare_by_json_value_whatever_their_container() -> None:
    frozen = S("object", default=MappingProxyType({"k": (1, 2)}))
    plain = S("object", default={"k": [1, 2]})
    assert diff(msg({"o": frozen}), msg({"o": plain}, 2)).changes == ()
    nan = diff(msg({"n": S("number", default=float("nan"))}), msg({"n": S("number")}, 2))
    assert [c.code for c in nan.changes] == ["default-changed"]
