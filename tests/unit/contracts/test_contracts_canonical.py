"""Canonical form and digest: cosmetic YAML changes never move the digest; meaning always does."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from accord.contracts.canonical import contract_digest, from_canonical, to_canonical
from accord.contracts.dsl import parse_text
from accord.contracts.sources import load_directory

REPO = Path(__file__).resolve().parents[3]
NAMES = st.sampled_from(["alpha", "beta-request", "gamma-result", "delta"])
FIELD_NAMES = st.sampled_from(["modelId", "size", "tags", "previewType", "angle", "meta", "flag"])


@st.composite
def fields(draw: st.DrawFn, depth: int = 0) -> dict[str, Any]:
    kinds = ["string", "integer", "number", "boolean", "array"] + (["object"] if depth < 1 else [])
    kind = draw(st.sampled_from(kinds))
    spec: dict[str, Any] = {"type": kind}
    if draw(st.booleans()):
        spec["required"] = draw(st.booleans())  # explicit false must equal absent
    if draw(st.booleans()):
        spec["description"] = draw(st.text("abc xyz'\"-", min_size=1, max_size=12))
    if kind == "string":
        low = draw(st.integers(0, 5))
        spec.update(minLength=low, maxLength=low + draw(st.integers(0, 5)))
        if draw(st.booleans()):
            spec["enum"] = sorted({"a" * spec["maxLength"], "b" * spec["maxLength"]})
    elif kind in ("integer", "number"):
        low = draw(st.integers(-100, 100))
        high = low + draw(st.integers(0, 100))
        spec.update(minimum=low, maximum=high, unit=draw(st.sampled_from(["px", "ms", "mm"])))
        if draw(st.booleans()):
            spec["default"] = draw(st.integers(low, high))
        if kind == "number" and draw(st.booleans()):
            spec["maximum"] = float(high)  # 512.0 and 512 are the same JSON number
    elif kind == "boolean":
        if draw(st.booleans()):
            spec["default"] = draw(st.booleans())
        spec["sensitive"] = draw(st.booleans())
    elif kind == "array":
        spec["items"] = {"type": "string", "maxLength": draw(st.integers(1, 9))}
        spec["maxItems"] = draw(st.integers(0, 9))
    else:
        inner = draw(st.dictionaries(FIELD_NAMES, fields(depth + 1), min_size=1, max_size=3))
        spec["fields"] = inner
    if draw(st.booleans()) and "default" not in spec:
        spec["nullable"] = True
        spec["default"] = None
    return spec


@st.composite
def message_docs(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "kind": "message",
        "name": draw(NAMES),
        "wireVersion": draw(st.integers(1, 9)),
        "owner": "team-a",
        "payload": draw(st.dictionaries(FIELD_NAMES, fields(), min_size=1, max_size=5)),
    }
    if draw(st.booleans()):
        doc["status"] = "active"  # the default status, written out
    if draw(st.booleans()):
        doc["transitive"] = False
    return doc


def _shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {k: _shuffled(value[k], rng) for k in keys}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


def _block_yaml(doc: dict[str, Any], *, flow: bool | None) -> str:
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = flow
    yaml.sort_base_mapping_type_on_output = False  # type: ignore[assignment]
    out = io.StringIO()
    yaml.dump(doc, out)
    return out.getvalue()


def _with_comments(text: str) -> str:
    lines = text.splitlines()
    return "# a comment before\n" + "\n".join(lines) + "\n# and one after\n"


@settings(max_examples=60, deadline=None)
@given(doc=message_docs(), seed=st.integers(0, 2**16))
def test_cosmetic_yaml_changes_do_not_change_the_digest(doc: dict[str, Any], seed: int) -> None:
    rng = random.Random(seed)
    renderings = [
        _block_yaml(doc, flow=False),
        _with_comments(_block_yaml(_shuffled(doc, rng), flow=False)),
        _block_yaml(_shuffled(doc, rng), flow=True),
        json.dumps(_shuffled(doc, rng), indent=1),  # JSON is YAML with every string quoted
    ]
    digests = {contract_digest(parse_text(text, "c.yaml")) for text in renderings}
    assert len(digests) == 1


@settings(max_examples=60, deadline=None)
@given(doc=message_docs())
def test_canonical_form_round_trips_to_an_equal_contract(doc: dict[str, Any]) -> None:
    contract = parse_text(json.dumps(doc), "c.yaml")
    canonical = to_canonical(contract)
    again = from_canonical(json.loads(json.dumps(canonical)))
    assert again == contract
    assert contract_digest(again) == contract_digest(contract)


@settings(max_examples=40, deadline=None)
@given(doc=message_docs(), bump=st.integers(1, 5))
def test_a_change_of_meaning_changes_the_digest(doc: dict[str, Any], bump: int) -> None:
    before = contract_digest(parse_text(json.dumps(doc), "c.yaml"))
    changed = json.loads(json.dumps(doc))
    changed["wireVersion"] += bump
    second = contract_digest(parse_text(json.dumps(changed), "c.yaml"))
    assert second != before
    name = next(iter(changed["payload"]))
    changed["payload"][name]["deprecated"] = True
    changed["payload"][name].pop("required", None)
    third = contract_digest(parse_text(json.dumps(changed), "c.yaml"))
    assert third != second


def test_explicit_false_and_omitted_are_the_same_contract() -> None:
    base = "kind: message\nname: m\nwireVersion: 1\nowner: a\npayload:\n"
    short = parse_text(base + "  a: {type: string}\n", "a.yaml")
    explicit = parse_text(
        base + "  a: {type: string, required: false, sensitive: false, deprecated: false}\n"
        "transitive: false\nstatus: active\n",
        "b.yaml",
    )
    assert contract_digest(short) == contract_digest(explicit)
    assert to_canonical(short)["payload"]["a"] == {"type": "string"}


def test_default_null_and_no_default_differ() -> None:
    base = "kind: message\nname: m\nwireVersion: 1\nowner: a\npayload:\n"
    none = parse_text(base + "  a: {type: string, nullable: true}\n", "a.yaml")
    null = parse_text(base + "  a: {type: string, nullable: true, default: null}\n", "b.yaml")
    assert contract_digest(none) != contract_digest(null)


def test_bundled_contracts_have_stable_distinct_digests() -> None:
    first = {str(c.name) + str(c.version): contract_digest(c) for c in _bundled()}
    second = {str(c.name) + str(c.version): contract_digest(c) for c in _bundled()}
    assert first == second
    assert len(set(first.values())) == len(first) >= 25
    assert all(d.startswith("sha256:") and len(d) == 71 for d in first.values())


def _bundled() -> list[Any]:
    return load_directory(REPO / "schemas" / "contracts")
