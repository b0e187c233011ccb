"""Redaction: mask every field a contract marks ``sensitive``, however deep it sits.

Telemetry, logs and queue inspection call :func:`redact` before a message leaves the process.
The walk follows the contract, not the message: nested objects and every item of arrays are
visited, and a sensitive field is replaced by :data:`MASK` whatever its value (an object, an
array, ``null``), so neither content nor shape leaks. Members the contract does not know are
kept only when they cannot hide a secret: unknown members are masked too, because an unvalidated
message may carry a renamed secret. The input is never mutated; the plan is compiled once per
contract and a contract with no sensitive field costs one copy of the top-level object.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from accord.contracts.model import FieldSpec, MessageContract

__all__ = ["MASK", "redact", "sensitive_paths"]

MASK = "***"


@dataclass(frozen=True, slots=True)
class _Obj:
    fields: Mapping[str, _Obj | _Arr | bool]  # True: mask; False: keep as is


@dataclass(frozen=True, slots=True)
class _Arr:
    item: _Obj | _Arr | bool


def _plan(spec: FieldSpec) -> _Obj | _Arr | bool:
    if spec.sensitive:
        return True
    if spec.type == "object" and spec.fields is not None:
        return _obj(spec.fields)
    if spec.type == "array" and spec.items is not None:
        item = _plan(spec.items)
        return _Arr(item) if item is not False else False
    return False


def _obj(fields: Mapping[str, FieldSpec]) -> _Obj:
    return _Obj({name: _plan(spec) for name, spec in fields.items()})


_plans: dict[int, tuple[MessageContract, _Obj]] = {}


def _root(contract: MessageContract) -> _Obj:
    hit = _plans.get(id(contract))
    if hit is not None and hit[0] is contract:
        return hit[1]
    if len(_plans) > 512:
        _plans.clear()
    plan = _obj(contract.payload)
    _plans[id(contract)] = (contract, plan)
    return plan


def redact(contract: MessageContract, message: Any) -> Any:
    """A copy of ``message`` with every sensitive (and every unknown) member masked."""
    return _walk(_root(contract), message)


def _walk(node: _Obj | _Arr | bool, value: Any) -> Any:
    if node is True:
        return MASK
    if node is False:
        return value
    if isinstance(node, _Arr):
        if not isinstance(value, list):
            return value
        return [_walk(node.item, item) for item in value]
    if not isinstance(value, dict):
        return value
    fields, out = node.fields, {}
    for name, item in value.items():
        sub = fields.get(name, True)
        # leaves are decided inline: one call per nested object, not one per member
        out[name] = MASK if sub is True else item if sub is False else _walk(sub, item)
    return out


def sensitive_paths(contract: MessageContract) -> list[str]:
    """Schema paths of the sensitive fields (``a.b``, ``views[].secret``), for reports."""
    out: list[str] = []

    def visit(fields: Mapping[str, FieldSpec], prefix: str) -> None:
        for name, declared in sorted(fields.items()):
            spec, path = declared, f"{prefix}.{name}" if prefix else name
            while spec.type == "array" and spec.items is not None and not spec.sensitive:
                spec, path = spec.items, path + "[]"
            if spec.sensitive:
                out.append(path)
            elif spec.type == "object" and spec.fields is not None:
                visit(spec.fields, path)

    visit(contract.payload, "")
    return out
