"""The reconciler: compares durable run state with the outbox, the timers and the queues, and
repairs what a crash can leave behind. It runs at startup and then periodically.

What it does, and why each is safe to do twice:

- **Stranded outbox entries** (the engine died between commit and publish, or between publish
  and marking done) are claimed with a lease and handed to the dispatcher again. Job ids are
  deterministic, so a republish is a no-op at the transport (I4, I7).
- **Missing deadlines.** The store has no "list timers" call, so a missing timer shows as an
  active attempt whose persisted deadline passed more than a lease (plus slack) ago: a live timer
  would have fired and moved the attempt on by then. The timer is written again with the same
  deterministic id (an upsert), due now (I6).
- **Poison.** A job the transport dead-lettered while the run still thinks its attempt is live
  is reported to the run as ``PoisonReported``; the machine quarantines the attempt with the
  metadata needed to re-drive it.
- **Divergence** it cannot repair (an active attempt with no deadline at all, a running run with
  nothing active and no intent) is reported, never papered over.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from accord.engine.machine.events import Event, PoisonReported
from accord.engine.machine.ids import timer_id
from accord.engine.machine.state import ACTIVE_ATTEMPT, RunState
from accord.engine.ports import Clock, Commit, Fence, Store, Timer, Transport
from accord.engine.runtime.dispatcher import Dispatcher
from accord.engine.runtime.runcache import RunCache
from accord.errors import ConflictError, OwnershipLost
from accord.workflow.plan import Plan, TaskStage

__all__ = ["Divergence", "ReconcileReport", "Reconciler"]


@dataclass(frozen=True, slots=True)
class Divergence:
    run_id: str
    stage: str
    kind: str  # missing-deadline | dead-lettered | no-deadline | stuck
    detail: str = ""


@dataclass(slots=True)
class ReconcileReport:
    republished: int = 0
    rearmed: int = 0
    poisoned: int = 0
    runs_checked: int = 0
    divergences: list[Divergence] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "republished": self.republished,
            "rearmed": self.rearmed,
            "poisoned": self.poisoned,
            "runs_checked": self.runs_checked,
            "divergences": [
                {"run_id": d.run_id, "stage": d.stage, "kind": d.kind, "detail": d.detail}
                for d in self.divergences
            ],
        }


class Reconciler:
    def __init__(
        self,
        store: Store,
        transport: Transport,
        clock: Clock,
        deliver: Callable[[Event], Awaitable[object]],
        *,
        dispatcher: Dispatcher,
        runs: RunCache,
        plans: Callable[[str], Awaitable[Plan]],
        lease_ms: int = 30_000,
        slack_ms: int = 5_000,
        page: int = 1000,
    ) -> None:
        self._store, self._transport, self._clock = store, transport, clock
        self._deliver, self._dispatcher, self._runs = deliver, dispatcher, runs
        self._plans = plans
        self._overdue_ms = lease_ms + slack_ms
        self._page = page
        self.owns: Callable[[str], bool] = lambda _run_id: True  # this engine's runs
        self.fence: Callable[[str], Fence | None] = lambda _run_id: None  # their commits' fence

    async def run_once(self) -> ReconcileReport:
        report = ReconcileReport()
        while True:
            handed = await self._dispatcher.sweep()
            report.republished += handed
            if handed == 0:
                break
        runs = [
            RunState.from_json(s.state)
            for status in ("running", "finalising")
            for s in await self._store.list_runs(self._page, status=status)
            if self.owns(s.run_id)  # another engine's shard: its owner reconciles it
        ]
        report.runs_checked = len(runs)
        dead = await self._dead_jobs(runs)
        now = self._clock.now_ms()
        for run in runs:
            await self._check(run, now, dead, report)
        return report

    async def _dead_jobs(self, runs: Sequence[RunState]) -> dict[str, int]:
        queues: set[str] = set()
        for run in runs:
            plan = await self._plans(run.plan_digest)
            for name, stage in run.stages.items():
                if stage.status in ("queued", "running") and plan.has_stage(name):
                    spec = plan.stage(name)
                    if isinstance(spec, TaskStage) and spec.queue:
                        queues.add(spec.queue)
        dead: dict[str, int] = {}
        for queue in sorted(queues):
            for delivery in await self._transport.dead_letters(queue):
                dead[delivery.message_id] = delivery.delivery_count
        return dead

    async def _check(
        self, run: RunState, now: int, dead: dict[str, int], report: ReconcileReport
    ) -> None:
        active = False
        for stage in run.stages.values():
            current = stage.current
            if stage.status in ("retry-scheduled", "waiting"):  # waiting: an approval gate
                active = True
            if current is None or current.status not in ACTIVE_ATTEMPT:
                continue
            active = True
            if current.job_id in dead:
                await self._deliver(
                    PoisonReported(
                        run_id=run.run_id,
                        stage=stage.name,
                        attempt=current.attempt,
                        fence=current.fence,
                        reason="dead-lettered",
                        delivery_count=dead[current.job_id],
                    )
                )
                report.poisoned += 1
                report.divergences.append(Divergence(run.run_id, stage.name, "dead-lettered"))
                continue
            if current.deadline_at_ms is None:
                report.divergences.append(Divergence(run.run_id, stage.name, "no-deadline"))
                continue
            if now - current.deadline_at_ms > self._overdue_ms:
                kind = "execution" if current.status == "running" else "queue"
                timer = Timer(
                    timer_id(run.run_id, stage.name, current.attempt, kind),
                    run.run_id,
                    now,
                    {
                        "timer": kind,
                        "stage": stage.name,
                        "attempt": current.attempt,
                        "fence": current.fence,
                    },
                )
                if await self.rearm(run.run_id, [timer]):
                    report.rearmed += 1
                    report.divergences.append(
                        Divergence(run.run_id, stage.name, "missing-deadline", kind)
                    )
        if not active and run.status == "running" and run.intent is None:
            report.divergences.append(Divergence(run.run_id, "", "stuck", "nothing active"))

    async def rearm(self, run_id: str, timers: Sequence[Timer]) -> bool:
        """Write ``timers`` again (same ids: an upsert) in a commit that leaves the record as it
        is; only the version moves. False if the run is gone, terminal, or moved on meanwhile."""
        async with self._runs.lock(run_id):
            self._runs.forget(run_id)
            stored = await self._store.load(run_id)
            if stored is None or RunState.from_json(stored.state).terminal:
                return False
            commit = Commit(
                run_id, stored.version, stored.state, timers_set=tuple(timers),
                fence=self.fence(run_id),
            )  # fmt: skip
            try:
                await self._store.commit(commit)
            except (ConflictError, OwnershipLost):
                return False  # the next reconciliation looks again
            return True
