"""Canonical form and digest of a contract.

The canonical form is a plain JSON document in the DSL's own vocabulary (``wireVersion``,
``minLength``, …) with one rule for defaults: a key whose value is *empty* — ``false``, absent,
an empty list — is omitted, while identity and meaningful settings (``kind``, ``name``, version,
``owner``, ``status``, ``compatibility``, ``idempotency``) are always present. So
``required: false`` written out and ``required`` left unsaid are the same contract. Integral
floats are written as integers (``512.0`` and ``512`` mean the same JSON number), dates as ISO
text, and source locations never appear. Key order, comments, quoting and flow/block style
cannot reach this form, so they cannot change :func:`contract_digest`.

:func:`from_canonical` is the inverse (used to read published artefacts back); the round trip
``from_canonical(to_canonical(c)) == c`` is property-tested.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from accord.canonical import digest_of
from accord.contracts.model import (
    MISSING,
    CapabilityContract,
    ChangeRecord,
    Contract,
    ContractRef,
    FieldSpec,
    Limits,
    MessageContract,
    PolicyContract,
    Tolerance,
)

__all__ = ["contract_digest", "contract_summary", "from_canonical", "normalise", "to_canonical"]

_FIELD_KEYS = (  # (DSL key, FieldSpec attribute) in declaration order
    ("required", "required"),
    ("nullable", "nullable"),
    ("description", "description"),
    ("unit", "unit"),
    ("sensitive", "sensitive"),
    ("deprecated", "deprecated"),
    ("minLength", "min_length"),
    ("maxLength", "max_length"),
    ("pattern", "pattern"),
    ("format", "format"),
    ("minimum", "minimum"),
    ("maximum", "maximum"),
    ("exclusiveMinimum", "exclusive_minimum"),
    ("exclusiveMaximum", "exclusive_maximum"),
    ("multipleOf", "multiple_of"),
    ("minItems", "min_items"),
    ("maxItems", "max_items"),
)
_LIFECYCLE = (
    ("description", "description"),
    ("supportUntil", "support_until"),
    ("reviewDate", "review_date"),
    ("promotionCriteria", "promotion_criteria"),
)


def normalise(value: Any) -> Any:
    """Plain JSON data with integral floats as integers and tuples as lists."""
    if isinstance(value, bool) or value is None or isinstance(value, int | str):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, Mapping):
        return {str(k): normalise(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [normalise(v) for v in value]
    raise TypeError(f"not a JSON value: {value!r}")


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    if value is None or value is False or (isinstance(value, list | tuple) and not value):
        return
    out[key] = normalise(value)


def field_to_canonical(spec: FieldSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"type": spec.type}
    for key, attr in _FIELD_KEYS:
        _put(out, key, getattr(spec, attr))
    if spec.has_default:
        out["default"] = normalise(spec.default)
    if spec.enum is not None:
        out["enum"] = normalise(spec.enum)
    if spec.fields is not None:
        out["fields"] = {name: field_to_canonical(f) for name, f in spec.fields.items()}
    if spec.items is not None:
        out["items"] = field_to_canonical(spec.items)
    return out


def _changes(changes: tuple[ChangeRecord, ...]) -> list[dict[str, Any]]:
    out = []
    for change in changes:
        entry: dict[str, Any] = {"version": change.version, "summary": change.summary}
        _put(entry, "acknowledges", change.acknowledges)
        _put(entry, "reviewedBy", change.reviewed_by)
        out.append(entry)
    return out


def to_canonical(contract: Contract) -> dict[str, Any]:
    """The canonical JSON document of ``contract`` (see the module docstring for the rules)."""
    out: dict[str, Any] = {
        "kind": contract.kind,
        "name": contract.name,
        "owner": contract.owner,
        "status": contract.status,
    }
    for key, attr in _LIFECYCLE:
        _put(out, key, getattr(contract, attr))
    _put(out, "changes", _changes(contract.changes))
    if isinstance(contract, MessageContract):
        out["wireVersion"] = contract.wire_version
        out["payload"] = {n: field_to_canonical(f) for n, f in contract.payload.items()}
        out["compatibility"] = contract.compatibility
        _put(out, "outcomes", contract.outcomes)
        _put(out, "reserved", contract.reserved)
        _put(
            out,
            "tolerates",
            [{"version": t.version, "fields": list(t.fields)} for t in contract.tolerates],
        )
        _put(out, "transitive", contract.transitive)
        _put(out, "maxBytes", contract.max_bytes)
    elif isinstance(contract, CapabilityContract):
        out["version"] = contract.version
        out["request"] = str(contract.request)
        out["result"] = str(contract.result)
        out["idempotency"] = contract.idempotency
        _put(out, "errors", contract.errors)
        _put(out, "queue", contract.queue)
        limits: dict[str, Any] = {}
        for key, attr in (
            ("timeMs", "time_ms"),
            ("memoryBytes", "memory_bytes"),
            ("inputBytes", "input_bytes"),
        ):
            _put(limits, key, getattr(contract.limits, attr))
        _put(out, "limits", limits or None)
        _put(out, "cacheable", contract.cacheable)
    else:
        out["version"] = contract.version
        out["rules"] = normalise(contract.rules)
        _put(out, "appliesTo", [str(r) for r in contract.applies_to])
    return out


def contract_digest(contract: Contract) -> str:
    """``sha256:<hex>`` over the canonical JSON of :func:`to_canonical`."""
    return digest_of(to_canonical(contract))


def contract_summary(contract: Contract) -> dict[str, Any]:
    """One line of a listing of contracts (``accord contracts --json``, ``/v1/contracts``)."""
    return {
        "kind": contract.kind,
        "name": contract.name,
        "version": contract.version,
        "status": contract.status,
        "digest": contract_digest(contract),
    }


def field_from_canonical(doc: Mapping[str, Any]) -> FieldSpec:
    kwargs: dict[str, Any] = {attr: doc[key] for key, attr in _FIELD_KEYS if key in doc}
    if "enum" in doc:
        kwargs["enum"] = tuple(doc["enum"])
    if "fields" in doc:
        kwargs["fields"] = MappingProxyType(
            {n: field_from_canonical(f) for n, f in doc["fields"].items()}
        )
    if "items" in doc:
        kwargs["items"] = field_from_canonical(doc["items"])
    return FieldSpec(type=doc["type"], default=doc.get("default", MISSING), **kwargs)


def from_canonical(doc: Mapping[str, Any]) -> Contract:
    """Rebuild a contract from its canonical document (locations are not part of it)."""
    common: dict[str, Any] = {attr: doc[key] for key, attr in _LIFECYCLE if key in doc}
    common.update(name=doc["name"], owner=doc["owner"], status=doc["status"])
    common["changes"] = tuple(
        ChangeRecord(
            c["version"],
            c["summary"],
            tuple(c.get("acknowledges", ())),
            tuple(c.get("reviewedBy", ())),
        )
        for c in doc.get("changes", ())
    )
    kind = doc["kind"]
    if kind == "message":
        return MessageContract(
            wire_version=doc["wireVersion"],
            payload=MappingProxyType(
                {n: field_from_canonical(f) for n, f in doc["payload"].items()}
            ),
            compatibility=doc["compatibility"],
            outcomes=tuple(doc.get("outcomes", ())),
            reserved=tuple(doc.get("reserved", ())),
            tolerates=tuple(
                Tolerance(t["version"], tuple(t["fields"])) for t in doc.get("tolerates", ())
            ),
            transitive=doc.get("transitive", False),
            max_bytes=doc.get("maxBytes"),
            **common,
        )
    if kind in ("worker", "action"):
        limits = doc.get("limits", {})
        return CapabilityContract(
            kind=kind,
            version=doc["version"],
            request=ContractRef.parse(doc["request"]),
            result=ContractRef.parse(doc["result"]),
            idempotency=doc["idempotency"],
            errors=tuple(doc.get("errors", ())),
            queue=doc.get("queue"),
            cacheable=doc.get("cacheable", False),
            limits=Limits(
                limits.get("timeMs"), limits.get("memoryBytes"), limits.get("inputBytes")
            ),
            **common,
        )
    if kind == "policy":
        return PolicyContract(
            version=doc["version"],
            rules=MappingProxyType(dict(doc["rules"])),
            applies_to=tuple(ContractRef.parse(r) for r in doc.get("appliesTo", ())),
            **common,
        )
    raise ValueError(f"unknown contract kind {kind!r}")
