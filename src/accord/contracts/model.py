"""The contract data model: what a parsed, meta-validated contract source *is*.

Pure and frozen. The DSL loader (:mod:`accord.contracts.dsl`) builds these from YAML; canonical
form, JSON Schema export, the compatibility diff, runtime validation and code generation all read
them. Four kinds (docs/architecture.md §2):

- :class:`MessageContract` — a message identity ``name@wireVersion`` with its payload fields;
- :class:`CapabilityContract` — a ``worker`` or ``action`` capability ``name@version`` naming its
  request and result message contracts, error codes, queue, limits and idempotency;
- :class:`PolicyContract` — mutable external policy (e.g. marketplace listing limits), versioned
  apart from structure and recorded with every result it was applied to.

Field semantics are the DSL's own: a ``default`` applies only when a field is *missing*; ``null``
is valid only where ``nullable``; unknown fields are rejected unless a declared tolerance applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from accord.errors import Location

__all__ = [
    "FIELD_TYPES",
    "CapabilityContract",
    "ChangeRecord",
    "Contract",
    "ContractKind",
    "ContractRef",
    "ContractStatus",
    "FieldSpec",
    "FieldType",
    "Limits",
    "MessageContract",
    "PolicyContract",
    "Tolerance",
]

FieldType: TypeAlias = Literal["string", "integer", "number", "boolean", "object", "array"]
FIELD_TYPES: tuple[str, ...] = ("string", "integer", "number", "boolean", "object", "array")
ContractKind: TypeAlias = Literal["message", "worker", "action", "policy"]
ContractStatus: TypeAlias = Literal["planned", "active", "deprecated"]


class _Missing:
    """Sentinel type for 'no default declared' (``None`` is a legitimate default)."""

    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Any = _Missing()


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One payload field. Constraints that do not apply to ``type`` are ``None``."""

    type: FieldType
    required: bool = False
    nullable: bool = False
    default: Any = MISSING  # MISSING means no default; compare with ``has_default``
    description: str | None = None
    unit: str | None = None
    sensitive: bool = False
    deprecated: bool = False
    # string
    min_length: int | None = None
    max_length: int | None = None
    pattern: str | None = None
    format: str | None = None
    # number / integer
    minimum: float | int | None = None
    maximum: float | int | None = None
    exclusive_minimum: float | int | None = None
    exclusive_maximum: float | int | None = None
    multiple_of: float | int | None = None
    # any scalar
    enum: tuple[Any, ...] | None = None
    # object
    fields: Mapping[str, FieldSpec] | None = None
    # array
    items: FieldSpec | None = None
    min_items: int | None = None
    max_items: int | None = None
    location: Location | None = field(default=None, compare=False)

    @property
    def has_default(self) -> bool:
        return self.default is not MISSING


@dataclass(frozen=True, slots=True)
class ContractRef:
    """``name@version``; for messages the version is the wire version."""

    name: str
    version: int

    def __str__(self) -> str:
        return f"{self.name}@{self.version}"

    @classmethod
    def parse(cls, text: str) -> ContractRef:
        name, sep, version = text.rpartition("@")
        if not sep or not name or not version.isdigit():
            raise ValueError(f"not a contract reference (name@version): {text!r}")
        return cls(name, int(version))


@dataclass(frozen=True, slots=True)
class Tolerance:
    """A consumer's declaration that it tolerates named unknown fields from another version."""

    version: int  # the other wire version whose extra fields are tolerated
    fields: tuple[str, ...]  # field paths, e.g. ``thumbnailHint`` or ``views[].angle``


@dataclass(frozen=True, slots=True)
class ChangeRecord:
    """An entry of a contract's change record; ``acknowledges`` lists diff codes accepted."""

    version: int
    summary: str
    acknowledges: tuple[str, ...] = ()  # stable change codes (``enum-value-added@payload.x``)
    reviewed_by: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MessageContract:
    name: str
    wire_version: int
    owner: str
    payload: Mapping[str, FieldSpec]
    status: ContractStatus = "active"
    description: str | None = None
    outcomes: tuple[str, ...] = ()
    reserved: tuple[str, ...] = ()  # names that may never be reused
    tolerates: tuple[Tolerance, ...] = ()
    compatibility: Literal["backward", "forward", "full", "none"] = "backward"
    transitive: bool = False
    max_bytes: int | None = None  # refuse larger messages before parsing
    support_until: str | None = None
    review_date: str | None = None
    promotion_criteria: str | None = None
    changes: tuple[ChangeRecord, ...] = ()
    source: Location | None = field(default=None, compare=False)
    kind: Literal["message"] = "message"

    @property
    def ref(self) -> ContractRef:
        return ContractRef(self.name, self.wire_version)

    @property
    def version(self) -> int:
        return self.wire_version


@dataclass(frozen=True, slots=True)
class Limits:
    time_ms: int | None = None
    memory_bytes: int | None = None
    input_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class CapabilityContract:
    """A ``worker`` (queue-dispatched) or ``action`` (engine-invoked) capability."""

    kind: Literal["worker", "action"]
    name: str  # dotted, e.g. ``thumbnail.render``
    version: int
    owner: str
    request: ContractRef
    result: ContractRef
    status: ContractStatus = "active"
    description: str | None = None
    errors: tuple[str, ...] = ()  # stable error codes the capability may report
    queue: str | None = None  # workers only
    limits: Limits = Limits()
    idempotency: str = "idempotency-key"  # how duplicates are made harmless
    cacheable: bool = False
    support_until: str | None = None
    review_date: str | None = None
    promotion_criteria: str | None = None
    changes: tuple[ChangeRecord, ...] = ()
    source: Location | None = field(default=None, compare=False)

    @property
    def ref(self) -> ContractRef:
        return ContractRef(self.name, self.version)


@dataclass(frozen=True, slots=True)
class PolicyContract:
    name: str
    version: int
    owner: str
    rules: Mapping[str, Any]
    status: ContractStatus = "active"
    description: str | None = None
    applies_to: tuple[ContractRef, ...] = ()
    support_until: str | None = None
    review_date: str | None = None
    promotion_criteria: str | None = None
    changes: tuple[ChangeRecord, ...] = ()
    source: Location | None = field(default=None, compare=False)
    kind: Literal["policy"] = "policy"

    @property
    def ref(self) -> ContractRef:
        return ContractRef(self.name, self.version)


Contract: TypeAlias = MessageContract | CapabilityContract | PolicyContract
