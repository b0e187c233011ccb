"""The Etsy OpenAPI document the test double speaks, and what it does with it.

``openapi.json`` beside this module is the part of Etsy's published description the double serves
(createListing, findAllActiveListingsByShop, getListing, getListingImages, uploadListingImage and
the schemas they reference), copied unchanged from ``github.com/etsy/open-api`` at the revision
recorded in its ``x-accord-vendored`` member. OpenAPI 3.0 schema objects are turned into JSON
Schema (draft 4, which 3.0 extends) by resolving ``$ref`` and expanding ``nullable``; requests
are validated with ``jsonschema`` against the operation's own schemas, and responses are built
from the response schema and checked against it before they leave.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs in the venv; used by tests only

__all__ = [
    "REVISION",
    "SPEC",
    "build",
    "decode_form",
    "errors_of",
    "operation",
    "to_json_schema",
]

SPEC: dict[str, Any] = json.loads(Path(__file__).with_name("openapi.json").read_text("utf-8"))
REVISION: str = SPEC["x-accord-vendored"]["commit"]
_SCHEMAS: dict[str, Any] = SPEC["components"]["schemas"]
_DROP = frozenset({"description", "nullable", "format", "example"})


def operation(path: str, method: str) -> dict[str, Any]:
    op: dict[str, Any] = SPEC["paths"][path][method]
    return op


def _resolve(schema: Mapping[str, Any]) -> dict[str, Any]:
    if "$ref" in schema:
        return _resolve(_SCHEMAS[str(schema["$ref"]).rsplit("/", 1)[-1]])
    return dict(schema)


def to_json_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A self-contained JSON Schema (draft 4) for an OpenAPI 3.0 schema object."""
    src = _resolve(schema)
    out: dict[str, Any] = {k: v for k, v in src.items() if k not in _DROP}
    if "properties" in src:
        out["properties"] = {k: to_json_schema(v) for k, v in src["properties"].items()}
    if "items" in src:
        out["items"] = to_json_schema(src["items"])
    if "allOf" in src:
        out["allOf"] = [to_json_schema(s) for s in src["allOf"]]
    if src.get("nullable"):
        return {"anyOf": [out, {"type": "null"}]}
    return out


@cache
def _validator(key: str) -> jsonschema.Draft4Validator:
    return jsonschema.Draft4Validator(to_json_schema(json.loads(key)))


def errors_of(schema: Mapping[str, Any], value: Any) -> list[str]:
    """Every violation of ``schema`` by ``value``, each as ``<path>: <message>`` (wire names)."""
    found = _validator(json.dumps(schema, sort_keys=True)).iter_errors(value)
    out = []
    for err in sorted(found, key=lambda e: [str(p) for p in e.absolute_path]):
        where = ".".join(str(p) for p in err.absolute_path) or "body"
        out.append(f"{where}: {err.message}")
    return out


def _coerce(schema: Mapping[str, Any], raw: str) -> Any:
    kind = _resolve(schema).get("type")
    try:
        if kind == "integer":
            return int(raw)
        if kind == "number":
            return float(raw)
    except ValueError:
        return raw
    if kind == "boolean" and raw in ("true", "false", "1", "0"):
        return raw in ("true", "1")
    return raw


def decode_form(schema: Mapping[str, Any], pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """An ``application/x-www-form-urlencoded`` body as the object its schema describes: form
    style, exploded (``tags=a&tags=b``), scalars coerced by the property's declared type."""
    props: Mapping[str, Any] = _resolve(schema).get("properties", {})
    out: dict[str, Any] = {}
    for key, raw in pairs:
        prop = _resolve(props.get(key, {}))
        if prop.get("type") == "array":
            out.setdefault(key, []).append(_coerce(prop.get("items", {}), raw))
        else:
            out[key] = _coerce(prop, raw)
    return out


def _instance(schema: Mapping[str, Any]) -> Any:
    src = _resolve(schema)
    if "allOf" in src:
        merged: dict[str, Any] = {}
        for part in src["allOf"]:
            value = _instance(part)
            if isinstance(value, dict):
                merged.update(value)
        return merged
    if src.get("nullable"):
        return None
    if "enum" in src:
        return src["enum"][0]
    kind = src.get("type")
    if kind == "object":
        props = src.get("properties", {})
        return {k: _instance(props[k]) for k in src.get("required", []) if k in props}
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        return src.get("minimum", 0)
    if kind == "boolean":
        return False
    return ""


def build(schema: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """A response document: the schema's minimal instance overlaid with ``values``, checked
    against the schema (a double that answers off-schema fails loudly)."""
    doc = _instance(schema)
    assert isinstance(doc, dict)
    doc.update(values)
    problems = errors_of(schema, doc)
    if problems:
        raise AssertionError(f"the double built an off-schema response: {problems}")
    return doc
