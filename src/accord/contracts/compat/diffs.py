"""The diff of two versions of a message or capability contract, and its report.

:func:`diff` walks the payloads (:mod:`accord.contracts.compat.fields`), then the message-level
parts: identity, outcomes (row 19), description, ``maxBytes``, owner, and reuse of a name the old
version reserved. Finally it applies **declared tolerance**: a direction that fails only because a
closed reader meets a field it does not know (an added field read by the old version, a removed
field read by the new one) passes when that reader declares a :class:`Tolerance` naming exactly
that field for the writer's wire version. The change keeps its code and action and is marked
``tolerated``; any other failure of the same change (a missing required field) still stands.

:func:`diff_capability` compares ``worker``/``action`` contracts: queue and kind are routing
(row 18, dual-route, message identity unchanged), request/result references and error codes
follow the message rules.

The report is plain data with a stable JSON form (changes sorted by path, code, detail). Its
SemVer is the package axis only: it never proves wire compatibility.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeAlias

from accord.contracts.compat.fields import payload_changes
from accord.contracts.compat.rules import ACTIONS, NONE, Action, Change, is_semantic, make
from accord.contracts.model import CapabilityContract, ContractRef, MessageContract

__all__ = [
    "DiffReport",
    "Mode",
    "SemverBump",
    "diff",
    "diff_capability",
    "directions",
    "relative_path",
    "tolerates",
]

Mode: TypeAlias = Literal["backward", "forward", "full", "none"]
SemverBump: TypeAlias = Literal["major", "minor", "patch", "none"]
_ADDED = frozenset(
    {"field-added-optional", "field-added-required", "field-added-required-with-default"}
)
_REMOVED = frozenset(
    {"field-removed-optional", "field-removed-required", "field-removed-required-with-default"}
)


def directions(mode: str) -> tuple[str, ...]:
    """The directions a compatibility mode requires."""
    table = {"backward": ("backward",), "forward": ("forward",), "full": ("backward", "forward")}
    if mode not in (*table, "none"):
        raise ValueError(f"unknown compatibility mode {mode!r} (backward|forward|full|none)")
    return table.get(mode, ())


@dataclass(frozen=True, slots=True)
class DiffReport:
    old: ContractRef
    new: ContractRef
    changes: tuple[Change, ...]

    @property
    def backward_compatible(self) -> bool:
        return all(c.backward for c in self.changes)

    @property
    def forward_compatible(self) -> bool:
        return all(c.forward for c in self.changes)

    def compatible(self, mode: str) -> bool:
        wanted = directions(mode)
        return all(getattr(c, d) for c in self.changes for d in wanted)

    @property
    def required_actions(self) -> tuple[Action, ...]:
        present = {c.action for c in self.changes}
        return tuple(a for a in ACTIONS if a in present and a != NONE)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(c.key for c in self.changes)

    def semver_bump(self) -> SemverBump:
        """Package SemVer of the generated bindings: breaking → major, additive → minor."""
        levels = {c.bump for c in self.changes}
        for level in ("major", "minor", "patch"):
            if level in levels:
                return level
        return "none"

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data, keys in sorted order, changes sorted by path, code and detail."""
        return {
            "backward_compatible": self.backward_compatible,
            "changes": [c.as_dict() for c in self.changes],
            "forward_compatible": self.forward_compatible,
            "new": str(self.new),
            "old": str(self.old),
            "required_actions": list(self.required_actions),
            "semver_bump": self.semver_bump(),
        }


def relative_path(path: str) -> str:
    """A change path as a tolerance names it: ``payload.views[].angle`` → ``views[].angle``."""
    return path.removeprefix("payload.")


def tolerates(reader: MessageContract, writer_version: int, path: str) -> bool:
    rel = relative_path(path)
    return any(
        t.version == writer_version and rel in {relative_path(p) for p in t.fields}
        for t in reader.tolerates
    )


def diff(old: MessageContract, new: MessageContract) -> DiffReport:
    changes = _identity(old.name, new.name)
    changes += payload_changes(old.payload, new.payload)
    reserved = set(old.reserved)
    changes += [
        make(
            "reserved-name-reused",
            c.path,
            f"'{c.path}' reuses a name {old.ref} reserved",
            location=c.location,
        )
        for c in list(changes)
        if (c.code in _ADDED or c.code == "field-renamed") and relative_path(c.path) in reserved
    ]
    changes += _members("outcome", "outcomes", old.outcomes, new.outcomes)
    changes += _description(old.description, new.description)
    changes += _bound("maxBytes", old.max_bytes, new.max_bytes)
    changes += _owner(old.owner, new.owner)
    return _report(old.ref, new.ref, (_tolerate(c, old, new) for c in changes))


def diff_capability(old: CapabilityContract, new: CapabilityContract) -> DiffReport:
    changes = _identity(old.name, new.name)
    if old.kind != new.kind:
        changes.append(make("routing-changed", "kind", f"kind {old.kind} -> {new.kind}", "kind"))
    if old.queue != new.queue:
        message = f"queue {old.queue} -> {new.queue}: dual-route or drain"
        changes.append(make("routing-changed", "queue", message, "queue"))
    for part, a, b in (("request", old.request, new.request), ("result", old.result, new.result)):
        if a != b:
            changes.append(make(f"{part}-changed", part, f"{part} contract {a} -> {b}"))
    changes += _members("error-code", "errors", old.errors, new.errors)
    for attr, name in (
        ("time_ms", "timeMs"),
        ("memory_bytes", "memoryBytes"),
        ("input_bytes", "inputBytes"),
    ):
        changes += _bound(f"limits.{name}", getattr(old.limits, attr), getattr(new.limits, attr))
    if old.idempotency != new.idempotency:
        message = f"idempotency {old.idempotency} -> {new.idempotency}"
        changes.append(make("idempotency-changed", "idempotency", message))
    if old.cacheable != new.cacheable:
        message = f"cacheable {old.cacheable} -> {new.cacheable}"
        changes.append(make("cacheable-changed", "cacheable", message))
    changes += _description(old.description, new.description)
    changes += _owner(old.owner, new.owner)
    return _report(old.ref, new.ref, changes)


def _report(old: ContractRef, new: ContractRef, changes: Iterable[Change]) -> DiffReport:
    ordered = sorted(changes, key=lambda c: (c.path, c.code, c.detail))
    return DiffReport(old, new, tuple(ordered))


def _tolerate(change: Change, old: MessageContract, new: MessageContract) -> Change:
    if change.code in _ADDED and not change.forward and tolerates(old, new.version, change.path):
        return replace(change, forward=True, tolerated=True)
    if change.code in _REMOVED and not change.backward and tolerates(new, old.version, change.path):
        return replace(change, backward=True, tolerated=True)
    return change


def _identity(old: str, new: str) -> list[Change]:
    if old == new:
        return []
    return [make("name-changed", "name", f"name {old} -> {new}: a different identity")]


def _members(kind: str, base: str, old: Iterable[str], new: Iterable[str]) -> list[Change]:
    before, after = set(old), set(new)
    added = [make(f"{kind}-added", f"{base}.{m}", f"{kind} {m} added") for m in after - before]
    removed = [
        make(f"{kind}-removed", f"{base}.{m}", f"{kind} {m} removed") for m in before - after
    ]
    return added + removed


def _description(old: str | None, new: str | None) -> list[Change]:
    if old == new:
        return []
    code = "meaning-changed" if is_semantic(old) or is_semantic(new) else "description-changed"
    return [make(code, "description", "description changed")]


def _bound(path: str, old: int | None, new: int | None) -> list[Change]:
    if old == new:
        return []
    tighter = new is not None and (old is None or new < old)
    code = "limit-tightened" if tighter else "limit-relaxed"
    return [make(code, path, f"{path} {old} -> {new}", f"{path} {old} -> {new}")]


def _owner(old: str, new: str) -> list[Change]:
    return [] if old == new else [make("owner-changed", "owner", f"owner {old} -> {new}")]
