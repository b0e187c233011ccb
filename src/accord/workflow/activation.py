"""Activation: immutable plan versions keyed by digest, one active version per workflow.

Activating stores the plan under its digest (the store refuses a different document under a
known digest, so a stored version is never edited in place) and records it as the workflow's
active version *for new runs*; running runs stay on the digest they started with. Rollback
activates an older digest again: it must be a version this workflow has had before. The stored
document is the digested body plus the digest — no file name or line numbers — so the same plan
compiled from a moved or reformatted file stores identically.

The functions take anything with the engine store's plan methods (:class:`PlanStore`, satisfied
by :class:`accord.engine.ports.Store`); a store that also offers ``plan_versions(workflow)``
(the memory and SQLite adapters do) gives the full activation history, otherwise only the
active version is known. Errors are :class:`ActivationError` with codes
``activation-unknown-plan``, ``activation-wrong-workflow``, ``activation-not-a-version``,
``activation-nothing-to-roll-back``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from accord.errors import AccordError
from accord.workflow.plan import Plan

__all__ = [
    "ActivationError",
    "PlanStore",
    "Version",
    "activate",
    "load_plan",
    "rollback",
    "stored_document",
    "versions",
]


class PlanStore(Protocol):
    async def put_plan(self, digest: str, document: dict[str, Any]) -> None: ...
    async def get_plan(self, digest: str) -> dict[str, Any] | None: ...
    async def set_active(self, workflow: str, digest: str) -> None: ...
    async def get_active(self, workflow: str) -> str | None: ...


class ActivationError(AccordError):
    code = "activation-error"

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(f"{code}: {message}")


@dataclass(frozen=True, slots=True)
class Version:
    digest: str
    version: str  # the definition's own version string
    active: bool
    activated_at_ms: int | None = None


def stored_document(plan: Plan) -> dict[str, Any]:
    return {**plan.body(), "digest": plan.digest}


async def load_plan(store: PlanStore, digest: str) -> Plan:
    doc = await store.get_plan(digest)
    if doc is None:
        raise ActivationError("activation-unknown-plan", f"no stored plan {digest}")
    return Plan.from_json(doc)


async def activate(store: PlanStore, plan: Plan) -> bool:
    """Store ``plan`` and make it active for new runs; ``False`` if it already was active."""
    await store.put_plan(plan.digest, stored_document(plan))
    if await store.get_active(plan.name) == plan.digest:
        return False
    await store.set_active(plan.name, plan.digest)
    return True


async def versions(store: PlanStore, workflow: str) -> list[Version]:
    """Activations of ``workflow``, oldest first (the last one is active)."""
    active = await store.get_active(workflow)
    history = getattr(store, "plan_versions", None)
    rows: list[dict[str, Any]] = await history(workflow) if history else []
    if not rows and active:
        rows = [{"digest": active}]
    out: list[Version] = []
    for i, row in enumerate(rows):
        plan = await load_plan(store, row["digest"])
        is_last = i == len(rows) - 1
        out.append(Version(row["digest"], plan.version, is_last, row.get("activated_at_ms")))
    return out


async def rollback(store: PlanStore, workflow: str, digest: str | None = None) -> str:
    """Activate ``digest`` (default: the version active before the current one) again."""
    known = await versions(store, workflow)
    active = known[-1].digest if known else None
    if digest is None:
        older = [v.digest for v in known if v.digest != active]
        if not older:
            raise ActivationError(
                "activation-nothing-to-roll-back", f"{workflow} has no earlier version"
            )
        digest = older[-1]
    elif digest not in {v.digest for v in known}:
        raise ActivationError(
            "activation-not-a-version", f"{digest} was never an active version of {workflow}"
        )
    plan = await load_plan(store, digest)
    if plan.name != workflow:
        raise ActivationError(
            "activation-wrong-workflow", f"{digest} is a plan of {plan.name}, not {workflow}"
        )
    if digest != active:
        await store.set_active(workflow, digest)
    return digest
