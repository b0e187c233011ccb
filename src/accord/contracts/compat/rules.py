"""The change classes of docs/compatibility.md as data: one :class:`Rule` per stable change code.

Every change the diff can report has a code here, with the row of the table it implements, its
backward and forward verdicts for a **closed** reader (unknown fields rejected), the action it
requires and the package SemVer level it implies. A comparator may refine a verdict only where the
table itself makes it conditional (``required-to-optional`` is forward-compatible when the old
field had a default, which the old reader then applies); everything else is read from here, so
the table lives in one place and the tests walk it.

Defaults and enum members are compared by :func:`value_key`, their canonical JSON, so ``true``,
``1`` and ``1.0`` are three different values even though Python holds them equal.

Row ``x`` marks Accord's own additions (contract identity, capability fields, reserved names); they
follow the nearest row's reasoning and are named in :mod:`accord.contracts.compat`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from accord.canonical import canonical_json
from accord.errors import Location

__all__ = [
    "ACTIONS",
    "CA",
    "DR",
    "NONE",
    "RULES",
    "TR",
    "WV",
    "Action",
    "Bump",
    "Change",
    "Rule",
    "is_semantic",
    "make",
    "value_key",
]

Action: TypeAlias = Literal[
    "none", "tolerant-reader", "new-wire-version", "consumer-analysis", "dual-route"
]
Bump: TypeAlias = Literal["major", "minor", "patch"]
NONE: Action = "none"
TR: Action = "tolerant-reader"
WV: Action = "new-wire-version"
CA: Action = "consumer-analysis"
DR: Action = "dual-route"
ACTIONS: tuple[Action, ...] = (WV, DR, CA, TR, NONE)  # most demanding first


@dataclass(frozen=True, slots=True)
class Rule:
    row: str
    backward: bool
    forward: bool
    action: Action
    bump: Bump


RULES: dict[str, Rule] = {
    "field-added-optional": Rule("1", True, False, TR, "minor"),
    "field-added-required": Rule("2", False, False, WV, "major"),
    "field-added-required-with-default": Rule("3", True, False, CA, "minor"),
    "field-removed-optional": Rule("4", False, True, TR, "major"),
    "field-removed-required": Rule("5", False, False, WV, "major"),
    "field-removed-required-with-default": Rule("5", False, True, TR, "major"),
    "optional-to-required": Rule("6", False, True, WV, "major"),
    "optional-to-required-with-default": Rule("6", True, True, CA, "minor"),
    "default-removed-from-required": Rule("6", False, True, WV, "major"),
    "required-to-optional": Rule("7", True, False, CA, "minor"),
    "default-added-to-required": Rule("7", True, False, CA, "minor"),
    "limit-tightened": Rule("8", False, True, WV, "major"),
    "pattern-added": Rule("8", False, True, WV, "major"),
    "pattern-changed": Rule("8", False, False, WV, "major"),
    "format-added": Rule("8", False, True, WV, "major"),
    "format-changed": Rule("8", False, False, WV, "major"),
    "enum-value-removed": Rule("8", False, True, WV, "major"),
    "limit-changed": Rule("8", False, False, WV, "major"),
    "limit-relaxed": Rule("9", True, False, CA, "minor"),
    "pattern-removed": Rule("9", True, False, CA, "minor"),
    "format-removed": Rule("9", True, False, CA, "minor"),
    "enum-value-added": Rule("10", True, False, CA, "minor"),
    "type-changed": Rule("11", False, False, WV, "major"),
    "type-widened": Rule("11", True, False, CA, "minor"),
    "type-narrowed": Rule("11", False, True, WV, "major"),
    "nullable-added": Rule("12", True, False, CA, "minor"),
    "nullable-removed": Rule("13", False, True, WV, "major"),
    "default-changed": Rule("14", True, True, CA, "minor"),
    "unit-changed": Rule("15", True, True, CA, "minor"),
    "meaning-changed": Rule("15", True, True, CA, "minor"),
    "sensitive-added": Rule("16", True, True, NONE, "patch"),
    "sensitive-removed": Rule("16", True, True, CA, "minor"),
    "field-renamed": Rule("17", False, False, WV, "major"),
    "routing-changed": Rule("18", True, True, DR, "minor"),
    "outcome-added": Rule("19", True, False, CA, "minor"),
    "outcome-removed": Rule("19", False, True, WV, "major"),
    "description-changed": Rule("20", True, True, NONE, "patch"),
    "deprecated-changed": Rule("20", True, True, NONE, "patch"),
    "owner-changed": Rule("20", True, True, NONE, "patch"),
    # Accord's own additions
    "reserved-name-reused": Rule("x", False, False, WV, "major"),
    "name-changed": Rule("x", False, False, WV, "major"),
    "request-changed": Rule("x", False, False, WV, "major"),
    "result-changed": Rule("x", False, False, WV, "major"),
    "error-code-added": Rule("x", True, False, CA, "minor"),
    "error-code-removed": Rule("x", False, True, WV, "major"),
    "idempotency-changed": Rule("x", True, True, CA, "minor"),
    "cacheable-changed": Rule("x", True, True, CA, "minor"),
}


@dataclass(frozen=True, slots=True)
class Change:
    """One classified difference between two versions; ``key`` is what acknowledgements name."""

    code: str
    path: str
    backward: bool
    forward: bool
    action: Action
    message: str
    detail: str = ""  # the keyword or value concerned, e.g. ``maxLength 64 -> 32``
    tolerated: bool = False  # a failing direction was lifted by a declared tolerance
    location: Location | None = field(default=None, compare=False)

    @property
    def key(self) -> str:
        return f"{self.code}@{self.path}"

    @property
    def bump(self) -> Bump:
        return RULES[self.code].bump

    def as_dict(self) -> dict[str, object]:
        return {
            "action": self.action,
            "backward": self.backward,
            "code": self.code,
            "detail": self.detail,
            "forward": self.forward,
            "key": self.key,
            "message": self.message,
            "path": self.path,
            "tolerated": self.tolerated,
        }


def make(
    code: str,
    path: str,
    message: str,
    detail: str = "",
    *,
    forward: bool | None = None,
    location: Location | None = None,
) -> Change:
    """A change with the verdicts of its rule (``forward`` overrides where the table allows)."""
    rule = RULES[code]
    return Change(
        code=code,
        path=path,
        backward=rule.backward,
        forward=rule.forward if forward is None else forward,
        action=rule.action,
        message=message,
        detail=detail,
        location=location,
    )


SEMANTIC_MARK = "semantic:"


def value_key(value: Any) -> str:
    """Canonical JSON of a default or enum member (``repr`` for what JSON cannot hold)."""
    try:
        return canonical_json(_plain(value)).decode("utf-8")
    except (TypeError, ValueError):
        return repr(value)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def is_semantic(description: str | None) -> bool:
    """A description that defines meaning starts with ``Semantic:`` (any case)."""
    return description is not None and description.lstrip().lower().startswith(SEMANTIC_MARK)
