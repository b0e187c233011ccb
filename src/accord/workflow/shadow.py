"""Shadow runs: what a new plan version would have done with recorded runs, compared.

Pure data and comparison; the replay itself is :mod:`accord.engine.runtime.shadow`. A
:class:`Trace` is what one run did, in terms two plan versions can be compared by: its final
status, the edges it released, where each decision went, and the capability calls it made (stage,
capability and bound input). :func:`compare` lists the :class:`Divergence` s of the new plan's
trace from the recorded one:

- ``route`` — an edge released by one version and not the other;
- ``decision`` — a decision stage of both versions that chose a different next stage;
- ``new-call`` — a capability the new version calls that the recorded run never called;
- ``would-dispatch`` — a call the recorded results cannot answer (the capability is new, or its
  input or capability version changed): the shadow run stops there, since nothing is executed;
- ``binding`` — a stage of the new version whose input binding fails (``binding-*`` codes);
- ``outcome`` — the run ends differently (``completed``, ``failed``, ``cancelled``, or
  ``incomplete`` when the shadow stopped at a call it could not answer or had nothing left to
  replay, such as a timer the recorded run waited for).

A :class:`Report` counts runs and divergences by kind, with each run's list.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["KINDS", "Call", "Divergence", "Report", "RunReport", "Trace", "compare"]

KINDS = ("route", "decision", "new-call", "would-dispatch", "binding", "outcome")
Kind = Literal["route", "decision", "new-call", "would-dispatch", "binding", "outcome"]


@dataclass(frozen=True, slots=True)
class Call:
    stage: str
    capability: str  # name@version
    input: str  # canonical JSON of the bound input


@dataclass(frozen=True, slots=True)
class Trace:
    status: str  # completed | failed | cancelled | incomplete
    released: frozenset[str] = frozenset()
    decisions: Mapping[str, str] = field(default_factory=dict)  # decision stage → next
    calls: tuple[Call, ...] = ()
    unanswered: tuple[tuple[Call, str], ...] = ()  # calls the shadow could not answer, and why
    binding_errors: Mapping[str, str] = field(default_factory=dict)  # stage → code


@dataclass(frozen=True, slots=True)
class Divergence:
    kind: Kind
    subject: str
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "subject": self.subject, "detail": self.detail}


def compare(recorded: Trace, shadow: Trace) -> list[Divergence]:
    out: list[Divergence] = []
    for edge in sorted(recorded.released ^ shadow.released):
        side = "only the new version" if edge in shadow.released else "only the recorded run"
        out.append(Divergence("route", edge, f"released by {side}"))
    for name in sorted(set(recorded.decisions) & set(shadow.decisions)):
        was, now = recorded.decisions[name], shadow.decisions[name]
        if was != now:
            out.append(Divergence("decision", name, f"chose {now!r}, the recorded run {was!r}"))
    known = {c.capability.partition("@")[0] for c in recorded.calls}
    for call in shadow.calls:
        if call.capability.partition("@")[0] not in known:
            out.append(Divergence("new-call", call.stage, f"calls {call.capability}"))
    for call, why in shadow.unanswered:
        out.append(Divergence("would-dispatch", call.stage, f"{call.capability}: {why}"))
    for name, code in sorted(shadow.binding_errors.items()):
        out.append(Divergence("binding", name, code))
    if recorded.status != shadow.status:
        out.append(
            Divergence(
                "outcome", "run", f"ends {shadow.status}, the recorded run {recorded.status}"
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class RunReport:
    run_id: str
    recorded: str
    shadow: str
    divergences: tuple[Divergence, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "recorded": self.recorded,
            "shadow": self.shadow,
            "divergences": [d.to_json() for d in self.divergences],
        }


@dataclass(frozen=True, slots=True)
class Report:
    workflow: str
    recorded_digest: str
    shadow_digest: str
    runs: tuple[RunReport, ...]

    @property
    def diverged(self) -> int:
        return sum(1 for r in self.runs if r.divergences)

    def counts(self) -> dict[str, int]:
        """Runs with at least one divergence of each kind."""
        seen: Counter[str] = Counter()
        for r in self.runs:
            seen.update({d.kind for d in r.divergences})
        return {k: seen.get(k, 0) for k in KINDS}

    def outcomes(self) -> dict[str, int]:
        return dict(sorted(Counter(r.shadow for r in self.runs).items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "workflow": self.workflow,
            "recorded_digest": self.recorded_digest,
            "shadow_digest": self.shadow_digest,
            "replayed": len(self.runs),
            "identical": len(self.runs) - self.diverged,
            "diverged": self.diverged,
            "runs_with": self.counts(),
            "shadow_outcomes": self.outcomes(),
            "runs": [r.to_json() for r in self.runs],
        }
