"""Accord's one rooted error tree.

::

    AccordError
    ├── ContractError            a contract source, artefact or registry operation is refused
    │   ├── ContractLintError        meta-validation failed (carries every Diagnostic)
    │   ├── IncompatibleChange       publish refused by the compatibility check
    │   └── ImmutableArtefactError   a published version would change
    ├── ValidationError          a message failed its contract at a boundary (carries paths)
    │   └── OversizedMessage         refused before parsing
    ├── PlanError                a workflow definition or plan is refused (carries Diagnostics)
    ├── EngineError              the engine cannot proceed (not a domain outcome)
    │   └── ConflictError            compare-and-set lost; reload and re-apply
    ├── StoreError               a store adapter failed (translated at its edge); ``retryable`` too
    ├── TransportError           a transport adapter failed; ``retryable`` says what to do
    └── StageFailed              a handler's classified failure (``retryable`` + stable ``code``)

Author-facing errors carry :class:`Location` (file, line, column) and a field path so a message
always names where the problem is. Codes are stable strings: they cross processes and are what
tests and scripts match on, never the wording.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = [
    "AccordError",
    "ConflictError",
    "ContractError",
    "ContractLintError",
    "Diagnostic",
    "EngineError",
    "FieldViolation",
    "ImmutableArtefactError",
    "IncompatibleChange",
    "Location",
    "OversizedMessage",
    "OwnershipLost",
    "PlanError",
    "StageFailed",
    "StoreError",
    "TransportError",
    "ValidationError",
]


@dataclass(frozen=True, slots=True)
class Location:
    """Where something is in a source file; lines and columns count from 1."""

    file: str
    line: int = 0
    column: int = 0

    def __str__(self) -> str:
        if self.line:
            return (
                f"{self.file}:{self.line}:{self.column}"
                if self.column
                else f"{self.file}:{self.line}"
            )
        return self.file


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One finding: a stable code, a message, and where it is."""

    code: str
    message: str
    location: Location | None = None
    path: str = ""  # field path such as ``payload.modelId`` or ``stages[3].on_success``
    stage: str = ""  # workflow stage name, when there is one
    severity: str = "error"  # error | warning

    def __str__(self) -> str:
        where = f"{self.location}: " if self.location else ""
        what = f" [{self.path}]" if self.path else ""
        stage = f" (stage {self.stage!r})" if self.stage else ""
        return f"{where}{self.severity} {self.code}{stage}{what}: {self.message}"

    def as_dict(self) -> dict[str, object]:
        loc = self.location
        return {
            "code": self.code,
            "message": self.message,
            "severity": self.severity,
            "file": loc.file if loc else None,
            "line": loc.line if loc else None,
            "column": loc.column if loc else None,
            "path": self.path,
            "stage": self.stage,
        }


class AccordError(Exception):
    """Root of every error Accord raises on purpose."""

    code: str = "accord-error"


class _DiagnosticsError(AccordError):
    def __init__(self, diagnostics: Iterable[Diagnostic], summary: str = "") -> None:
        self.diagnostics: tuple[Diagnostic, ...] = tuple(diagnostics)
        head = summary or f"{len(self.diagnostics)} problem(s)"
        super().__init__("\n".join([head, *(f"  {d}" for d in self.diagnostics)]))


class ContractError(AccordError):
    code = "contract-error"


class ContractLintError(_DiagnosticsError, ContractError):
    code = "contract-lint"


class IncompatibleChange(_DiagnosticsError, ContractError):
    code = "contract-incompatible"


class ImmutableArtefactError(ContractError):
    code = "contract-immutable"


@dataclass(frozen=True, slots=True)
class FieldViolation:
    path: str
    message: str
    code: str = "invalid"


class ValidationError(AccordError):
    """A message failed its contract; ``violations`` names every failing path."""

    code = "validation-error"

    def __init__(self, contract: str, violations: Iterable[FieldViolation]) -> None:
        self.contract = contract
        self.violations: tuple[FieldViolation, ...] = tuple(violations)
        lines = [f"{v.path or '$'}: {v.message}" for v in self.violations]
        super().__init__(f"{contract}: " + "; ".join(lines))


class OversizedMessage(ValidationError):
    code = "oversized-message"


class PlanError(_DiagnosticsError):
    code = "plan-error"


class EngineError(AccordError):
    code = "engine-error"


class ConflictError(EngineError):
    code = "conflict"


class StoreError(AccordError):
    code = "store-error"

    def __init__(self, message: str = "", *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable  # e.g. the database stayed locked past the busy timeout


class OwnershipLost(StoreError):
    """A commit made under a shard lease that is no longer held at its epoch: another engine
    owns the shard now (or took it and let it go). Nothing of the commit landed; the engine
    drops the shard and what it cached of it, and the delivery goes back to the new owner."""

    code = "ownership-lost"

    def __init__(self, shard: int, owner: str, epoch: int) -> None:
        super().__init__(
            f"ownership lost: shard {shard} is no longer held by {owner} at epoch {epoch}"
        )
        self.shard, self.owner, self.epoch = shard, owner, epoch


class TransportError(AccordError):
    code = "transport-error"

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(eq=False)
class StageFailed(AccordError):
    """A handler's classified failure. ``code`` is stable (``input-too-large``, …)."""

    reason: str
    failure_code: str = "failed"
    retryable: bool = False
    details: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(f"{self.failure_code}: {self.reason}")
