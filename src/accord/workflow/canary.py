"""Canary activation: a share of new runs goes to a new plan version until it is promoted or
aborted.

Pure functions; the store side is :mod:`accord.engine.runtime.canary`.

**The split.** A :class:`Split` names the workflow, the *stable* digest (the active version when
the canary began), the *canary* digest and its share in basis points (``10%`` is 1000). A run is
sent to the canary when :func:`bucket` of its key — the first 32 bits of sha256 over the run id,
which the engine derives from the tenant and the idempotency key — modulo 10 000 is below the
share; so the choice is stable: the same key always lands on the same side, on every engine.
:func:`choose` answers the digest and the *admission* the run records (``digest``, ``reason``
``canary`` or ``stable``, the bucket and the share).

**Promotion criteria.** :class:`Criteria` say the canary's failure rate may exceed the stable
version's by at most ``max_increase`` over at least ``min_runs`` ended canary runs. They are read
from the definition's ``promotion_criteria`` when it is written in the form
``failure rate not above the old version's by more than 5% over at least 20 runs``
(:func:`parse_criteria`), else given on the command line. :func:`verdict` compares the recorded
outcomes of the two digests: ``wait`` until ``min_runs`` canary runs have ended, then ``abort``
when the criteria fail and ``promote`` when they hold.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from accord.errors import AccordError

__all__ = [
    "BASIS",
    "CanaryError",
    "Criteria",
    "Outcomes",
    "Split",
    "Verdict",
    "bucket",
    "choose",
    "parse_criteria",
    "parse_share",
    "verdict",
]

BASIS = 10_000  # shares are in basis points
SplitState = Literal["running", "promoted", "aborted"]


class CanaryError(AccordError):
    code = "canary-error"

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(f"{code}: {message}")


def parse_share(text: str) -> int:
    """``"10%"`` (or ``"10"``, ``"2.5%"``) as basis points; 0 < share < 100%."""
    raw = text.strip().removesuffix("%")
    try:
        value = float(raw)
    except ValueError:
        raise CanaryError("canary-bad-share", f"--canary {text!r}: expected a percentage") from None
    points = round(value * 100)
    if not 0 < points < BASIS:
        raise CanaryError("canary-bad-share", f"--canary {text!r}: must be above 0% and below 100%")
    return points


def share_text(points: int) -> str:
    return f"{points / 100:g}%"


def bucket(key: str) -> int:
    """A stable bucket in ``[0, 10000)`` for a run key."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % BASIS


@dataclass(frozen=True, slots=True)
class Criteria:
    max_increase: float = 0.05  # canary failure rate − stable failure rate, at most
    min_runs: int = 20  # ended canary runs before a verdict

    def to_json(self) -> dict[str, Any]:
        return {"max_increase": self.max_increase, "min_runs": self.min_runs}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Criteria:
        return cls(float(doc["max_increase"]), int(doc["min_runs"]))

    def __str__(self) -> str:
        return (
            f"failure rate not above the old version's by more than "
            f"{self.max_increase * 100:g}% over at least {self.min_runs} runs"
        )


_CRITERIA = re.compile(
    r"failure rate not above the old version'?s? by more than\s+(?P<n>\d+(?:\.\d+)?)\s*%"
    r"\s+over at least\s+(?P<m>\d+)\s+runs",
    re.IGNORECASE,
)


def parse_criteria(text: str | None) -> Criteria | None:
    """Criteria written in the definition's ``promotion_criteria``, when in the known form."""
    found = _CRITERIA.search(text or "")
    if found is None:
        return None
    return Criteria(float(found["n"]) / 100, int(found["m"]))


@dataclass(frozen=True, slots=True)
class Split:
    workflow: str
    stable: str
    canary: str
    share: int  # basis points
    criteria: Criteria = field(default_factory=Criteria)
    state: SplitState = "running"
    by: str = ""
    reason: str = ""
    at_ms: int = 0
    decided_by: str = ""
    decision: str = ""  # why it was promoted or aborted
    decided_at_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "canary",
            "workflow": self.workflow,
            "stable": self.stable,
            "canary": self.canary,
            "share": self.share,
            "criteria": self.criteria.to_json(),
            "state": self.state,
            "by": self.by,
            "reason": self.reason,
            "at_ms": self.at_ms,
            "decided_by": self.decided_by,
            "decision": self.decision,
            "decided_at_ms": self.decided_at_ms,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Split:
        return cls(
            workflow=doc["workflow"],
            stable=doc["stable"],
            canary=doc["canary"],
            share=int(doc["share"]),
            criteria=Criteria.from_json(doc["criteria"]),
            state=doc["state"],
            by=doc.get("by", ""),
            reason=doc.get("reason", ""),
            at_ms=int(doc.get("at_ms", 0)),
            decided_by=doc.get("decided_by", ""),
            decision=doc.get("decision", ""),
            decided_at_ms=int(doc.get("decided_at_ms", 0)),
        )

    def decided(self, state: SplitState, by: str, why: str, at_ms: int) -> Split:
        return replace(self, state=state, decided_by=by, decision=why, decided_at_ms=at_ms)


def choose(split: Split, key: str) -> tuple[str, dict[str, Any]]:
    """The digest a run with ``key`` starts on under a running ``split``, and its admission."""
    b = bucket(key)
    to_canary = split.state == "running" and b < split.share
    digest = split.canary if to_canary else split.stable
    admission = {
        "digest": digest,
        "reason": "canary" if to_canary else "stable",
        "bucket": b,
        "share": share_text(split.share),
    }
    return digest, admission


@dataclass(frozen=True, slots=True)
class Outcomes:
    ended: int = 0
    failed: int = 0  # failed or cancelled
    running: int = 0

    @property
    def failure_rate(self) -> float:
        return self.failed / self.ended if self.ended else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "ended": self.ended,
            "failed": self.failed,
            "running": self.running,
            "failure_rate": round(self.failure_rate, 4),
        }


@dataclass(frozen=True, slots=True)
class Verdict:
    decision: Literal["promote", "abort", "wait"]
    why: str


def verdict(criteria: Criteria, stable: Outcomes, canary: Outcomes) -> Verdict:
    if canary.ended < criteria.min_runs:
        return Verdict("wait", f"{canary.ended} of {criteria.min_runs} canary runs have ended")
    gap = canary.failure_rate - stable.failure_rate
    rates = (
        f"canary failure rate {canary.failure_rate:.1%} over {canary.ended} runs, "
        f"stable {stable.failure_rate:.1%} over {stable.ended}"
    )
    if gap > criteria.max_increase + 1e-12:
        return Verdict("abort", f"{rates}: above by more than {criteria.max_increase:.1%}")
    return Verdict("promote", f"{rates}: within {criteria.max_increase:.1%}")
