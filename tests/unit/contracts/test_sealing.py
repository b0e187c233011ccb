"""Sealing sensitive fields: a round trip returns the value and its type, rotation keeps old
tokens opening, a token altered anywhere or under a key the ring lacks never opens, and the
validator, the binding resolver and the worker's wire accept a token where a sensitive field is
expected, and only there."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.contracts.catalog import Catalog
from accord.contracts.dsl.files import load_file
from accord.contracts.model import MessageContract
from accord.contracts.sealing import (
    PREFIX,
    Keyring,
    SealingError,
    is_sealed,
    open_all,
    seal_fields,
)
from accord.contracts.sources import load_catalog
from accord.contracts.validate import Validator
from accord.workflow.bindings import BindingError, parse_binding, resolve_binding

ROOT = Path(__file__).resolve().parents[3]
KEY_A, KEY_B = bytes(range(32)), bytes(range(1, 33))

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def ring(current: str = "a", *retired: str) -> Keyring:
    keys = {"a": KEY_A, "b": KEY_B}
    return Keyring((current, keys[current]), {k: keys[k] for k in retired})


@given(json_values)
@settings(max_examples=200, deadline=None)
def test_a_sealed_value_opens_to_the_same_value_and_type(value: Any) -> None:
    keys = ring()
    token = keys.seal(value)
    assert is_sealed(token) and token.startswith(f"{PREFIX}a:")
    assert json.dumps(keys.open(token), sort_keys=True) == json.dumps(value, sort_keys=True)


@given(st.text(min_size=4))
@settings(max_examples=100, deadline=None)
def test_the_clear_value_is_nowhere_in_its_token(secret: str) -> None:
    token = ring().seal(secret)
    assert secret not in token[len(PREFIX) + 2 :]
    assert ring().seal(secret) != token  # a fresh nonce each time


@given(json_values)
@settings(max_examples=50, deadline=None)
def test_after_rotation_old_tokens_open_and_new_ones_use_the_new_key(value: Any) -> None:
    old = ring("a").seal(value)
    rotated = ring("b", "a")
    assert rotated.open(old) == ring("a").open(old)
    fresh = rotated.seal(value)
    assert fresh.startswith(f"{PREFIX}b:")
    with pytest.raises(SealingError, match=r"key 'b'.*lacks"):
        ring("a").open(fresh)


def test_a_ring_that_dropped_the_old_key_names_it() -> None:
    old = ring("a").seal("secret")
    with pytest.raises(SealingError, match="sealed with key 'a', which this keyring lacks"):
        ring("b").open(old)


@given(st.data())
@settings(max_examples=200, deadline=None)
def test_a_token_altered_anywhere_never_opens(data: st.DataObject) -> None:
    keys = ring()
    token = keys.seal(data.draw(json_values))
    body = token.rpartition(":")[2]
    raw = bytearray(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= 1 << data.draw(st.integers(0, 7))
    forged = token.rpartition(":")[0] + ":" + base64.urlsafe_b64encode(raw).decode().rstrip("=")
    with pytest.raises(SealingError, match="does not open"):
        keys.open(forged)


def test_a_token_moved_to_another_key_id_does_not_open() -> None:
    same = Keyring(("a", KEY_A), {"c": KEY_A})  # one key under two ids: the id is bound
    token = same.seal("secret")
    with pytest.raises(SealingError, match="does not open"):
        same.open(token.replace(f"{PREFIX}a:", f"{PREFIX}c:"))


@pytest.mark.parametrize(
    ("current", "retired", "match"),
    [
        ("nokey", "", "must be <key id>:<base64"),
        ("a:" + base64.b64encode(b"short").decode(), "", "'a' is 5 bytes, not 32"),
        ("a:!!!not base64", "", "'a'"),
        ("bad id:" + base64.b64encode(KEY_A).decode(), "", "key id 'bad id'"),
        ("a:" + base64.b64encode(KEY_A).decode(), "old:xyz", "retired sealing key 'old'"),
    ],
)
def test_a_bad_key_is_refused_naming_the_bad_entry(current: str, retired: str, match: str) -> None:
    with pytest.raises(SealingError, match=match):
        Keyring.parse(current, retired)


def test_parse_reads_the_current_and_the_retired_keys() -> None:
    a, b = (base64.b64encode(k).decode() for k in (KEY_A, KEY_B))
    keys = Keyring.parse(f"b:{b}", f" a:{a} ,")
    assert keys.current == "b" and keys.kids == ["a", "b"]
    assert keys.open(ring("a").seal(7)) == 7


# -- documents and the boundaries that see them -------------------------------------------------

NESTED = """\
kind: message
name: nested-secrets
wireVersion: 1
owner: test
payload:
  name: {type: string, required: true}
  pin: {type: integer, sensitive: true, required: true, minimum: 1000}
  views:
    type: array
    items:
      type: object
      fields:
        angle: {type: integer}
        secret: {type: object, sensitive: true, fields: {k: {type: string}}}
"""


@pytest.fixture(scope="module")
def nested(tmp_path_factory: pytest.TempPathFactory) -> MessageContract:
    source = tmp_path_factory.mktemp("contracts") / "nested-secrets.v1.yaml"
    source.write_text(NESTED)
    contract = load_file(source)
    assert isinstance(contract, MessageContract)
    return contract


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(ROOT / "schemas" / "contracts")


def test_seal_fields_seals_every_sensitive_path_and_nothing_else(
    nested: MessageContract,
) -> None:
    doc = {"name": "n", "pin": 1234, "views": [{"angle": 1, "secret": {"k": "v"}}, {"angle": 2}]}
    keys = ring()
    sealed = seal_fields(nested, doc, keys)
    assert sealed["name"] == "n" and sealed["views"][0]["angle"] == 1
    assert is_sealed(sealed["pin"]) and is_sealed(sealed["views"][0]["secret"])
    assert "secret" not in sealed["views"][1]
    assert doc["pin"] == 1234  # the input is not mutated
    assert seal_fields(nested, sealed, keys) == sealed  # sealed values are left as they are
    assert open_all(sealed, keys) == doc


def test_the_validator_takes_a_token_only_where_a_field_is_sensitive(
    nested: MessageContract,
) -> None:
    keys = ring()
    validator = Validator.for_contract(nested)
    sealed = seal_fields(nested, {"name": "n", "pin": 1234}, keys)
    assert validator.validate(sealed).ok
    bad = validator.validate({"name": keys.seal("n"), "pin": 5})
    assert not bad.ok
    assert {(v.path, v.code) for v in bad.violations} == {("pin", "too-small")}
    wrong = validator.validate({"name": "n", "pin": "1234"})
    assert [(v.path, v.code) for v in wrong.violations] == [("pin", "wrong-type")]


def test_a_binding_takes_a_sealed_value_for_its_field_type() -> None:
    token = ring().seal(1234)
    binding = parse_binding("${context.pin}", "integer")
    assert resolve_binding(binding, {"pin": token}, {}) == token
    with pytest.raises(BindingError, match="binding-type"):
        resolve_binding(binding, {"pin": "1234"}, {})
    inner = parse_binding("${context.secret.k}", "string")
    with pytest.raises(BindingError, match="not an object"):
        resolve_binding(inner, {"secret": ring().seal({"k": "v"})}, {})


def test_open_all_without_a_key_refuses_a_sealed_value() -> None:
    assert open_all({"a": ["clear"]}, None) == {"a": ["clear"]}
    with pytest.raises(SealingError, match="no sealing key"):
        open_all({"a": [ring().seal("x")]}, None)


def job_body(payload: dict[str, Any]) -> bytes:
    envelope = {"messageType": "job", "runId": "r1", "stage": "extract", "attempt": 1}
    return json.dumps(envelope | {"fence": "f1", "payload": payload}).encode()


def test_the_worker_opens_a_sealed_request_and_seals_its_result(catalog: Catalog) -> None:
    from accord.worker.wire import Refused, check_result, read_job

    keys = ring()
    payload = {"modelId": "m1", "storageConnectionRef": keys.seal("the-ref")}
    _, opened = read_job(job_body(payload), None, "metadata-extraction-request@1", keys)
    assert opened["storageConnectionRef"] == "the-ref"
    with pytest.raises(Refused) as refused:
        read_job(job_body(payload), None, None, None)
    assert refused.value.code == "unsealable-request"
    assert "payload.storageConnectionRef" in refused.value.message
    with pytest.raises(Refused, match="lacks"):
        read_job(job_body(payload), None, None, ring("b"))
    request = catalog.message("thumbnail-generation-request@2")
    assert request is not None
    kind, result = check_result(catalog, "thumbnail-generation-request@2", opened, keys)
    assert kind == "succeeded" and is_sealed(result["storageConnectionRef"])
    assert keys.open(result["storageConnectionRef"]) == "the-ref"
