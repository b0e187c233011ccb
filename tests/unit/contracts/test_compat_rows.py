"""Every row of docs/compatibility.md, in both directions, at the top level, in a nested object and
in
array items: code, path, backward and forward verdicts and action."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from accord.contracts.compat import RULES, diff
from accord.contracts.model import FieldSpec, MessageContract

S = FieldSpec
TR, WV, CA, NONE = "tolerant-reader", "new-wire-version", "consumer-analysis", "none"


def msg(payload: Mapping[str, FieldSpec], version: int = 1, **kw: Any) -> MessageContract:
    return MessageContract(name="m", wire_version=version, owner="team", payload=payload, **kw)


@dataclass(frozen=True)
class Row:
    row: str
    old: dict[str, FieldSpec]
    new: dict[str, FieldSpec]
    code: str
    leaf: str
    backward: bool
    forward: bool
    action: str
    # the same change read new -> old: (code, leaf, backward, forward, action)
    reverse: tuple[str, str, bool, bool, str] | None


REQ = S("string", required=True)
OPT = S("string")
CASES: dict[str, Row] = {
    "1-add-optional": Row("1", {}, {"x": OPT}, "field-added-optional", "x", True, False, TR,
                          ("field-removed-optional", "x", False, True, TR)),
    "1-add-optional-default": Row("1", {}, {"x": S("integer", default=3)},
                                  "field-added-optional", "x", True, False, TR,
                                  ("field-removed-optional", "x", False, True, TR)),
    "2-add-required": Row("2", {}, {"x": REQ}, "field-added-required", "x", False, False, WV,
                          ("field-removed-required", "x", False, False, WV)),
    "3-add-required-default": Row("3", {}, {"x": S("string", required=True, default="a")},
                                  "field-added-required-with-default", "x", True, False, CA,
                                  ("field-removed-required-with-default", "x", False, True, TR)),
    "4-remove-optional": Row("4", {"x": OPT}, {}, "field-removed-optional", "x", False, True, TR,
                             ("field-added-optional", "x", True, False, TR)),
    "5-remove-required": Row("5", {"x": REQ}, {}, "field-removed-required", "x", False, False, WV,
                             ("field-added-required", "x", False, False, WV)),
    "6-optional-to-required": Row("6", {"x": OPT}, {"x": REQ}, "optional-to-required", "x",
                                  False, True, WV,
                                  ("required-to-optional", "x", True, False, CA)),
    "6-optional-to-required-default": Row(
        "6", {"x": S("string", default="a")}, {"x": S("string", required=True, default="a")},
        "optional-to-required-with-default", "x", True, True, CA,
        ("required-to-optional", "x", True, True, CA)),
    "7-required-to-optional": Row("7", {"x": REQ}, {"x": OPT}, "required-to-optional", "x",
                                  True, False, CA,
                                  ("optional-to-required", "x", False, True, WV)),
    "7-default-added-to-required": Row(
        "7", {"x": REQ}, {"x": S("string", required=True, default="a")},
        "default-added-to-required", "x", True, False, CA,
        ("default-removed-from-required", "x", False, True, WV)),
    "8-max-length-lowered": Row("8", {"x": S("string", max_length=10)},
                                {"x": S("string", max_length=5)}, "limit-tightened", "x",
                                False, True, WV, ("limit-relaxed", "x", True, False, CA)),
    "8-max-added": Row("8", {"x": S("integer")}, {"x": S("integer", maximum=9)},
                       "limit-tightened", "x", False, True, WV,
                       ("limit-relaxed", "x", True, False, CA)),
    "8-min-raised": Row("8", {"x": S("number", minimum=0)}, {"x": S("number", minimum=1.5)},
                        "limit-tightened", "x", False, True, WV,
                        ("limit-relaxed", "x", True, False, CA)),
    "8-exclusive-max-lowered": Row("8", {"x": S("number", exclusive_maximum=5)},
                                   {"x": S("number", exclusive_maximum=4)}, "limit-tightened",
                                   "x", False, True, WV, ("limit-relaxed", "x", True, False, CA)),
    "8-min-items-raised": Row("8", {"x": S("array", items=OPT)},
                              {"x": S("array", items=OPT, min_items=1)}, "limit-tightened", "x",
                              False, True, WV, ("limit-relaxed", "x", True, False, CA)),
    "8-pattern-added": Row("8", {"x": OPT}, {"x": S("string", pattern="^a")}, "pattern-added",
                           "x", False, True, WV, ("pattern-removed", "x", True, False, CA)),
    "8-pattern-changed": Row("8", {"x": S("string", pattern="^a")},
                             {"x": S("string", pattern="^b")}, "pattern-changed", "x",
                             False, False, WV, ("pattern-changed", "x", False, False, WV)),
    "8-format-added": Row("8", {"x": OPT}, {"x": S("string", format="uri")}, "format-added", "x",
                          False, True, WV, ("format-removed", "x", True, False, CA)),
    "8-format-changed": Row("8", {"x": S("string", format="uri")},
                            {"x": S("string", format="email")}, "format-changed", "x",
                            False, False, WV, ("format-changed", "x", False, False, WV)),
    "8-enum-value-removed": Row("8", {"x": S("string", enum=("a", "b"))},
                                {"x": S("string", enum=("a",))}, "enum-value-removed", "x",
                                False, True, WV, ("enum-value-added", "x", True, False, CA)),
    "8-enum-added": Row("8", {"x": OPT}, {"x": S("string", enum=("a",))}, "limit-tightened", "x",
                        False, True, WV, ("limit-relaxed", "x", True, False, CA)),
    "8-multiple-of-added": Row("8", {"x": S("integer")}, {"x": S("integer", multiple_of=2)},
                               "limit-tightened", "x", False, True, WV,
                               ("limit-relaxed", "x", True, False, CA)),
    "8-multiple-of-multiplied": Row("8", {"x": S("number", multiple_of=0.1)},
                                    {"x": S("number", multiple_of=0.3)}, "limit-tightened", "x",
                                    False, True, WV, ("limit-relaxed", "x", True, False, CA)),
    "8-multiple-of-unrelated": Row("8", {"x": S("integer", multiple_of=4)},
                                   {"x": S("integer", multiple_of=6)}, "limit-changed", "x",
                                   False, False, WV, ("limit-changed", "x", False, False, WV)),
    "9-max-raised": Row("9", {"x": S("integer", maximum=10)}, {"x": S("integer", maximum=20)},
                        "limit-relaxed", "x", True, False, CA,
                        ("limit-tightened", "x", False, True, WV)),
    "9-pattern-removed": Row("9", {"x": S("string", pattern="^a")}, {"x": OPT},
                             "pattern-removed", "x", True, False, CA,
                             ("pattern-added", "x", False, True, WV)),
    "10-enum-value-added": Row("10", {"x": S("string", enum=("a",))},
                               {"x": S("string", enum=("a", "b"))}, "enum-value-added", "x",
                               True, False, CA, ("enum-value-removed", "x", False, True, WV)),
    "10-enum-bool-vs-int": Row("10", {"x": S("integer", enum=(1,))},
                               {"x": S("integer", enum=(1, True))}, "enum-value-added", "x",
                               True, False, CA, ("enum-value-removed", "x", False, True, WV)),
    "11-integer-to-number": Row("11", {"x": S("integer")}, {"x": S("number")}, "type-widened",
                                "x", True, False, CA, ("type-narrowed", "x", False, True, WV)),
    "11-string-to-integer": Row("11", {"x": OPT}, {"x": S("integer")}, "type-changed", "x",
                                False, False, WV, ("type-changed", "x", False, False, WV)),
    "11-object-to-array": Row("11", {"x": S("object", fields={"a": OPT})},
                              {"x": S("array", items=OPT)}, "type-changed", "x", False, False,
                              WV, ("type-changed", "x", False, False, WV)),
    "11-item-type": Row("11", {"x": S("array", items=OPT)}, {"x": S("array", items=S("boolean"))},
                        "type-changed", "x[]", False, False, WV,
                        ("type-changed", "x[]", False, False, WV)),
    "12-make-nullable": Row("12", {"x": OPT}, {"x": S("string", nullable=True)},
                            "nullable-added", "x", True, False, CA,
                            ("nullable-removed", "x", False, True, WV)),
    "13-make-non-nullable": Row("13", {"x": S("string", nullable=True)}, {"x": OPT},
                                "nullable-removed", "x", False, True, WV,
                                ("nullable-added", "x", True, False, CA)),
    "14-default-changed": Row("14", {"x": S("string", default="a")},
                              {"x": S("string", default="b")}, "default-changed", "x",
                              True, True, CA, ("default-changed", "x", True, True, CA)),
    "14-default-int-vs-float": Row("14", {"x": S("number", default=1)},
                                   {"x": S("number", default=1.0)}, "default-changed", "x",
                                   True, True, CA, ("default-changed", "x", True, True, CA)),
    "14-default-added-optional": Row("14", {"x": OPT}, {"x": S("string", default="a")},
                                     "default-changed", "x", True, True, CA,
                                     ("default-changed", "x", True, True, CA)),
    "15-unit-changed": Row("15", {"x": S("integer", unit="px")}, {"x": S("integer", unit="mm")},
                           "unit-changed", "x", True, True, CA,
                           ("unit-changed", "x", True, True, CA)),
    "15-semantic-description": Row(
        "15", {"x": S("integer", description="Semantic: longest edge")},
        {"x": S("integer", description="Semantic: shortest edge")}, "meaning-changed", "x",
        True, True, CA, ("meaning-changed", "x", True, True, CA)),
    "16-sensitive-added": Row("16", {"x": OPT}, {"x": S("string", sensitive=True)},
                              "sensitive-added", "x", True, True, NONE,
                              ("sensitive-removed", "x", True, True, CA)),
    "17-rename": Row("17", {"a": OPT}, {"b": OPT}, "field-renamed", "b", False, False, WV,
                     ("field-renamed", "a", False, False, WV)),
    "17-rename-object": Row("17", {"a": S("object", fields={"k": REQ})},
                            {"b": S("object", fields={"k": REQ}, description="moved")},
                            "field-renamed", "b", False, False, WV,
                            ("field-renamed", "a", False, False, WV)),
    "20-description": Row("20", {"x": S("string", description="one")},
                          {"x": S("string", description="two")}, "description-changed", "x",
                          True, True, NONE, ("description-changed", "x", True, True, NONE)),
    "20-deprecated": Row("20", {"x": OPT}, {"x": S("string", deprecated=True)},
                         "deprecated-changed", "x", True, True, NONE,
                         ("deprecated-changed", "x", True, True, NONE)),
}  # fmt: skip


def _top(fields: dict[str, FieldSpec]) -> tuple[dict[str, FieldSpec], str]:
    return {"keep": REQ, **fields}, "payload"


def _nested(fields: dict[str, FieldSpec]) -> tuple[dict[str, FieldSpec], str]:
    return {"outer": S("object", required=True, fields={"keep": REQ, **fields})}, "payload.outer"


def _in_items(fields: dict[str, FieldSpec]) -> tuple[dict[str, FieldSpec], str]:
    item = S("object", fields={"keep": REQ, **fields})
    return {"list": S("array", items=item)}, "payload.list[]"


def _deep_items(fields: dict[str, FieldSpec]) -> tuple[dict[str, FieldSpec], str]:
    item = S("array", items=S("object", fields={"keep": REQ, **fields}))
    return {"grid": S("array", items=item)}, "payload.grid[][]"


WRAPS = {"top": _top, "nested": _nested, "items": _in_items, "items-of-items": _deep_items}
PARAMS = [
    pytest.param(case, wrap, reverse, id=f"{name}-{wrap}-{'reverse' if reverse else 'forward'}")
    for name, case in CASES.items()
    for wrap in WRAPS
    for reverse in ((False, True) if case.reverse else (False,))
]


@pytest.mark.parametrize(("case", "wrap", "reverse"), PARAMS)
def test_row(case: Row, wrap: str, reverse: bool) -> None:
    old_payload, base = WRAPS[wrap](case.old)
    new_payload, _ = WRAPS[wrap](case.new)
    old, new = msg(old_payload, 1), msg(new_payload, 2)
    if reverse:
        assert case.reverse is not None
        old, new = msg(new_payload, 1), msg(old_payload, 2)
        code, leaf, backward, forward, action = case.reverse
    else:
        code, leaf, backward, forward, action = (
            case.code, case.leaf, case.backward, case.forward, case.action,
        )  # fmt: skip
    report = diff(old, new)
    got = [(c.code, c.path, c.backward, c.forward, c.action) for c in report.changes]
    assert got == [(code, f"{base}.{leaf}", backward, forward, action)]
    assert RULES[code].row in {case.row, "x"} or reverse
    assert report.backward_compatible is backward
    assert report.forward_compatible is forward


def test_cases_cover_every_field_row() -> None:
    rows = {case.row for case in CASES.values()}
    assert rows == {str(n) for n in range(1, 21)} - {"18", "19"}  # 18, 19: test_compat_contract


def test_cases_cover_every_field_code() -> None:
    exercised = {c.code for c in CASES.values()} | {
        c.reverse[0] for c in CASES.values() if c.reverse
    }
    contract_level = {
        "routing-changed", "outcome-added", "outcome-removed", "owner-changed",
        "reserved-name-reused", "name-changed", "request-changed", "result-changed",
        "error-code-added", "error-code-removed", "idempotency-changed", "cacheable-changed",
    }  # fmt: skip
    assert set(RULES) - contract_level == exercised


def test_row_numbers_match_the_table_for_the_listed_codes() -> None:
    table = {
        "field-added-optional": "1", "field-added-required": "2",
        "field-added-required-with-default": "3", "field-removed-optional": "4",
        "field-removed-required": "5", "optional-to-required": "6", "required-to-optional": "7",
        "limit-tightened": "8", "pattern-changed": "8", "limit-relaxed": "9",
        "enum-value-added": "10", "type-changed": "11", "type-widened": "11",
        "nullable-added": "12", "nullable-removed": "13", "default-changed": "14",
        "unit-changed": "15", "sensitive-added": "16", "sensitive-removed": "16",
        "field-renamed": "17", "routing-changed": "18", "outcome-added": "19",
        "outcome-removed": "19", "description-changed": "20",
    }  # fmt: skip
    assert {code: RULES[code].row for code in table} == table
