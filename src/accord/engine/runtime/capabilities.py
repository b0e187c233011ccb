"""The capability registry: who can run what, right now.

Workers announce the capabilities they serve (``name@version``) with a time to live and renew
the announcement as a heartbeat; the store keeps them and answers which are live. The
compiler's admission check (:func:`accord.workflow.admission.admit`) then runs against that
answer plus the actions this engine process has registered in-process, so a plan is admitted only
when every capability version it pins has somebody to run it.
"""

from __future__ import annotations

from collections.abc import Sequence

from accord.engine.ports import Clock, Store
from accord.engine.runtime.actions import ActionRegistry
from accord.errors import Diagnostic
from accord.workflow.admission import admit
from accord.workflow.plan import Plan

__all__ = ["Capabilities"]


class Capabilities:
    def __init__(self, store: Store, clock: Clock, actions: ActionRegistry, owner: str) -> None:
        self._store, self._clock, self._actions, self._owner = store, clock, actions, owner

    async def announce(self, worker_id: str, capabilities: Sequence[str], ttl_ms: int) -> None:
        await self._store.announce(worker_id, list(capabilities), self._clock.now_ms() + ttl_ms)

    async def live(self) -> dict[str, list[str]]:
        return await self._store.live_capabilities(self._clock.now_ms())

    async def admit(self, plan: Plan) -> list[Diagnostic]:
        """Findings that stop ``plan`` from running now; empty means admitted."""
        live = await self.live()
        for capability in self._actions.capabilities():
            live.setdefault(capability, []).append(self._owner)
        return admit(plan, live)
