"""Compiled plans as the engine sees them: stored immutably by digest, parsed once per process.

A run is pinned to the digest it started with, so a plan is looked up by digest on every
transition; parsing and digest-checking the stored document each time would dominate the hot
path, hence the in-process cache (plans never change under a digest, so it never goes stale).
Activation decides which digest new runs of a workflow get; running runs are unaffected.
"""

from __future__ import annotations

from accord.engine.ports import Store
from accord.errors import EngineError
from accord.workflow.plan import Plan

__all__ = ["PlanBook"]


class PlanBook:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._plans: dict[str, Plan] = {}

    async def register(self, plan: Plan, *, activate: bool = True) -> str:
        await self._store.put_plan(plan.digest, plan.to_json())
        if activate:
            await self._store.set_active(plan.name, plan.digest)
        self._plans[plan.digest] = plan
        return plan.digest

    async def get(self, digest: str) -> Plan:
        plan = self._plans.get(digest)
        if plan is None:
            doc = await self._store.get_plan(digest)
            if doc is None:
                raise EngineError(f"plan {digest} is not stored")
            plan = self._plans[digest] = Plan.from_json(doc)
        return plan

    async def resolve(self, workflow: str) -> Plan:
        """A plan by digest (``sha256:…``) or the active plan of a workflow name."""
        digest = (
            workflow if workflow.startswith("sha256:") else await self._store.get_active(workflow)
        )
        if digest is None:
            raise EngineError(f"workflow {workflow!r} has no active plan")
        return await self.get(digest)
