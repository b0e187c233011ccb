"""Property tests: the validator accepts everything the contract allows, and nothing more.

Messages are generated from each contract's own field specs (every real contract under
``schemas/contracts`` plus the feature-complete sample). The expected normalised value comes
from the fixtures module's independent default walk, not from the validator under test.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accord.contracts.dsl import load_directory
from accord.contracts.fixture_values import example
from accord.contracts.fixtures import _with_defaults
from accord.contracts.model import FieldSpec, MessageContract
from accord.contracts.paths import join
from accord.contracts.validate import Validator
from accord.testing.sample_contracts import scan_request

ROOT = Path(__file__).resolve().parents[3]
CONTRACTS = [
    scan_request(),
    *sorted(
        (c for c in load_directory(ROOT / "schemas/contracts") if isinstance(c, MessageContract)),
        key=lambda c: str(c.ref),
    ),
]


def _scalar(spec: FieldSpec) -> st.SearchStrategy[Any]:
    if spec.enum is not None:
        return st.sampled_from([v for v in spec.enum if v is not None])
    if spec.type == "boolean":
        return st.booleans()
    if spec.type == "string":
        if spec.format is not None or spec.pattern is not None:
            return st.just(example(spec))
        return st.text(min_size=spec.min_length or 0, max_size=min(spec.max_length or 20, 20))
    if spec.type == "integer":
        low = spec.minimum if spec.minimum is not None else -(10**6)
        high = spec.maximum if spec.maximum is not None else 10**6
        return st.integers(int(low), int(high)).filter(
            lambda v: not spec.multiple_of or v % spec.multiple_of == 0
        )
    low = spec.exclusive_minimum if spec.exclusive_minimum is not None else spec.minimum
    high = spec.exclusive_maximum if spec.exclusive_maximum is not None else spec.maximum
    return st.floats(
        min_value=low if low is not None else -1e9,
        max_value=high if high is not None else 1e9,
        exclude_min=spec.exclusive_minimum is not None,
        exclude_max=spec.exclusive_maximum is not None,
        allow_nan=False,
    ) | st.just(example(spec))


def _value(spec: FieldSpec) -> st.SearchStrategy[Any]:
    if spec.type == "object":
        base = _object(spec.fields) if spec.fields is not None else st.just({"free": [1]})
    elif spec.type == "array" and spec.items is not None:
        high = min(spec.max_items if spec.max_items is not None else 3, 3)
        low = min(spec.min_items or 0, high)
        base = st.lists(_value(spec.items), min_size=low, max_size=high)
    else:
        base = _scalar(spec)
    return (base | st.none()) if spec.nullable else base


def _object(fields: Any) -> st.SearchStrategy[dict[str, Any]]:
    required = {n: _value(s) for n, s in fields.items() if s.required and not s.has_default}
    optional = {n: _value(s) for n, s in fields.items() if n not in required}
    return st.fixed_dictionaries(required, optional=optional)


@pytest.mark.parametrize("contract", CONTRACTS, ids=lambda c: str(c.ref))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_generated_messages_are_accepted_and_normalised(
    contract: MessageContract, data: st.DataObject
) -> None:
    message = data.draw(_object(contract.payload))
    before = copy.deepcopy(message)
    validator = Validator.for_contract(contract)
    result = validator.validate(message)
    assert result.ok, result.violations
    assert result.value == _with_defaults(contract.payload, message)
    assert message == before
    assert validator.validate(result.value).value == result.value  # normalising is idempotent
    as_bytes = validator.validate(json.dumps(message).encode())
    assert as_bytes.ok and as_bytes.value == result.value


@pytest.mark.parametrize("contract", CONTRACTS, ids=lambda c: str(c.ref))
@settings(max_examples=15, deadline=None)
@given(data=st.data(), key=st.text(min_size=1, max_size=8))
def test_any_unknown_member_is_reported_at_its_path(
    contract: MessageContract, data: st.DataObject, key: str
) -> None:
    message = data.draw(_object(contract.payload))
    if key in contract.payload:
        return
    result = Validator.for_contract(contract).validate({**message, key: 0})
    assert not result.ok
    assert [v.code for v in result.violations] == ["unknown-field"]
    assert result.paths == [join("", key)]
