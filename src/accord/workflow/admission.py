"""Layer 5 — admission: planned work fails closed, and plans run only where workers are live.

At compile time (:func:`check_planned`): a ``planned`` definition must carry ``owner``,
``review_date`` and ``promotion_criteria`` (``admission-planned-incomplete``); it may use planned
capabilities only when each of them carries the same three (``admission-planned-capability``).
A planned definition still compiles, so it can be reviewed and rendered, but :func:`admit`
refuses to run it (``admission-plan-planned``).

At run admission (:func:`admit`): every capability version the plan needs — task stages,
compensations and finalisers — must have a live registration in ``live_capabilities``
(``capability ref → [worker or action ids]``, from the engine's heartbeat announcements; actions
are registered in-process and appear in the same map). Missing ones are refused with
``admission-no-live-worker`` / ``admission-no-action``. Pure: the engine supplies the live map.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from accord.contracts.model import CapabilityContract
from accord.errors import Diagnostic, Location
from accord.workflow.dsl import Definition
from accord.workflow.plan import CapabilityPin, Plan, TaskStage

__all__ = ["admit", "check_planned"]


def check_planned(
    d: Definition, capabilities: Mapping[str, CapabilityContract]
) -> list[Diagnostic]:
    if d.status != "planned":
        return []
    out: list[Diagnostic] = []
    missing = [k for k in ("owner", "review_date", "promotion_criteria") if not getattr(d, k)]
    if missing:
        out.append(
            d.diag(
                "admission-planned-incomplete",
                f"a planned workflow needs {', '.join(missing)}",
                "status",
            )
        )
    for ref, cap in sorted(capabilities.items()):
        if cap.status != "planned":
            continue
        absent = [k for k in ("owner", "review_date", "promotion_criteria") if not getattr(cap, k)]
        if absent:
            out.append(
                d.diag(
                    "admission-planned-capability",
                    f"planned capability {ref} lacks {', '.join(absent)}",
                    "stages",
                )
            )
    return out


def _needs(plan: Plan) -> list[tuple[CapabilityPin, str, int]]:
    needs: list[tuple[CapabilityPin, str, int]] = []
    for s in plan.stages:
        if isinstance(s, TaskStage):
            needs.append((s.capability, s.name, s.line))
            if s.compensate is not None:
                needs.append((s.compensate, s.name, s.line))
    needs += [(f, "", 0) for f in plan.finalisers]
    return needs


def admit(plan: Plan, live_capabilities: Mapping[str, Sequence[str]]) -> list[Diagnostic]:
    """Findings that stop ``plan`` from running now; empty means admitted."""
    out: list[Diagnostic] = []
    if plan.status == "planned":
        out.append(
            Diagnostic(
                "admission-plan-planned",
                f"{plan.name} {plan.version} is planned, not active",
                Location(plan.source),
            )
        )
    seen: set[str] = set()
    for pin, stage, line in _needs(plan):
        if pin.ref in seen or live_capabilities.get(pin.ref):
            continue
        seen.add(pin.ref)
        code = "admission-no-live-worker" if pin.kind == "worker" else "admission-no-action"
        what = "no live worker has" if pin.kind == "worker" else "no action is"
        out.append(
            Diagnostic(
                code, f"{what} registered for {pin.ref}", Location(plan.source, line), stage=stage
            )
        )
    return out
