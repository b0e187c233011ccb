"""The DSL's own rules that JSON Schema leaves out: defaults when missing, declared tolerance.

A :class:`Normaliser` is compiled once per contract into a small plan tree that visits only the
objects where something can happen (a default to fill, a tolerated field to drop); a contract
with neither compiles to an empty plan and normalising is the identity. Rules:

- a ``default`` fills a field only when the key is **absent**; an explicit ``null`` stays ``null``
  (and is then valid only where the field is ``nullable``);
- defaults apply recursively inside present objects and inside every item of present arrays;
- with ``tolerate``, unknown members named by a declared :class:`~accord.contracts.model.Tolerance`
  are dropped (and reported as ignored), so a tolerant reader sees exactly its own contract.

The input is never mutated: an object or array that changes is copied (copy-on-write), the rest
is shared, and a message that needs nothing comes back as the very same object.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from accord.contracts.model import FieldSpec, MessageContract
from accord.contracts.paths import format_path, tolerance_segments

__all__ = ["Normaliser", "plain"]

_Tree = dict[str, "_Tree"]


@dataclass(frozen=True, slots=True)
class _Obj:
    defaults: tuple[tuple[str, Any], ...]
    tolerated: tuple[str, ...]
    children: tuple[tuple[str, _Obj | _Arr], ...]


@dataclass(frozen=True, slots=True)
class _Arr:
    item: _Obj | _Arr


def plain(value: Any) -> Any:
    """A fresh plain-JSON copy of a default (frozen models may hold tuples or mappings)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def _tolerance_tree(contract: MessageContract) -> _Tree:
    tree: _Tree = {}
    for tolerance in contract.tolerates:
        for path in tolerance.fields:
            node = tree
            for segment in tolerance_segments(path):
                node = node.setdefault(segment, {})
    return tree


def _build_obj(fields: Mapping[str, FieldSpec], tree: _Tree) -> _Obj | None:
    defaults = tuple(
        (name, spec.default) for name, spec in sorted(fields.items()) if spec.has_default
    )
    tolerated = tuple(sorted(n for n in tree if n not in fields and n != "[]"))
    children: list[tuple[str, _Obj | _Arr]] = []
    for name, spec in sorted(fields.items()):
        child = _build_field(spec, tree.get(name, {}))
        if child is not None:
            children.append((name, child))
    if not (defaults or tolerated or children):
        return None
    return _Obj(defaults, tolerated, tuple(children))


def _build_field(spec: FieldSpec, tree: _Tree) -> _Obj | _Arr | None:
    if spec.type == "object" and spec.fields is not None:
        return _build_obj(spec.fields, tree)
    if spec.type == "array" and spec.items is not None:
        item = _build_field(spec.items, tree.get("[]", {}))
        return _Arr(item) if item is not None else None
    return None


class Normaliser:
    """Applies defaults (and, when tolerant, drops tolerated fields) along a precompiled plan."""

    __slots__ = ("_plan",)

    def __init__(self, contract: MessageContract, *, tolerate: bool = False) -> None:
        tree = _tolerance_tree(contract) if tolerate else {}
        self._plan = _build_obj(contract.payload, tree)

    @property
    def is_identity(self) -> bool:
        return self._plan is None

    def apply(self, value: Any, ignored: list[str] | None = None) -> Any:
        """``value`` normalised; paths of dropped tolerated fields are appended to ``ignored``."""
        if self._plan is None:
            return value
        return _apply(self._plan, value, (), ignored if ignored is not None else [])


def _apply(node: _Obj | _Arr, value: Any, path: tuple[str | int, ...], ignored: list[str]) -> Any:
    # ``path`` stays a tuple of parts: it is spelled out only when a field is actually dropped
    if isinstance(node, _Arr):
        if not isinstance(value, list):
            return value
        items = [_apply(node.item, item, (*path, i), ignored) for i, item in enumerate(value)]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    if not isinstance(value, dict):
        return value
    out = value
    for name in node.tolerated:
        if name in out:
            out = dict(out) if out is value else out
            del out[name]
            ignored.append(format_path((*path, name)))
    for name, default in node.defaults:
        if name not in out:
            out = dict(out) if out is value else out
            out[name] = plain(default)
    for name, child in node.children:
        if name in out:
            before = out[name]
            after = _apply(child, before, (*path, name), ignored)
            if after is not before:
                out = dict(out) if out is value else out
                out[name] = after
    return out
