"""Meta-validation of contract sources: every bad input names code, file:line:column and path."""

from __future__ import annotations

import json
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.contracts.dsl import lint_sources, lint_text, parse_sources, parse_text
from accord.contracts.model import MISSING, CapabilityContract, MessageContract, PolicyContract
from accord.errors import ContractLintError

GOOD = """\
kind: message
name: sample-request
wireVersion: 1
owner: team-a
payload:
  modelId: {type: string, required: true}
  size: {type: integer, minimum: 1, maximum: 10, default: 5, unit: px}
"""


def _doc(payload: str, head: str = "") -> str:
    """A message document whose payload lines start at line 6 (column 3 for field names)."""
    top = head or "kind: message\nname: sample\nwireVersion: 1\nowner: team-a\n"
    return top + "payload:\n" + textwrap.indent(textwrap.dedent(payload), "  ")


# (source, code, line, token pointed at, path)
BAD_CASES = [
    pytest.param(
        _doc("a: {type: strng}\n"), "dsl-bad-field-type", 6, "strng", "payload.a.type", id="type"
    ),
    pytest.param(
        _doc("a: {type: string, colour: red}\n"),
        "dsl-unknown-key",
        6,
        "colour",
        "payload.a.colour",
        id="unknown-field-key",
    ),
    pytest.param(
        _doc("a: {type: integer, maxLength: 3}\n"),
        "dsl-constraint-not-applicable",
        6,
        "3}",
        "payload.a.maxLength",
        id="constraint-type",
    ),
    pytest.param(
        _doc("a: {type: string, minLength: 5, maxLength: 2}\n"),
        "dsl-bad-constraint",
        6,
        "2}",
        "payload.a.maxLength",
        id="min-over-max",
    ),
    pytest.param(
        _doc("a: {type: integer, minimum: 9, maximum: 2}\n"),
        "dsl-bad-constraint",
        6,
        "2}",
        "payload.a.maximum",
        id="minimum-over-maximum",
    ),
    pytest.param(
        _doc("a: {type: string, pattern: '('}\n"),
        "dsl-bad-pattern",
        6,
        "'('",
        "payload.a.pattern",
        id="pattern",
    ),
    pytest.param(
        _doc("a: {type: string, format: colour}\n"),
        "dsl-unknown-format",
        6,
        "colour",
        "payload.a.format",
        id="format",
    ),
    pytest.param(
        _doc("a: {type: integer, minimum: 10, default: 5}\n"),
        "dsl-bad-default",
        6,
        "5}",
        "payload.a.default",
        id="default-below-minimum",
    ),
    pytest.param(
        _doc("a: {type: string, enum: [x, y], default: z}\n"),
        "dsl-bad-default",
        6,
        "z}",
        "payload.a.default",
        id="default-not-in-enum",
    ),
    pytest.param(
        _doc("a: {type: boolean, default: null}\n"),
        "dsl-bad-default",
        6,
        "null",
        "payload.a.default",
        id="default-null-not-nullable",
    ),
    pytest.param(
        _doc("a: {type: string, maxLength: 2, default: long}\n"),
        "dsl-bad-default",
        6,
        "long",
        "payload.a.default",
        id="default-too-long",
    ),
    pytest.param(
        _doc("a: {type: string, enum: [x, x]}\n"),
        "dsl-bad-enum",
        6,
        "[x",
        "payload.a.enum",
        id="enum-duplicate",
    ),
    pytest.param(
        _doc("a: {type: integer, enum: [1, two]}\n"),
        "dsl-bad-enum",
        6,
        "[1",
        "payload.a.enum",
        id="enum-type",
    ),
    pytest.param(
        _doc("a: {type: string, enum: []}\n"),
        "dsl-bad-enum",
        6,
        "[]",
        "payload.a.enum",
        id="enum-empty",
    ),
    pytest.param(
        _doc("Bad_Name: {type: string}\n"),
        "dsl-bad-field-name",
        6,
        "Bad_Name",
        "payload.Bad_Name",
        id="field-name",
    ),
    pytest.param(
        _doc("a: {type: array}\n"),
        "dsl-missing-key",
        6,
        "{type",
        "payload.a.items",
        id="array-without-items",
    ),
    pytest.param(
        _doc("a: {type: array, items: {type: string, required: true}}\n"),
        "dsl-item-annotation",
        6,
        "true",
        "payload.a[].required",
        id="item-required",
    ),
    pytest.param(
        _doc("a:\n  type: object\n  fields:\n    b: {type: numbr}\n"),
        "dsl-bad-field-type",
        9,
        "numbr",
        "payload.a.b.type",
        id="nested-field",
    ),
    pytest.param(
        _doc("a: {type: string, unit: px}\n"),
        "dsl-constraint-not-applicable",
        6,
        "px",
        "payload.a.unit",
        id="unit-on-string",
    ),
    pytest.param(
        _doc("a: {type: string, required: yes}\n"),
        "dsl-wrong-type",
        6,
        "yes",
        "payload.a.required",
        id="yes-is-a-string",
    ),
    pytest.param(
        _doc("a: {type: integer, minimum: 1.5}\n"),
        "dsl-wrong-type",
        6,
        "1.5",
        "payload.a.minimum",
        id="integer-bound-float",
    ),
    pytest.param(
        _doc("a: {type: string, required: true, deprecated: true}\n"),
        "dsl-deprecated-required",
        6,
        "true",
        "payload.a.deprecated",
        id="deprecated-required",
    ),
    pytest.param(
        _doc("a: {type: string}\n") + "reserved: [a]\n",
        "dsl-reserved-field",
        6,
        "a:",
        "payload.a",
        id="reserved",
    ),
    pytest.param(
        _doc("a: {type: string}\n") + "outcome: [x]\n",
        "dsl-unknown-key",
        7,
        "outcome",
        "outcome",
        id="unknown-top-key",
    ),
    pytest.param(
        _doc("a: {type: string}\n", "kind: message\nname: Sample\nwireVersion: 1\nowner: team-a\n"),
        "dsl-bad-name",
        2,
        "Sample",
        "name",
        id="name-grammar",
    ),
    pytest.param(
        _doc("a: {type: string}\n", "kind: message\nname: sample\nwireVersion: 0\nowner: team-a\n"),
        "dsl-bad-value",
        3,
        "0",
        "wireVersion",
        id="version-zero",
    ),
    pytest.param(
        _doc("a: {type: string}\n", "kind: message\nname: sample\nwireVersion: 1\n\n"),
        "dsl-missing-key",
        1,
        "kind",
        "owner",
        id="owner-required",
    ),
    pytest.param(
        _doc("a: {type: string}\n", "kind: message\nname: sample\nversion: 1\nowner: team-a\n"),
        "dsl-unknown-key",
        3,
        "version",
        "version",
        id="version-not-wireVersion",
    ),
    pytest.param(
        _doc(
            "a: {type: string}\n",
            "kind: message\nname: sample\nwireVersion: 1\nowner: team-a\nstatus: deprecated\n",
        ),
        "dsl-lifecycle",
        5,
        "deprecated",
        "supportUntil",
        id="deprecated-needs-supportUntil",
    ),
    pytest.param(
        _doc(
            "a: {type: string}\n",
            "kind: message\nname: sample\nwireVersion: 1\nowner: team-a\nstatus: planned\n",
        ),
        "dsl-lifecycle",
        5,
        "planned",
        "reviewDate",
        id="planned-needs-reviewDate",
    ),
    pytest.param(
        _doc(
            "a: {type: string}\n",
            "kind: message\nname: sample\nwireVersion: 1\nowner: team-a\nstatus: gone\n",
        ),
        "dsl-bad-status",
        5,
        "gone",
        "status",
        id="status",
    ),
    pytest.param(
        _doc(
            "a: {type: string}\n",
            "kind: message\nname: sample\nwireVersion: 1\n"
            "owner: team-a\nstatus: deprecated\nsupportUntil: soon\n",
        ),
        "dsl-bad-date",
        6,
        "soon",
        "supportUntil",
        id="date",
    ),
    pytest.param("kind: event\nname: x\n", "dsl-bad-kind", 1, "event", "kind", id="kind"),
    pytest.param("name: x\n", "dsl-missing-key", 1, "name", "kind", id="kind-missing"),
    pytest.param("- a\n- b\n", "dsl-wrong-type", 1, "- a", "", id="not-a-mapping"),
    pytest.param(
        "kind: message\nkind: worker\n", "yaml-duplicate-key", 2, "kind", "", id="duplicate"
    ),
    pytest.param("kind: [message\nname: x\n", "yaml-syntax", 2, ":", "", id="syntax"),
    pytest.param("", "yaml-empty", 1, "", "", id="empty"),
    pytest.param(
        GOOD + "---\nkind: message\n", "yaml-multiple-documents", 9, "kind", "", id="two-documents"
    ),
    pytest.param(
        "kind: worker\nname: render\nversion: 1\nowner: a\nrequest: r@1\nresult: s@1\nqueue: q\n",
        "dsl-bad-name",
        2,
        "render",
        "name",
        id="capability-not-dotted",
    ),
    pytest.param(
        "kind: worker\nname: a.render\nversion: 1\nowner: a\nrequest: r\nresult: s@1\nqueue: q\n",
        "dsl-bad-name",
        5,
        "r",
        "request",
        id="request-not-a-ref",
    ),
    pytest.param(
        "kind: worker\nname: a.render\nversion: 1\nowner: a\nrequest: r@1\nresult: s@1\n",
        "dsl-missing-key",
        1,
        "kind",
        "queue",
        id="worker-needs-queue",
    ),
    pytest.param(
        "kind: action\nname: a.run\nversion: 1\nowner: a\nrequest: r@1\nresult: s@1\nqueue: q\n",
        "dsl-action-queue",
        7,
        "q",
        "queue",
        id="action-has-no-queue",
    ),
    pytest.param(
        "kind: action\nname: a.run\nversion: 1\nowner: a\nrequest: r@1\nresult: s@1\n"
        "limits: {timeMs: 0}\n",
        "dsl-bad-value",
        7,
        "0",
        "limits.timeMs",
        id="limits",
    ),
    pytest.param(
        "kind: action\nname: a.run\nversion: 1\nowner: a\nrequest: r@1\nresult: s@1\n"
        "errors: [Bad Code]\n",
        "dsl-bad-name",
        7,
        "Bad Code",
        "errors[0]",
        id="error-code",
    ),
    pytest.param(
        "kind: policy\nname: p\nversion: 1\nowner: a\nrules: {}\n",
        "dsl-wrong-type",
        5,
        "{}",
        "rules",
        id="policy-rules-empty",
    ),
    pytest.param(
        _doc("a: {type: string}\n") + "changes:\n  - {version: 2, summary: x}\n",
        "dsl-change-record",
        8,
        "- {",
        "changes",
        id="change-above-version",
    ),
    pytest.param(
        _doc("a: {type: string}\n") + "tolerates:\n  - {version: 1, fields: [b]}\n",
        "dsl-tolerance",
        8,
        "1,",
        "tolerates[0].version",
        id="tolerance-own-version",
    ),
]


@pytest.mark.parametrize(("source", "code", "line", "token", "path"), BAD_CASES)
def test_bad_source_is_reported_with_code_location_and_path(
    source: str, code: str, line: int, token: str, path: str
) -> None:
    """``token`` is the text the diagnostic must point at: its last occurrence on ``line``."""
    text = (source.splitlines() or [""])[line - 1]
    column = text.rindex(token) + 1
    contract, diagnostics = lint_text(source, "bad.yaml")
    assert contract is None
    found = [
        (d.code, d.location.line, d.location.column, d.path) for d in diagnostics if d.location
    ]
    assert (code, line, column, path) in found, diagnostics
    assert all(d.location and d.location.file == "bad.yaml" for d in diagnostics)


def test_every_error_in_a_file_is_reported_at_once() -> None:
    source = _doc(
        "a: {type: strng}\n"
        "b: {type: string, minLength: 3, maxLength: 1}\n"
        "c: {type: integer, default: x}\n"
        "d: {type: boolean, colour: red}\n",
    )
    with pytest.raises(ContractLintError) as caught:
        parse_text(source, "many.yaml")
    codes = sorted(d.code for d in caught.value.diagnostics)
    assert codes == [
        "dsl-bad-constraint",
        "dsl-bad-default",
        "dsl-bad-field-type",
        "dsl-unknown-key",
    ]
    assert "many.yaml:6:" in str(caught.value)
    lines = [d.location.line for d in caught.value.diagnostics if d.location]
    assert lines == sorted(lines)


def test_unknown_key_suggests_the_closest_known_key() -> None:
    _, diagnostics = lint_text(_doc("a: {type: string, maxLenght: 3}\n"), "x.yaml")
    assert "did you mean 'maxLength'?" in diagnostics[0].message


def test_good_message_becomes_a_frozen_model() -> None:
    contract = parse_text(GOOD, "good.yaml")
    assert isinstance(contract, MessageContract)
    assert str(contract.ref) == "sample-request@1"
    size = contract.payload["size"]
    assert (size.type, size.minimum, size.maximum, size.default, size.unit) == (
        "integer",
        1,
        10,
        5,
        "px",
    )
    assert contract.payload["modelId"].required and contract.payload["modelId"].default is MISSING
    assert contract.source is not None and contract.source.file == "good.yaml"


def test_default_null_is_kept_distinct_from_no_default() -> None:
    contract = parse_text(_doc("a: {type: string, nullable: true, default: null}\n"), "n.yaml")
    assert isinstance(contract, MessageContract)
    assert contract.payload["a"].has_default and contract.payload["a"].default is None


def test_unquoted_and_quoted_dates_read_the_same() -> None:
    head = "kind: message\nname: s\nwireVersion: 1\nowner: a\nstatus: deprecated\n"
    plain = parse_text(_doc("a: {type: string}\n", head + "supportUntil: 2027-01-31\n"), "a.yaml")
    quoted = parse_text(_doc("a: {type: string}\n", head + "supportUntil: '2027-01-31'\n"), "b")
    assert plain.support_until == quoted.support_until == "2027-01-31"


CAPABILITY = (
    "kind: worker\nname: a.run\nversion: 1\nowner: a\nrequest: {req}\nresult: out@1\nqueue: q\n"
)
REQUEST = _doc("modelId: {type: string, required: true}\n").replace("name: sample", "name: req")
RESULT = REQUEST.replace("name: req", "name: out")


def test_a_set_resolves_references_between_contracts() -> None:
    contracts = parse_sources(
        {"cap.yaml": CAPABILITY.format(req="req@1"), "req.yaml": REQUEST, "out.yaml": RESULT}
    )
    kinds = {type(c) for c in contracts}
    assert kinds == {CapabilityContract, MessageContract}
    assert [c.name for c in contracts] == ["a.run", "out", "req"]  # sorted by identity


@pytest.mark.parametrize(
    ("files", "code", "where"),
    [
        (
            {"cap.yaml": CAPABILITY.format(req="req@2"), "req.yaml": REQUEST, "out.yaml": RESULT},
            "ref-unresolved",
            ("cap.yaml", 5, 10),
        ),
        ({"a.yaml": REQUEST, "b.yaml": REQUEST}, "ref-duplicate-contract", ("b.yaml", 1, 1)),
        (
            {
                "cap.yaml": CAPABILITY.format(req="req@1"),
                "out.yaml": RESULT,
                "req.yaml": REQUEST.replace(
                    "owner: team-a",
                    "owner: team-a\nstatus: planned\nreviewDate: 2027-01-01\npromotionCriteria: x",
                ),
            },
            "ref-planned",
            ("cap.yaml", 5, 10),
        ),
        (
            {
                "m.yaml": REQUEST,
                "p.yaml": "kind: policy\nname: req\nversion: 1\nowner: a\nrules: {x: 1}\n",
            },
            "ref-name-clash",
            ("p.yaml", 1, 1),
        ),
        (
            {"m.yaml": REQUEST + "outcomes: [missing-outcome]\n"},
            "ref-unresolved",
            ("m.yaml", 7, 12),
        ),
    ],
    ids=["unresolved", "duplicate", "planned", "name-clash", "outcome"],
)
def test_cross_contract_rules(
    files: dict[str, str], code: str, where: tuple[str, int, int]
) -> None:
    _, diagnostics = lint_sources(files)
    found = [
        (d.code, (d.location.file, d.location.line, d.location.column))
        for d in diagnostics
        if d.location
    ]
    assert (code, where) in found, diagnostics
    with pytest.raises(ContractLintError):
        parse_sources(files)


def test_policy_is_parsed_with_its_rules() -> None:
    source = "kind: policy\nname: limits\nversion: 2\nowner: a\nrules: {maxTags: 20}\n"
    policy = parse_text(source, "p.yaml")
    assert isinstance(policy, PolicyContract)
    assert dict(policy.rules) == {"maxTags": 20}


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["kind", "name", "payload", "type", "fields", "items", "default", "x"]),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=80))
def test_arbitrary_text_never_crashes_the_linter(text: str) -> None:
    contract, diagnostics = lint_text(text, "fuzz.yaml")
    assert (contract is None) == bool(diagnostics)
    assert all(d.location is not None and d.location.file == "fuzz.yaml" for d in diagnostics)


@settings(max_examples=150, deadline=None)
@given(kind=st.sampled_from(["message", "worker", "action", "policy"]), body=JSON_VALUES)
def test_arbitrary_documents_are_refused_with_located_diagnostics(kind: str, body: object) -> None:
    document = {"kind": kind, "payload": body, "rules": body, "request": body}
    contract, diagnostics = lint_text(json.dumps(document), "fuzz.yaml")
    assert contract is None and diagnostics
    assert all(d.location is not None and d.location.line >= 1 for d in diagnostics)
