"""JSON Schema 2020-12 export: closed, nullable-exact, annotated and deterministic."""

from __future__ import annotations

import dataclasses
from typing import Any

import jsonschema_rs
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.canonical import canonical_json
from accord.contracts.jsonschema import SCHEMA_DIALECT, export
from accord.contracts.model import FieldSpec, MessageContract
from accord.testing.sample_contracts import scan_request


def _objects(schema: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "properties" in node:
                found.append(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def test_header_and_meta_validity() -> None:
    schema = export(scan_request())
    assert schema["$schema"] == SCHEMA_DIALECT
    assert schema["$id"] == "urn:accord:contract:scan-request:3"
    assert schema["description"].startswith("A request")
    jsonschema_rs.meta.validate(schema)


def test_every_declared_object_is_closed_and_open_objects_stay_open() -> None:
    schema = export(scan_request())
    objects = _objects(schema)
    assert len(objects) == 4  # root, views[], options, options.credentials
    assert all(o["additionalProperties"] is False for o in objects)
    assert schema["properties"]["extras"] == {
        "type": "object",
        "description": "free-form annotations",
    }


def test_required_nullable_default_and_annotations() -> None:
    props = export(scan_request())["properties"]
    assert export(scan_request())["required"] == ["mode", "modelId", "secret"]
    assert props["note"] == {"type": ["string", "null"], "maxLength": 64, "default": None}
    assert props["colour"]["enum"] == ["red", "blue", None]
    assert props["mode"] == {"type": "string", "enum": ["fast", "full"], "default": "fast"}
    assert props["tags"]["default"] == []
    assert props["secret"]["x-accord-sensitive"] is True
    assert props["legacy"]["deprecated"] is True
    view = props["views"]["items"]
    assert view["properties"]["angle"]["x-accord-unit"] == "deg"
    assert view["properties"]["zoom"]["exclusiveMinimum"] == 0
    assert view["required"] == ["angle"]
    assert props["options"]["properties"]["credentials"]["x-accord-sensitive"] is True
    assert props["quality"]["multipleOf"] == 1
    assert "x-accord-sensitive" not in props["modelId"]


def test_deprecated_contract_is_marked() -> None:
    schema = export(dataclasses.replace(scan_request(), status="deprecated"))
    assert schema["deprecated"] is True
    assert schema["x-accord-contract"]["status"] == "deprecated"


_names = st.from_regex(r"[a-z][a-zA-Z0-9]{0,8}", fullmatch=True)
_scalars = st.sampled_from(["string", "integer", "number", "boolean"])


@st.composite
def _specs(draw: st.DrawFn, depth: int = 0) -> FieldSpec:
    kind = draw(st.sampled_from(["scalar", "object", "array"] if depth < 2 else ["scalar"]))
    common: dict[str, Any] = {
        "required": draw(st.booleans()),
        "nullable": draw(st.booleans()),
        "sensitive": draw(st.booleans()),
    }
    if kind == "object":
        fields = draw(st.dictionaries(_names, _specs(depth + 1), max_size=3))
        return FieldSpec(type="object", fields=fields, **common)
    if kind == "array":
        return FieldSpec(type="array", items=draw(_specs(depth + 1)), **common)
    return FieldSpec(type=draw(_scalars), **common)


@settings(max_examples=50)
@given(st.dictionaries(_names, _specs(), max_size=5))
def test_export_is_deterministic_and_order_independent(payload: dict[str, FieldSpec]) -> None:
    forward = MessageContract(name="p", wire_version=1, owner="o", payload=payload)
    backward = dataclasses.replace(forward, payload=dict(reversed(list(payload.items()))))
    assert canonical_json(export(forward)) == canonical_json(export(backward))
    assert list(export(forward)["properties"]) == sorted(payload)
    jsonschema_rs.meta.validate(export(forward))
    for obj in _objects(export(forward)):
        assert obj["additionalProperties"] is False
        assert obj.get("required", []) == sorted(obj.get("required", []))
