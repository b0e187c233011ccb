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

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from accord.contracts.model import FieldSpec, MessageContract

__all__ = [
    "MASK",
    "NamedScrubber",
    "Redaction",
    "field_paths",
    "redact",
    "redact_body",
    "redact_document",
    "redact_quarantine_record",
    "scrub",
    "scrub_pattern",
    "sensitive_names",
    "sensitive_paths",
]

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
    return sorted(
        ".".join(path).replace("." + _ITEM, _ITEM) for path in field_paths(contract.payload)
    )


# -- path redaction: several contracts' sensitive fields over one document ---------------------

_ITEM = "[]"
_Tree = dict[str, Any]  # name (or "[]" for array items) → subtree, or True: mask


def field_paths(fields: Mapping[str, FieldSpec]) -> list[tuple[str, ...]]:
    """Every sensitive field of ``fields`` as a path (``("views", "[]", "secret")``)."""
    out: list[tuple[str, ...]] = []

    def visit(spec: FieldSpec, path: tuple[str, ...]) -> None:
        if spec.sensitive:
            out.append(path)
        elif spec.type == "object" and spec.fields is not None:
            for name, sub in spec.fields.items():
                visit(sub, (*path, name))
        elif spec.type == "array" and spec.items is not None:
            visit(spec.items, (*path, _ITEM))

    for name, spec in fields.items():
        visit(spec, (name,))
    return out


class Redaction:
    """The sensitive paths of a document, from one or more contracts (or from where a value
    flows): :meth:`mask` replaces what sits at them by :data:`MASK`, keeping every other member
    (unlike :func:`redact`, which also masks members its one contract does not know), and
    :meth:`found` lists the values that sit there, so that an echo of one elsewhere (an error
    message, a log line) can be scrubbed with :func:`scrub`."""

    __slots__ = ("_tree",)

    def __init__(self, paths: Iterable[Sequence[str]] = ()) -> None:
        tree: _Tree = {}
        for path in paths:
            _graft(tree, tuple(path))
        self._tree = tree

    @classmethod
    def of(cls, *contracts: MessageContract | None, at: Sequence[str] = ()) -> Redaction:
        """The sensitive fields of ``contracts``, under the path ``at`` of the document."""
        return cls((*at, *p) for c in contracts if c is not None for p in field_paths(c.payload))

    def __bool__(self) -> bool:
        return bool(self._tree)

    def __or__(self, other: Redaction) -> Redaction:
        out = Redaction()
        for tree in (self._tree, other._tree):
            for path in _leaves(tree, ()):
                _graft(out._tree, path)
        return out

    def paths(self) -> list[tuple[str, ...]]:
        return sorted(_leaves(self._tree, ()))

    def mask(self, value: Any) -> Any:
        """A copy of ``value`` with every sensitive path masked (the input is not mutated)."""
        return _mask(self._tree, value) if self._tree else value

    def found(self, value: Any) -> list[Any]:
        """The values at the sensitive paths of ``value`` (each scalar of a masked subtree)."""
        out: list[Any] = []
        _find(self._tree, value, out)
        return out


def _graft(tree: _Tree, path: tuple[str, ...]) -> None:
    node = tree
    for i, name in enumerate(path):
        if i == len(path) - 1:
            node[name] = True
            return
        sub = node.get(name)
        if sub is True:
            return  # an enclosing member is masked already
        if sub is None:
            sub = node[name] = {}
        node = sub


def _leaves(tree: _Tree, prefix: tuple[str, ...]) -> Iterable[tuple[str, ...]]:
    for name, sub in tree.items():
        if sub is True:
            yield (*prefix, name)
        else:
            yield from _leaves(sub, (*prefix, name))


def _mask(tree: _Tree, value: Any) -> Any:
    if isinstance(value, list):
        item = tree.get(_ITEM)
        if item is None:
            return value
        return [MASK if item is True else _mask(item, v) for v in value]
    if not isinstance(value, Mapping):
        return value
    out = {}
    for name, member in value.items():
        sub = tree.get(name)
        out[name] = member if sub is None else MASK if sub is True else _mask(sub, member)
    return out


def _find(tree: _Tree | bool, value: Any, out: list[Any]) -> None:
    if tree is True:
        if isinstance(value, Mapping):
            for member in value.values():
                _find(True, member, out)
        elif isinstance(value, list):
            for member in value:
                _find(True, member, out)
        elif value is not None and not isinstance(value, bool):
            out.append(value)
        return
    assert isinstance(tree, dict)
    if isinstance(value, list) and _ITEM in tree:
        for member in value:
            _find(tree[_ITEM], member, out)
    elif isinstance(value, Mapping):
        for name, member in value.items():
            if name in tree:
                _find(tree[name], member, out)


# -- scrubbing: a sensitive value echoed in free text -----------------------------------------

MIN_SCRUB_CHARS = 4  # shorter values are masked where they sit, but not searched for in text


def scrub_pattern(values: Iterable[Any]) -> re.Pattern[str] | None:
    """One pattern matching any of ``values`` (as text), longest first; ``None`` for none."""
    texts = {str(v) for v in values if not isinstance(v, bool)}
    texts = {t for t in texts if len(t) >= MIN_SCRUB_CHARS}
    if not texts:
        return None
    return re.compile("|".join(re.escape(t) for t in sorted(texts, key=lambda t: (-len(t), t))))


def scrub(value: Any, pattern: re.Pattern[str] | None) -> Any:
    """``value`` (text, or a JSON document's every string and key) with each match masked."""
    if pattern is None:
        return value
    if isinstance(value, str):
        return pattern.sub(MASK, value)
    if isinstance(value, Mapping):
        return {scrub(k, pattern): scrub(v, pattern) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub(v, pattern) for v in value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return MASK if pattern.fullmatch(str(value)) else value
    return value


def redact_document(doc: Any, contracts: Iterable[MessageContract]) -> Any:
    """A job or outcome envelope (or a batch of them, or a bare payload) with the sensitive
    fields of any of ``contracts`` masked wherever a payload sits, and every echo of one of
    their values scrubbed from the rest. For quarantine and dead-letter records: the document's
    own contract is not known there, so every candidate's sensitive fields are masked."""
    found = list(contracts)
    at_root = Redaction.of(*found)
    redaction = at_root | Redaction.of(*found, at=("payload",))
    redaction = redaction | Redaction.of(*found, at=("outcomes", _ITEM, "payload"))
    pattern = scrub_pattern(redaction.found(doc))
    return scrub(redaction.mask(doc), pattern)


def redact_body(body: bytes, contracts: Iterable[MessageContract], limit: int = 4096) -> str:
    """What a quarantine record may keep of a raw ``body``: a parseable JSON body with
    :func:`redact_document` applied, then cut to ``limit`` characters; an unparseable one cut to
    ``limit`` characters (its fields cannot be told apart, so keep ``limit`` small)."""
    text = body.decode("utf-8", errors="replace")
    try:  # too deep to parse or to walk is as unreadable as not JSON at all
        doc = json.loads(text)
        out = json.dumps(redact_document(doc, contracts), sort_keys=True, separators=(",", ":"))
    except (ValueError, RecursionError):
        return text[:limit]
    return out[:limit]


def sensitive_names(contracts: Iterable[MessageContract]) -> frozenset[str]:
    """The names of the sensitive fields of ``contracts`` (the last step of each path)."""
    return frozenset(
        next(step for step in reversed(path) if step != _ITEM)
        for contract in contracts
        for path in field_paths(contract.payload)
    )


class NamedScrubber:
    """Masks the value of a member named like a sensitive field in text that could not be read
    as a document (a log message, a cut or unparseable body): ``name=value``, ``name: value``,
    ``"name": "value"``, ``'name': 'value'``, and JSON inside a JSON string (``\\"name\\"``)."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(names)
        alternatives = "|".join(map(re.escape, sorted(self.names)))
        self._pattern = (
            re.compile(
                rf"(?P<key>\\*[\"']?(?:{alternatives})\\*[\"']?)(?P<sep>\s*[:=]\s*)"
                r"(?:(?P<open>\\*\"|')(?P<inner>[^\"'\\]*)(?P<close>\\*\"|')"
                r"|(?P<bare>[^\s,;}\)\]\"'\\]+))"
            )
            if self.names
            else None
        )

    def text(self, text: str, found: list[Any]) -> str:
        """``text`` with each named member's value masked; the values go to ``found``."""
        if self._pattern is None:
            return text

        def hide(m: re.Match[str]) -> str:
            if m["bare"] is not None:
                found.append(m["bare"])
                return f"{m['key']}{m['sep']}{MASK}"
            found.append(m["inner"])
            return f"{m['key']}{m['sep']}{m['open']}{MASK}{m['close']}"

        return self._pattern.sub(hide, text)

    def value(self, value: Any, found: list[Any]) -> Any:
        """A copy of ``value`` with each member named like a sensitive field masked (and each
        string scrubbed with :meth:`text`); what was masked goes to ``found``."""
        if isinstance(value, Mapping):
            out = {}
            for key, member in value.items():
                if key in self.names:
                    _find(True, member, found)
                    out[key] = MASK
                else:
                    out[key] = self.value(member, found)
            return out
        if isinstance(value, list | tuple):
            return type(value)(self.value(v, found) for v in value)
        if isinstance(value, str):
            return self.text(value, found)
        return value


def redact_quarantine_record(
    record: Mapping[str, Any], contracts: Iterable[MessageContract], limit: int = 4096
) -> dict[str, Any]:
    """A quarantine or dead-letter record (``{queue, message_id, reason, body}``, ``body`` the
    raw text) as it may be kept: a parseable body with :func:`redact_document` applied, any other
    body with every member named like a sensitive field masked (:class:`NamedScrubber`), cut to
    ``limit`` characters either way; the values found are scrubbed from ``reason`` too."""
    found = list(contracts)
    out = dict(record)
    named = NamedScrubber(sensitive_names(found))
    values: list[Any] = []
    body = out.get("body")
    if isinstance(body, bytes | bytearray):
        body = bytes(body).decode("utf-8", errors="replace")
    if isinstance(body, str):
        try:  # too deep to parse or to walk is as unreadable as not JSON at all
            doc = json.loads(body)
            redaction = Redaction.of(*found) | Redaction.of(*found, at=("payload",))
            redaction = redaction | Redaction.of(*found, at=("outcomes", _ITEM, "payload"))
            seen = [*values, *redaction.found(doc)]
            text = json.dumps(
                named.value(redaction.mask(doc), seen), sort_keys=True, separators=(",", ":")
            )
            values = seen
        except (ValueError, RecursionError):
            text = named.text(body[: limit * 4], values)
        out["body"] = scrub(text, scrub_pattern(values))[:limit]
    if isinstance(out.get("reason"), str):
        reason = named.text(out["reason"], values)
        out["reason"] = scrub(reason, scrub_pattern(values))
    return out
