"""Declared tolerance, Confluent-style modes (transitive or not) and the publish gate."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from accord.contracts.compat import check, check_publish, diff, tolerance_check
from accord.contracts.model import ChangeRecord, FieldSpec, MessageContract, Tolerance
from accord.errors import Diagnostic, Location

S = FieldSpec
ID = S("string", required=True)
VIEWS = S("array", items=S("object", fields={"angle": S("number"), "url": ID}))


def msg(payload: Mapping[str, FieldSpec], version: int, **kw: Any) -> MessageContract:
    return MessageContract(name="m", wire_version=version, owner="team", payload=payload, **kw)


def codes(diagnostics: list[Diagnostic]) -> list[tuple[str, str, str]]:
    return [(d.code, d.path, d.severity) for d in diagnostics]


def ack(version: int, *keys: str) -> tuple[ChangeRecord, ...]:
    return (ChangeRecord(version, "reviewed", acknowledges=keys),)


# declared tolerance in the diff ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("tolerance", "lifted"),
    [
        (Tolerance(1, ("hint",)), True),
        (Tolerance(1, ("payload.hint",)), True),
        (Tolerance(3, ("hint",)), False),  # another version's fields
        (Tolerance(1, ("other",)), False),
        (None, False),
    ],
)
def test_removal_passes_backward_only_when_the_new_reader_tolerates_it(
    tolerance: Tolerance | None, lifted: bool
) -> None:
    old = msg({"id": ID, "hint": S("string")}, 1)
    new = msg({"id": ID}, 2, tolerates=(tolerance,) if tolerance else ())
    (change,) = diff(old, new).changes
    assert change.code == "field-removed-optional" and change.action == "tolerant-reader"
    assert (change.backward, change.forward, change.tolerated) == (lifted, True, lifted)


def test_addition_passes_forward_only_when_the_old_reader_tolerates_it() -> None:
    plain_old = msg({"id": ID}, 1)
    new = msg({"id": ID, "hint": S("string")}, 2)
    assert diff(plain_old, new).forward_compatible is False
    tolerant_old = msg({"id": ID}, 1, tolerates=(Tolerance(2, ("hint",)),))
    report = diff(tolerant_old, new)
    assert report.forward_compatible and report.changes[0].tolerated
    # the new version declaring it proves nothing about old readers
    self_declared = msg({"id": ID, "hint": S("string")}, 2, tolerates=(Tolerance(1, ("hint",)),))
    assert diff(plain_old, self_declared).forward_compatible is False


def test_tolerance_of_array_item_fields_and_partial_lift_for_required_removal() -> None:
    old = msg({"id": ID, "views": VIEWS}, 1)
    items = S("object", fields={"url": ID})
    tolerant = (Tolerance(1, ("views[].angle", "id")),)
    new = msg({"views": S("array", items=items)}, 2, tolerates=tolerant)
    report = diff(old, new)
    got = [(c.code, c.path, c.backward, c.forward, c.tolerated) for c in report.changes]
    assert got == [
        ("field-removed-required", "payload.id", True, False, True),  # still breaks old readers
        ("field-removed-optional", "payload.views[].angle", True, True, True),
    ]
    assert report.backward_compatible and not report.forward_compatible


def test_tolerance_check_reports_undeclared_and_unused() -> None:
    producer = msg({"id": ID, "views": VIEWS, "hint": S("string"), "extra": S("integer")}, 3)
    consumer = msg(
        {"id": ID, "views": S("array", items=S("object", fields={"url": ID}))},
        2,
        tolerates=(Tolerance(3, ("views[].angle", "hint", "gone")), Tolerance(1, ("extra",))),
        source=Location("m.yaml", 1, 1),
    )
    found = tolerance_check(consumer, producer)
    assert codes(found) == [
        ("tolerance-undeclared", "payload.extra", "error"),
        ("tolerance-unused", "payload.gone", "warning"),
    ]
    assert "m@2" in found[0].message and "m@3" in found[0].message
    assert found[0].location == Location("m.yaml", 1, 1)
    declared = msg(
        consumer.payload, 2, tolerates=(Tolerance(3, ("views[].angle", "hint", "extra")),)
    )
    assert tolerance_check(declared, producer) == []


# modes -----------------------------------------------------------------------------------------

V1 = msg({"id": ID, "legacy": S("string")}, 1)
V2 = msg({"id": ID}, 2, tolerates=(Tolerance(1, ("legacy",)),))
V3 = msg({"id": ID, "note": S("integer")}, 3)  # not a rename: another shape


def test_non_transitive_checks_only_the_latest() -> None:
    assert check([V2, V1], V3, "backward", transitive=False) == []
    assert codes(check([V1, V2], V3, "forward")) == [
        ("compat-not-forward", "payload.note", "error")
    ]
    assert check([V1, V2], V3, "none", transitive=True) == []


def test_transitive_checks_every_retained_version() -> None:
    found = check([V1, V2], V3, "backward", transitive=True)
    assert codes(found) == [("compat-not-backward", "payload.legacy", "error")]
    assert "m@1 -> m@3" in found[0].message and "field-removed-optional@payload.legacy" in (
        found[0].message
    )
    full = check([V1, V2], V3, "full", transitive=True)
    assert codes(full) == [
        ("compat-not-backward", "payload.legacy", "error"),
        ("compat-not-forward", "payload.note", "error"),  # against m@1
        ("compat-not-forward", "payload.note", "error"),  # against m@2
    ]
    tolerant_v3 = msg(V3.payload, 3, tolerates=(Tolerance(1, ("legacy",)),))
    assert check([V1, V2], tolerant_v3, "backward", transitive=True) == []


# the publish gate ------------------------------------------------------------------------------

OLD = msg({"id": ID, "kind": S("string", enum=("a",))}, 1)


def test_first_version_and_identical_republish_pass() -> None:
    assert check_publish([], OLD) == []
    assert check_publish([OLD], OLD) == []


def test_breaking_change_needs_a_wire_bump_in_every_mode() -> None:
    where = Location("m.yaml", 7, 3)
    payload = {**OLD.payload, "size": S("integer", required=True, location=where)}
    for mode in ("none", "backward"):
        same = msg(payload, 1, compatibility=mode, changes=ack(1, "field-added-required"))
        found = check_publish([OLD], same)
        assert codes(found) == [("compat-breaking-without-wire-bump", "payload.size", "error")]
        assert found[0].location == where
        assert "m@1" in found[0].message and "field-added-required@payload.size" in found[0].message
    assert check_publish([OLD], msg(payload, 2, compatibility="none")) == []


def test_bumped_breaking_change_against_the_mode_needs_an_acknowledgement() -> None:
    payload = {**OLD.payload, "size": S("integer", required=True)}
    unacked = msg(payload, 2)
    assert codes(check_publish([OLD], unacked)) == [
        ("compat-unacknowledged-breaking-change", "payload.size", "error")
    ]
    for key in ("field-added-required@payload.size", "field-added-required"):
        assert check_publish([OLD], msg(payload, 2, changes=ack(2, key))) == []
    wrong_version = msg(payload, 2, changes=ack(1, "field-added-required"))
    assert (
        codes(check_publish([OLD], wrong_version))[0][0] == "compat-unacknowledged-breaking-change"
    )


def test_semantic_change_needs_an_acknowledgement() -> None:
    payload = {**OLD.payload, "kind": S("string", enum=("a", "b"))}
    found = check_publish([OLD], msg(payload, 2, compatibility="none"))
    assert codes(found) == [("compat-unacknowledged-semantic-change", "payload.kind", "error")]
    assert "enum-value-added@payload.kind" in found[0].message
    acked = msg(payload, 2, compatibility="none", changes=ack(2, "enum-value-added@payload.kind"))
    assert check_publish([OLD], acked) == []


def test_tolerant_reader_change_warns_or_refuses_by_mode() -> None:
    payload = {**OLD.payload, "hint": S("string")}
    warned = check_publish([OLD], msg(payload, 2, compatibility="backward"))
    assert codes(warned) == [("compat-tolerance-undeclared", "payload.hint", "warning")]
    assert "old version must declare tolerates {version: 2, fields: [hint]}" in warned[0].message
    refused = check_publish([OLD], msg(payload, 2, compatibility="forward"))
    assert codes(refused) == [("compat-tolerance-undeclared", "payload.hint", "error")]
    tolerant_old = msg(OLD.payload, 1, tolerates=(Tolerance(2, ("hint",)),))
    assert check_publish([tolerant_old], msg(payload, 2, compatibility="full")) == []

    removed = msg({"kind": OLD.payload["kind"], "id": ID}, 3, compatibility="backward")
    with_hint = msg(payload, 2)
    assert codes(check_publish([with_hint], removed)) == [
        ("compat-tolerance-undeclared", "payload.hint", "error")
    ]
    tolerant_new = msg(removed.payload, 3, tolerates=(Tolerance(2, ("hint",)),))
    assert check_publish([with_hint], tolerant_new) == []


def test_transitive_publish_checks_every_retained_version() -> None:
    v1 = msg({"id": ID, "legacy": S("string")}, 1)
    v2 = msg({"id": ID}, 2, tolerates=(Tolerance(1, ("legacy",)),))
    v3 = msg({"id": ID, "note": S("integer", default=1)}, 3, transitive=True)
    found = check_publish([v1, v2], v3)
    assert codes(found) == [
        ("compat-tolerance-undeclared", "payload.legacy", "error"),
        ("compat-tolerance-undeclared", "payload.note", "warning"),
        ("compat-tolerance-undeclared", "payload.note", "warning"),
    ]
    assert {d.message.split(":")[0] for d in found} == {"m@3 against m@1", "m@3 against m@2"}
    latest_only = msg(v3.payload, 3)
    assert codes(check_publish([v1, v2], latest_only)) == [
        ("compat-tolerance-undeclared", "payload.note", "warning")
    ]


def test_acknowledgement_matching_nothing_is_reported() -> None:
    new = msg(OLD.payload, 2, changes=ack(2, "enum-value-added@payload.kindd"))
    found = check_publish([OLD], new)
    assert codes(found) == [("compat-stale-acknowledgement", "changes", "warning")]
    assert "kindd" in found[0].message


def test_semver_follows_the_most_demanding_change() -> None:
    enum_added = msg({**OLD.payload, "kind": S("string", enum=("a", "b"))}, 2)
    assert diff(OLD, enum_added).semver_bump() == "minor"
    tightened = msg({**OLD.payload, "id": S("string", required=True, max_length=3)}, 2)
    assert diff(OLD, tightened).semver_bump() == "major"
    documented = msg({**OLD.payload, "id": S("string", required=True, description="d")}, 2)
    assert diff(OLD, documented).semver_bump() == "patch"
    assert diff(OLD, msg(OLD.payload, 2)).semver_bump() == "none"
