"""Canonical JSON (accord.canonical): the fast encoder writes the reference encoder's bytes, or
refuses what it refuses, on arbitrary values; digests therefore never move."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.canonical import canonical_json, canonical_text, digest_of, reference_json


def _outcome(encode: Any, value: Any) -> bytes | type[BaseException]:
    try:
        return encode(value)  # type: ignore[no-any-return]
    except (TypeError, ValueError, UnicodeError) as exc:
        return type(exc)


def _same(value: Any) -> None:
    fast, reference = _outcome(canonical_json, value), _outcome(reference_json, value)
    assert fast == reference, (value, fast, reference)


# text with every kind of character, lone surrogates and control characters included
TEXT = st.text(st.characters(codec=None, categories=None), max_size=12) | st.sampled_from(
    ["e-", "1e-7", "0.00003", "null", "NaN", 'a"b\\c', "\x00\x1f\x7f\u2028\ufeff"]
)
FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [1e-7, 3e-5, 1e-4, 9.99e-5, 1e16, 1e21, 1e22, 5e-324, -0.0, 1.7976931348623157e308]
)
INTS = st.integers() | st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63) - 1])
SCALARS = st.none() | st.booleans() | INTS | FLOATS | TEXT
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(TEXT, inner, max_size=4)
        | st.dictionaries(st.integers(-3, 3), inner, max_size=2)
    ),
    max_leaves=20,
)


@settings(max_examples=3000, deadline=None)
@given(VALUES)
def test_fast_encoder_writes_the_reference_bytes_or_refuses_alike(value: Any) -> None:
    _same(value)


@settings(max_examples=2000, deadline=None)
@given(FLOATS, st.sampled_from(["bare", "list", "dict", "beside-null"]))
def test_every_float_is_written_as_the_reference_writes_it(x: float, where: str) -> None:
    value = {"bare": x, "list": [x], "dict": {"k": x}, "beside-null": {"a": None, "b": x}}[where]
    _same(value)
    if math.isfinite(x):
        assert json.loads(canonical_json(value)) == value


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ({"b": 1, "a": [1e-7, 3e-5, 0.5]}, b'{"a":[1e-07,3e-05,0.5],"b":1}'),
        ({"é": "\u2028", "e": None}, '{"e":null,"é":"\u2028"}'.encode()),
        ([2**64, {"1": 2}], b'[18446744073709551616,{"1":2}]'),
        ({2: "int key"}, b'{"2":"int key"}'),
        ('tab\tquote"', b'"tab\\tquote\\""'),
    ],
)
def test_values_orjson_would_write_differently_take_the_reference_form(
    value: Any, written: bytes
) -> None:
    assert canonical_json(value) == written == reference_json(value)
    assert canonical_text(value) == written.decode()


@dataclasses.dataclass
class _Point:
    x: int


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ({"a": math.nan}, ValueError),
        ([None, math.inf], ValueError),
        ({"a": {"b": -math.inf}}, ValueError),
        (_Point(1), TypeError),
        ({"at": datetime.datetime(2026, 1, 1)}, TypeError),
        ({1.5: "float key"}, None),  # the reference writes it as "1.5"
        ({"s": "\ud800"}, UnicodeEncodeError),
    ],
)
def test_what_the_reference_refuses_is_refused(value: Any, error: type | None) -> None:
    if error is None:
        assert canonical_json(value) == reference_json(value)
        return
    with pytest.raises(error):
        canonical_json(value)
    with pytest.raises(error):
        reference_json(value)


def test_digests_are_of_the_reference_bytes() -> None:
    value = {"stages": [{"name": "render", "timeout_s": 1e-5}], "z": None}
    assert digest_of(value) == digest_of(json.loads(reference_json(value)))
    assert b"1e-05" in canonical_json(value)
