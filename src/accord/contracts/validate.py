"""Runtime validation: one compiled validator per contract, used at every boundary.

Order of work for one message (each step can only refuse, never repair):

1. bytes or text larger than the contract's ``max_bytes`` (default :data:`DEFAULT_MAX_BYTES`) are
   refused **before** decoding (``oversized``, raised as :class:`~accord.errors.OversizedMessage`);
2. bytes are decoded strictly (:mod:`accord.contracts.strictjson`);
3. the DSL's rules are applied (:mod:`accord.contracts.normalise`): defaults fill missing fields,
   tolerated unknown fields are dropped when the validator is tolerant;
4. the normalised value is checked against the exported JSON Schema by ``jsonschema_rs`` (the
   fastest correct 2020-12 engine; see ``bench/bench_validation.py``), collecting **every**
   failure as a :class:`~accord.errors.FieldViolation` with a path in the
   :mod:`accord.contracts.paths` spelling, sorted, one per (path, code).

A field marked ``sensitive`` also accepts a sealed token
(:mod:`accord.contracts.sealing`) in place of its value: the run record, history and job payloads
carry sensitive values sealed, and only the part holding the key opens (and so checks) them.

A valid message costs one ``is_valid`` call plus the (often empty) normalising plan; the error
walk runs only for invalid input. Error texts mask instance values, so a ``sensitive`` value can
never leak through a violation. Shadow mode (:class:`ShadowValidator`) validates and records
without refusing: the migration path for bringing informal JSON under contract.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import jsonschema_rs

from accord.canonical import digest_of
from accord.contracts.formats import FORMAT_PATTERNS
from accord.contracts.jsonschema import export
from accord.contracts.model import MessageContract
from accord.contracts.normalise import Normaliser
from accord.contracts.paths import format_path, join
from accord.contracts.sealing import PREFIX as SEALED_PREFIX
from accord.contracts.strictjson import DEFAULT_MAX_DEPTH, JsonRejected, loads_strict
from accord.errors import FieldViolation, OversizedMessage, ValidationError

__all__ = [
    "DEFAULT_MAX_BYTES",
    "HARD_MAX_BYTES",
    "Mode",
    "ShadowRecord",
    "ShadowValidator",
    "ValidationResult",
    "Validator",
    "validate",
]

DEFAULT_MAX_BYTES = 1 << 20  # when a contract declares no max_bytes
HARD_MAX_BYTES = 64 << 20  # not even shadow mode decodes more than this
Mode = Literal["enforce", "shadow"]
_RAW = (str, bytes, bytearray, memoryview)
_FORMAT_MARK = "allOf"  # exported schemas never use allOf; the engine schema puts formats there
_SENSITIVE = "x-accord-sensitive"
_SEALED = {"type": "string", "pattern": "^" + re.escape(SEALED_PREFIX)}

_CODES = {
    "Type": "wrong-type",
    "Enum": "not-in-enum",
    "Pattern": "pattern",
    "Format": "format",
    "MinLength": "too-short",
    "MaxLength": "too-long",
    "Minimum": "too-small",
    "ExclusiveMinimum": "too-small",
    "Maximum": "too-large",
    "ExclusiveMaximum": "too-large",
    "MultipleOf": "not-multiple",
    "MinItems": "too-few-items",
    "MaxItems": "too-many-items",
}


class ValidationResult(NamedTuple):
    """``value`` is the normalised message (``None`` when the input could not be decoded).

    A named tuple rather than a dataclass: it is built once per message on the hot path.
    """

    ok: bool
    value: Any
    violations: tuple[FieldViolation, ...] = ()
    ignored: tuple[str, ...] = ()  # tolerated unknown fields that were dropped
    mode: Mode = "enforce"
    decoded: bool = True

    @property
    def accepted(self) -> bool:
        """Whether a boundary lets the message through (shadow mode passes decodable input)."""
        return self.ok or (self.mode == "shadow" and self.decoded)

    @property
    def paths(self) -> list[str]:
        return sorted({v.path for v in self.violations})


@dataclass(frozen=True, slots=True)
class ShadowRecord:
    """What shadow mode records for one non-conforming message."""

    contract: str
    violations: tuple[FieldViolation, ...]


_CACHE_LIMIT = 512
_cache: dict[tuple[str, bool], Validator] = {}
_by_identity: dict[tuple[int, bool], tuple[MessageContract, Validator]] = {}


class Validator:
    """A contract's compiled validator; build it with :meth:`for_contract` (cached)."""

    def __init__(self, contract: MessageContract, *, tolerate: bool = False) -> None:
        self.contract = contract
        self.ref = str(contract.ref)
        self.tolerate = tolerate
        self.max_bytes = contract.max_bytes or DEFAULT_MAX_BYTES
        self.max_depth = DEFAULT_MAX_DEPTH
        self.schema = export(contract)
        self._normaliser = Normaliser(contract, tolerate=tolerate)
        self._engine = jsonschema_rs.Draft202012Validator(_engine_schema(self.schema), mask="***")

    @classmethod
    def for_contract(cls, contract: MessageContract, *, tolerate: bool = False) -> Validator:
        """The validator of ``contract``, compiled once and reused (also for equal contracts)."""
        hit = _by_identity.get((id(contract), tolerate))
        if hit is not None and hit[0] is contract:
            return hit[1]
        key = (digest_of([export(contract), _tolerances(contract), contract.max_bytes]), tolerate)
        validator = _cache.get(key)
        if validator is None:
            if len(_cache) >= _CACHE_LIMIT:
                _cache.clear()
                _by_identity.clear()
            validator = _cache[key] = cls(contract, tolerate=tolerate)
        _by_identity[(id(contract), tolerate)] = (contract, validator)
        return validator

    def validate(
        self,
        data: Any,
        *,
        mode: Mode = "enforce",
        sink: Callable[[ShadowRecord], None] | list[ShadowRecord] | None = None,
    ) -> ValidationResult:
        """Validate a decoded value, or ``bytes``/``str`` JSON; never raises for bad input."""
        result = self._validate(data, mode)
        if not result.ok and sink is not None:
            record = ShadowRecord(self.ref, result.violations)
            sink.append(record) if isinstance(sink, list) else sink(record)
        return result

    def check(self, data: Any) -> Any:
        """The normalised message, or :class:`ValidationError` naming every failing path."""
        result = self._validate(data, "enforce")
        if result.ok:
            return result.value
        if any(v.code == "oversized" for v in result.violations):
            raise OversizedMessage(self.ref, result.violations)
        raise ValidationError(self.ref, result.violations)

    def _validate(self, data: Any, mode: Mode) -> ValidationResult:
        early: tuple[FieldViolation, ...] = ()
        if isinstance(data, _RAW):
            size = len(data.encode("utf-8")) if isinstance(data, str) else len(data)
            if size > self.max_bytes:
                limit = f"{size} bytes exceeds the limit of {self.max_bytes}"
                early = (FieldViolation("", limit, "oversized"),)
                if mode == "enforce" or size > HARD_MAX_BYTES:
                    return ValidationResult(False, None, early, (), mode, False)
            try:
                data = loads_strict(data, self.max_depth)
            except JsonRejected as exc:
                bad = (*early, FieldViolation(exc.path, str(exc), exc.code))
                return ValidationResult(False, None, bad, (), mode, False)
        ignored: list[str] = []
        value = self._normaliser.apply(data, ignored)
        try:
            if self._engine.is_valid(value) and not early:
                return ValidationResult(True, value, (), tuple(ignored), mode)
            violations = early + self._violations(value)
        except (ValueError, TypeError, OverflowError) as exc:
            violations = (*early, FieldViolation("", f"not a JSON value: {exc}", "not-json"))
        return ValidationResult(False, value, violations, tuple(ignored), mode)

    def _violations(self, value: Any) -> tuple[FieldViolation, ...]:
        found: dict[tuple[str, str], FieldViolation] = {}
        for error in self._engine.iter_errors(value):
            for violation in _translate(error):
                found.setdefault((violation.path, violation.code), violation)
        return tuple(found[key] for key in sorted(found))


def _translate(error: Any) -> list[FieldViolation]:
    path = format_path(error.instance_path)
    kind = type(error.kind).__name__
    if kind == "Required":
        return [
            FieldViolation(join(path, error.kind.property), "required field is missing", "missing")
        ]
    if kind == "AdditionalProperties":
        return [
            FieldViolation(join(path, name), "unknown field (not in the contract)", "unknown-field")
            for name in error.kind.unexpected
        ]
    if kind == "Pattern" and _FORMAT_MARK in error.schema_path:
        return [FieldViolation(path, "not in the declared format", "format")]
    if kind == "Type" and error.instance is None:
        return [FieldViolation(path, "null is not allowed here (not nullable)", "null-not-allowed")]
    return [FieldViolation(path, error.message, _CODES.get(kind, "invalid"))]


def _engine_schema(node: Any) -> Any:
    """The exported schema with each known ``format`` turned into a pattern (no callbacks).

    The pattern sits under ``allOf`` beside any declared ``pattern``, and the error translation
    recognises it there and reports code ``format``; unknown formats stay annotations.
    """
    if isinstance(node, list):
        return [_engine_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {
        k: (
            {n: _engine_schema(v) for n, v in sub.items()}
            if k == "properties"
            else _engine_schema(sub)
        )
        for k, sub in node.items()
        if k != "format"
    }
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt in FORMAT_PATTERNS:
        out[_FORMAT_MARK] = [{"pattern": FORMAT_PATTERNS[fmt]}]
    if node.get(_SENSITIVE) is True:
        # a sealed token stands for any value of the field (it is checked where it is opened);
        # a clear value is checked as declared, its errors reported as if the wrap were not there
        return {"if": _SEALED, "then": True, "else": out}
    return out


def _tolerances(contract: MessageContract) -> list[list[Any]]:
    return [[t.version, sorted(t.fields)] for t in contract.tolerates]


class ShadowValidator:
    """Validates and records every violation, but refuses nothing that could be decoded."""

    def __init__(
        self,
        contract: MessageContract,
        sink: Callable[[ShadowRecord], None] | list[ShadowRecord],
        *,
        tolerate: bool = False,
    ) -> None:
        self._validator = Validator.for_contract(contract, tolerate=tolerate)
        self._sink = sink
        self.seen = 0
        self.failed = 0

    def validate(self, data: Any) -> ValidationResult:
        result = self._validator.validate(data, mode="shadow", sink=self._sink)
        self.seen += 1
        self.failed += not result.ok
        return result

    def check(self, data: Any) -> Any:
        """The (best-effort normalised) message; raises only for undecodable input."""
        result = self.validate(data)
        if not result.decoded:
            raise ValidationError(self._validator.ref, result.violations)
        return result.value


def validate(
    contract: MessageContract,
    data: Any,
    *,
    mode: Mode = "enforce",
    tolerate: bool = False,
    sink: Callable[[ShadowRecord], None] | list[ShadowRecord] | None = None,
) -> ValidationResult:
    """Validate ``data`` against ``contract`` with its cached validator."""
    return Validator.for_contract(contract, tolerate=tolerate).validate(data, mode=mode, sink=sink)
