"""The values plan stages are made of: capability pins, typed bindings and the task policies.

They sit below the stage kinds (:mod:`accord.workflow.kinds`) and the plan
(:mod:`accord.workflow.plan`, which re-exports them), so every kind module can use them without
importing the plan that is built from the kinds. Each value's canonical JSON form is here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

__all__ = [
    "DSL_VERSION",
    "TERMINALS",
    "Binding",
    "CachePolicy",
    "CapabilityPin",
    "InputValue",
    "JsonValue",
    "RetryPolicy",
    "Timeouts",
    "pin_from_json",
    "pin_to_json",
    "value_from_json",
    "value_to_json",
]

DSL_VERSION = "1"
TERMINALS: tuple[str, ...] = ("completed", "failed")

JsonValue: TypeAlias = Any


@dataclass(frozen=True, slots=True)
class CapabilityPin:
    """A capability ``name@version`` pinned to its request/result contracts."""

    kind: Literal["worker", "action"]
    name: str
    version: int
    request: str  # message contract ref, ``thumbnail-generation-request@2``
    result: str  # message contract ref, ``thumbnail-generated@1``
    request_digest: str
    result_digest: str

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"


@dataclass(frozen=True, slots=True)
class Binding:
    """A typed reference: ``${context.a.b}`` or ``${stages["s"].result.a}``, bound at run time."""

    source: Literal["context", "stage"]
    path: tuple[str, ...]
    stage: str | None = None
    expected_type: str | None = None  # contract field type at the destination, when known
    raw: str = ""


InputValue: TypeAlias = Binding | JsonValue


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded exponential backoff. ``max_attempts`` counts the first attempt."""

    max_attempts: int = 3
    initial_backoff_ms: int = 1_000
    max_backoff_ms: int = 30_000
    multiplier: float = 2.0
    jitter: float = 0.2  # fraction of the delay, drawn uniformly in [-jitter, +jitter]
    retry_on: tuple[str, ...] = ("retryable", "timeout")

    def backoff_ms(self, attempt: int, unit_random: float = 0.5) -> int:
        """Delay before attempt ``attempt + 1`` (``attempt`` ≥ 1); ``unit_random`` in [0, 1)."""
        base = min(self.initial_backoff_ms * self.multiplier ** (attempt - 1), self.max_backoff_ms)
        spread = base * self.jitter * (2.0 * unit_random - 1.0)
        return max(0, min(int(base + spread), int(self.max_backoff_ms * (1 + self.jitter))))

    def worst_case_backoff_ms(self) -> int:
        """Sum of the longest possible delays between all attempts."""
        return sum(self.backoff_ms(a, 1.0) for a in range(1, self.max_attempts))


@dataclass(frozen=True, slots=True)
class Timeouts:
    queue_deadline_ms: int = 60_000  # dispatch → acceptance
    execution_deadline_ms: int = 300_000  # acceptance → result
    heartbeat_timeout_ms: int | None = None  # max silence while running


@dataclass(frozen=True, slots=True)
class CachePolicy:
    enabled: bool = False
    ttl_ms: int = 0


# --- canonical JSON -----------------------------------------------------------------------


def pin_to_json(pin: CapabilityPin | None) -> dict[str, Any] | None:
    if pin is None:
        return None
    return {
        "kind": pin.kind,
        "name": pin.name,
        "version": pin.version,
        "request": pin.request,
        "result": pin.result,
        "request_digest": pin.request_digest,
        "result_digest": pin.result_digest,
    }


def pin_from_json(doc: Mapping[str, Any] | None) -> CapabilityPin | None:
    if doc is None:
        return None
    return CapabilityPin(
        kind=doc["kind"],
        name=doc["name"],
        version=int(doc["version"]),
        request=doc["request"],
        result=doc["result"],
        request_digest=doc["request_digest"],
        result_digest=doc["result_digest"],
    )


def value_to_json(value: InputValue) -> Any:
    if isinstance(value, Binding):
        return {
            "$binding": {
                "source": value.source,
                "stage": value.stage,
                "path": list(value.path),
                "expected_type": value.expected_type,
                "raw": value.raw,
            }
        }
    return value


def value_from_json(doc: Any) -> InputValue:
    if isinstance(doc, Mapping) and set(doc) == {"$binding"}:
        b = doc["$binding"]
        return Binding(
            source=b["source"],
            stage=b.get("stage"),
            path=tuple(b["path"]),
            expected_type=b.get("expected_type"),
            raw=b.get("raw", ""),
        )
    return doc
