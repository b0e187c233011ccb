"""Redaction masks every sensitive field, however deep, and never mutates its input."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from accord.contracts.redact import MASK, redact, sensitive_paths
from accord.testing.sample_contracts import plain_note, scan_request


def test_top_level_nested_and_array_item_fields_are_masked() -> None:
    message = {
        "modelId": "m1",
        "secret": "hunter22",
        "views": [{"angle": 1, "token": "t-1"}, {"angle": 2, "token": None}, {"angle": 3}],
        "options": {"scale": 1, "credentials": {"user": "root"}},
        "tags": ["a"],
    }
    before = copy.deepcopy(message)
    out = redact(scan_request(), message)
    assert message == before
    assert out == {
        "modelId": "m1",
        "secret": MASK,
        "views": [{"angle": 1, "token": MASK}, {"angle": 2, "token": MASK}, {"angle": 3}],
        "options": {"scale": 1, "credentials": MASK},
        "tags": ["a"],
    }


def test_unknown_members_are_masked_because_they_may_hide_a_secret() -> None:
    out = redact(plain_note(), {"text": "hi", "password": "p", "count": 2})
    assert out == {"text": "hi", "password": MASK, "count": 2}


def test_values_of_the_wrong_shape_pass_through_without_error() -> None:
    assert redact(scan_request(), {"views": "nope", "options": [1]}) == {
        "views": "nope",
        "options": [1],
    }
    assert redact(scan_request(), "not an object") == "not an object"


def test_sensitive_paths_lists_schema_paths() -> None:
    assert sensitive_paths(scan_request()) == ["options.credentials", "secret", "views[].token"]
    assert sensitive_paths(plain_note()) == []


_secret = st.text(min_size=6, max_size=12).map(lambda s: "S3CRET" + s)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)


@given(
    secret=_secret,
    token=_secret,
    creds=_json,
    views=st.lists(st.booleans(), max_size=4),
    extra=st.dictionaries(st.text(min_size=1, max_size=4), _secret, max_size=3),
)
def test_redaction_never_leaks_a_sensitive_value(
    secret: str, token: str, creds: Any, views: list[bool], extra: dict[str, str]
) -> None:
    message: dict[str, Any] = {
        "secret": secret,
        "options": {"credentials": {"user": creds, "pw": token}},
        "views": [{"angle": 1, "token": token} if t else {"angle": 2} for t in views],
        **{k: v for k, v in extra.items() if k not in {"secret", "options", "views"}},
    }
    text = json.dumps(redact(scan_request(), message))
    assert "S3CRET" not in text
