"""Schedule triggers: each tick fires exactly once across every engine, and leaves a record.

A ``schedule`` trigger of an active plan (:mod:`accord.workflow.triggers`) names a cron
expression and a timezone; its *ticks* are the nominal times cronsim gives for them (DST-correct:
a time skipped by a spring-forward fires at the first valid minute after it, a daily time in a
fall-back hour fires once, an every-N-minutes schedule fires in both copies of the hour).

**Exactly once.** For every tick an engine wants to act on it first creates the tick's *fire
record* in the store under an id derived from (workflow, trigger, nominal time), with a
create-only commit (``expected_version=0``): the compare-and-set every store adapter already
implements for run records, durable and shared by every engine (the same guarantee timers
lean on). The engine whose create wins decides the tick; every other engine finds it taken and
moves on. The run a tick starts has a deterministic id too (the tenant and the key
``schedule:<workflow>:<trigger>:<nominal ms>``, :func:`~.requests.request_run_id`), so even a
retried start names one run.

**State.** One record per schedule holds ``paused``, the ``cursor`` (the last nominal time
handled), the schedule's last run and its buffered tick (``overlap: buffer-one``). It is
updated by compare-and-set. A schedule seen for the first time starts at that moment: ticks
before it are not caught up.

**Overlap** (a tick arrives while the schedule's last run is live): ``skip`` records the tick
as skipped; ``buffer-one`` keeps it as the one buffered tick (a newer one replaces it, and the
replaced tick's record says so) and starts it once the live run ends; ``allow`` starts it
anyway; ``cancel-previous`` cancels the live run, then starts it.

**Catch-up** (ticks found late, more than ``misfire_ms`` after their nominal time, because every
engine was down or slow): ``none`` records them all as missed and fires only ticks that are on
time; ``latest`` fires the latest due tick and records the others as missed; ``all`` fires the
latest ``catch_up_limit`` due ticks in order and records the rest as missed. At most
:data:`MAX_DUE` ticks are examined in one pass; older ones are passed over by the cursor.

**A claim whose engine died.** A tick claimed but not decided within ``claim_lease_ms`` (its
engine died between claiming and deciding) is taken over by the next engine that looks at it;
until then the cursor stays before it, so it is looked at again.

**Pause and resume.** A paused schedule fires nothing; resuming moves its cursor to the moment of
resumption, so ticks that fell in the pause are not caught up.

**Fire records** say what fired, when (nominal and actual), which engine decided, which run it
started or why it started none (``skipped``: overlap, missed, replaced; ``refused``: admission's
reasons), read back with :meth:`Scheduler.fires`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from cronsim import CronSim

from accord.engine.ports import Commit, JsonDict, Store
from accord.engine.runtime.admission import (
    Admission,
    Decision,
    create_record,
    record_id,
    update_record,
)
from accord.engine.runtime.requests import request_run_id
from accord.errors import ConflictError, EngineError
from accord.workflow.plan import Plan
from accord.workflow.triggers import ScheduleTrigger, render_context, trigger_to_json

if TYPE_CHECKING:
    from accord.engine.runtime.orchestrator import Engine

__all__ = [
    "FIRE_STATUS",
    "MAX_DUE",
    "STATE_STATUS",
    "Scheduler",
    "due_ticks",
    "fire_id",
    "fire_records",
    "next_fire_times",
    "next_ticks",
    "schedule_key",
    "schedule_state",
    "set_paused",
    "state_id",
    "trigger_summary",
]

log = logging.getLogger("accord.engine.runtime.schedules")

FIRE_STATUS = "schedule-fire"
STATE_STATUS = "schedule-state"
MAX_DUE = 1_000
MISFIRE_MS = 60_000
CLAIM_LEASE_MS = 30_000  # a tick claimed but not decided for this long is taken over


def _dt(ms: int, zone: ZoneInfo) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC).astimezone(zone)


def next_ticks(trigger: ScheduleTrigger, after_ms: int, count: int) -> list[int]:
    """The next ``count`` nominal times (epoch ms) strictly after ``after_ms``."""
    zone = ZoneInfo(trigger.timezone)
    it = CronSim(trigger.cron, _dt(after_ms, zone))
    out: list[int] = []
    for _ in range(count):
        try:
            out.append(int(next(it).timestamp() * 1000))
        except StopIteration:
            break
    return out


def due_ticks(
    trigger: ScheduleTrigger, after_ms: int, now_ms: int, cap: int = MAX_DUE
) -> list[int]:
    """Nominal times in ``(after_ms, now_ms]``, the latest ``cap`` of them, ascending."""
    zone = ZoneInfo(trigger.timezone)
    it = CronSim(trigger.cron, _dt(after_ms, zone))
    out: list[int] = []
    for when in it:
        ms = int(when.timestamp() * 1000)
        if ms > now_ms:
            break
        out.append(ms)
        if len(out) > cap:
            del out[0]
    return out


def schedule_key(workflow: str, trigger: str, nominal_ms: int) -> str:
    return f"schedule:{workflow}:{trigger}:{nominal_ms}"


def state_id(workflow: str, trigger: str) -> str:
    return record_id("sst_", workflow, trigger)


def fire_id(workflow: str, trigger: str, nominal_ms: int) -> str:
    return record_id("sfr_", workflow, trigger, str(nominal_ms))


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


def _index(workflow: str, trigger: str, status: str) -> dict[str, str]:
    return {"status": status, "workflow": workflow, "trigger": trigger}


def _fresh_state(workflow: str, trigger: str, now: int) -> JsonDict:
    return {
        "kind": STATE_STATUS,
        "workflow": workflow,
        "trigger": trigger,
        "paused": False,
        "cursor": now - 1,
        "lastRun": None,
        "buffered": None,
    }


async def schedule_state(store: Store, workflow: str, trigger: str) -> JsonDict | None:
    """The state record of one schedule (``None`` until an engine or operator first saw it)."""
    stored = await store.load(state_id(workflow, trigger))
    return stored.state if stored is not None else None


async def set_paused(
    store: Store, workflow: str, trigger: str, paused: bool, now_ms: int
) -> JsonDict | None:
    """Pause or resume one schedule; resuming moves its cursor to ``now_ms`` (no catch-up of
    the ticks that fell in the pause). The state written."""
    rid = state_id(workflow, trigger)
    index = _index(workflow, trigger, STATE_STATUS)
    await create_record(store, rid, _fresh_state(workflow, trigger, now_ms), index)

    def change(cur: JsonDict | None) -> JsonDict | None:
        if cur is None:
            return None
        return {**cur, "paused": True} if paused else {**cur, "paused": False, "cursor": now_ms}

    return await update_record(store, rid, change, index)


async def fire_records(
    store: Store, workflow: str, trigger: str, limit: int = 1000
) -> list[JsonDict]:
    """The fire records of one schedule, oldest nominal time first."""
    rows = await store.list_runs(limit, status=FIRE_STATUS, workflow=workflow, trigger=trigger)
    return sorted((r.state for r in rows), key=lambda d: int(d["nominalMs"]))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class PlanSchedule:
    """One schedule trigger of an active plan."""

    plan: Plan
    trigger: ScheduleTrigger


class Scheduler:
    """Fires the schedule triggers of the active plans of ``workflows`` for one engine."""

    def __init__(
        self,
        engine: Engine,
        workflows: Sequence[str],
        *,
        admission: Admission | None = None,
        tenant: str = "default",
        misfire_ms: int = MISFIRE_MS,
        poll_ms: int = 1_000,
        claim_lease_ms: int = CLAIM_LEASE_MS,
    ) -> None:
        self.engine = engine
        self.workflows = list(workflows)
        self.admission = admission or Admission(engine)
        self.tenant = tenant
        self.misfire_ms = misfire_ms
        self.poll_ms = poll_ms
        self.claim_lease_ms = claim_lease_ms
        self._held: list[int] = []
        self.fired = 0  # ticks this engine decided
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    @property
    def store(self) -> Store:
        return self.engine.store

    @property
    def owner(self) -> str:
        return self.engine.owner

    async def schedules(self) -> list[PlanSchedule]:
        out: list[PlanSchedule] = []
        for workflow in self.workflows:
            try:
                plan = await self.engine.plans.resolve(workflow)
            except EngineError:
                continue
            out += [PlanSchedule(plan, t) for t in plan.triggers if isinstance(t, ScheduleTrigger)]
        return out

    # -- state -----------------------------------------------------------------------------

    def _index(self, workflow: str, trigger: str, status: str) -> dict[str, str]:
        return _index(workflow, trigger, status)

    async def state(self, workflow: str, trigger: str) -> JsonDict | None:
        return await schedule_state(self.store, workflow, trigger)

    async def _state(self, workflow: str, trigger: str, now: int) -> JsonDict:
        rid = state_id(workflow, trigger)
        fresh = _fresh_state(workflow, trigger, now)
        await create_record(self.store, rid, fresh, self._index(workflow, trigger, STATE_STATUS))
        got = await self.state(workflow, trigger)
        assert got is not None
        return got

    async def _set(self, workflow: str, trigger: str, **changes: Any) -> JsonDict | None:
        def change(cur: JsonDict | None) -> JsonDict | None:
            if cur is None:
                return None
            return {**cur, **changes}

        return await update_record(
            self.store,
            state_id(workflow, trigger),
            change,
            self._index(workflow, trigger, STATE_STATUS),
        )

    async def pause(self, workflow: str, trigger: str) -> JsonDict | None:
        return await set_paused(self.store, workflow, trigger, True, self.engine.clock.now_ms())

    async def resume(self, workflow: str, trigger: str) -> JsonDict | None:
        return await set_paused(self.store, workflow, trigger, False, self.engine.clock.now_ms())

    async def fires(self, workflow: str, trigger: str, limit: int = 1000) -> list[JsonDict]:
        """The fire records of one schedule, oldest nominal time first."""
        return await fire_records(self.store, workflow, trigger, limit)

    # -- one pass ----------------------------------------------------------------------------

    async def tick(self) -> int:
        """Handle every due tick of every schedule once; how many ticks this engine decided."""
        decided = 0
        for item in await self.schedules():
            decided += await self._one(item.plan, item.trigger)
        self.fired += decided
        return decided

    async def _one(self, plan: Plan, t: ScheduleTrigger) -> int:
        now = self.engine.clock.now_ms()
        st = await self._state(plan.name, t.name, now)
        if st.get("paused"):
            return 0
        decided = 0
        decided += await self._drain_buffer(plan, t, st)
        cursor = int(st["cursor"])  # type: ignore[arg-type]
        due = due_ticks(t, cursor, now)
        if not due:
            return decided
        fire = set(self._selected(t, due, now))
        self._held = []
        for nominal in due:
            if nominal in fire:
                decided += await self._fire(plan, t, nominal, now)
            else:
                why = f"missed: found {now - nominal} ms late (catch_up: {t.catch_up})"
                decided += await self._claim(
                    plan, t, nominal, now, decision="skipped", run_id=None, reason=why
                )
        # the cursor stays before a tick another engine claimed and has not decided yet, so the
        # tick is looked at again (and taken over once its claim is stale) if that engine dies
        last = min(self._held) - 1 if self._held else due[-1]

        def advance(cur: JsonDict | None) -> JsonDict | None:
            if cur is None or int(cur["cursor"]) >= last:  # type: ignore[arg-type]
                return None
            return {**cur, "cursor": last}

        await update_record(
            self.store,
            state_id(plan.name, t.name),
            advance,
            self._index(plan.name, t.name, STATE_STATUS),
        )
        return decided

    def _selected(self, t: ScheduleTrigger, due: list[int], now: int) -> list[int]:
        on_time = [d for d in due if now - d <= self.misfire_ms]
        if t.catch_up == "none":
            return on_time
        if t.catch_up == "latest":
            return due[-1:]
        return due[-t.catch_up_limit :]

    async def _claim(
        self,
        plan: Plan,
        t: ScheduleTrigger,
        nominal: int,
        now: int,
        *,
        decision: str,
        run_id: str | None,
        reason: str,
        **extra: Any,
    ) -> int:
        doc: JsonDict = {
            "kind": FIRE_STATUS,
            "workflow": plan.name,
            "trigger": t.name,
            "planDigest": plan.digest,
            "nominalMs": nominal,
            "nominal": _iso(nominal),
            "firedAtMs": now,
            "engine": self.owner,
            "decision": decision,
            "runId": run_id,
            "reason": reason,
            **extra,
        }
        won = await create_record(
            self.store,
            fire_id(plan.name, t.name, nominal),
            doc,
            self._index(plan.name, t.name, FIRE_STATUS),
        )
        return 1 if won else 0

    async def _record(self, plan: Plan, t: ScheduleTrigger, nominal: int, **changes: Any) -> None:
        def change(cur: JsonDict | None) -> JsonDict | None:
            return None if cur is None else {**cur, **changes}

        await update_record(
            self.store,
            fire_id(plan.name, t.name, nominal),
            change,
            self._index(plan.name, t.name, FIRE_STATUS),
        )

    async def _take_over(
        self, plan: Plan, t: ScheduleTrigger, nominal: int, now: int
    ) -> bool | None:
        """A tick claimed by another engine: ``None`` when it is decided, ``False`` while the
        claim is fresh, ``True`` when this engine took over a claim older than the lease (its
        engine died between claiming and deciding; the run id is the same either way)."""
        rid = fire_id(plan.name, t.name, nominal)
        stored = await self.store.load(rid)
        if stored is None or stored.state.get("decision") != "claimed":
            return None
        at = stored.state.get("firedAtMs")
        if not isinstance(at, int) or now - at <= self.claim_lease_ms:
            return False
        doc = {
            **stored.state,
            "engine": self.owner,
            "firedAtMs": now,
            "takenOverFrom": stored.state.get("engine"),
        }
        try:
            await self.store.commit(
                Commit(rid, stored.version, doc, index=self._index(plan.name, t.name, FIRE_STATUS))
            )
        except ConflictError:
            return False
        log.warning(
            "schedule %s/%s: took over the stale claim of tick %s", plan.name, t.name, _iso(nominal)
        )
        return True

    async def _live(self, run_id: object) -> bool:
        if not isinstance(run_id, str):
            return False
        run = await self.engine.load(run_id)
        return run is not None and not run.terminal

    async def _fire(self, plan: Plan, t: ScheduleTrigger, nominal: int, now: int) -> int:
        run_id = request_run_id(self.tenant, schedule_key(plan.name, t.name, nominal))
        if not await self._claim(plan, t, nominal, now, decision="claimed", run_id=None, reason=""):
            taken = await self._take_over(plan, t, nominal, now)
            if taken is not True:
                if taken is False:
                    self._held.append(nominal)
                return 0  # another engine decided this tick, or is deciding it
        st = await self.state(plan.name, t.name) or {}
        previous = st.get("lastRun")
        if await self._live(previous):
            if t.overlap == "skip":
                await self._record(
                    plan,
                    t,
                    nominal,
                    decision="skipped",
                    reason=f"overlap: run {previous} is still live (overlap: skip)",
                )
                return 1
            if t.overlap == "buffer-one":
                replaced = st.get("buffered")
                await self._set(plan.name, t.name, buffered=nominal)
                await self._record(
                    plan,
                    t,
                    nominal,
                    decision="buffered",
                    runId=run_id,
                    reason=f"overlap: waits for run {previous} (overlap: buffer-one)",
                )
                if isinstance(replaced, int) and replaced != nominal:
                    await self._record(
                        plan,
                        t,
                        replaced,
                        decision="skipped",
                        runId=None,
                        reason=f"replaced by the buffered tick {_iso(nominal)}",
                    )
                return 1
            if t.overlap == "cancel-previous":
                assert isinstance(previous, str)
                await self.engine.cancel(
                    previous,
                    f"superseded by schedule tick {_iso(nominal)}",
                    by=f"schedule:{t.name}",
                )
        decision = await self._start(plan, t, nominal, run_id)
        await self._record_decision(
            plan, t, nominal, decision, previous=previous, overlap=t.overlap
        )
        return 1

    async def _start(self, plan: Plan, t: ScheduleTrigger, nominal: int, run_id: str) -> Decision:
        decision = await self.admission.start(
            plan.name,
            render_context(t),
            self.tenant,
            requester=f"schedule:{t.name}",
            run_id=run_id,
            record={"trigger": t.name, "nominalMs": nominal},
        )
        if decision.admitted:
            await self._set(plan.name, t.name, lastRun=run_id)
        return decision

    async def _record_decision(
        self,
        plan: Plan,
        t: ScheduleTrigger,
        nominal: int,
        d: Decision,
        *,
        previous: object,
        overlap: str,
    ) -> None:
        if d.admitted:
            why = ""
            if overlap == "cancel-previous" and isinstance(previous, str):
                why = f"cancelled run {previous} first (overlap: cancel-previous)"
            await self._record(plan, t, nominal, decision="started", runId=d.run_id, reason=why)
        else:
            await self._record(
                plan,
                t,
                nominal,
                decision="refused",
                runId=None,
                reason="; ".join(f"{r.code}: {r.message}" for r in d.reasons),
                refusals=[r.as_dict() for r in d.reasons],
            )

    async def _drain_buffer(self, plan: Plan, t: ScheduleTrigger, st: JsonDict) -> int:
        nominal = st.get("buffered")
        if not isinstance(nominal, int) or await self._live(st.get("lastRun")):
            return 0
        run_id = request_run_id(self.tenant, schedule_key(plan.name, t.name, nominal))

        def take(cur: JsonDict | None) -> JsonDict | None:
            if cur is None or cur.get("buffered") != nominal:
                return None
            return {**cur, "buffered": None, "lastRun": run_id}

        taken = await update_record(
            self.store,
            state_id(plan.name, t.name),
            take,
            self._index(plan.name, t.name, STATE_STATUS),
        )
        if taken is None:
            return 0  # another engine started it
        decision = await self._start(plan, t, nominal, run_id)
        await self._record_decision(plan, t, nominal, decision, previous=None, overlap="buffer-one")
        return 0

    # -- the loop --------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._stop.clear()
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                await self.tick()
            except Exception:  # a store hiccup must not end the schedule loop
                log.exception("schedule pass failed; retrying after %d ms", self.poll_ms)
            await self.engine.clock.sleep(self.poll_ms)

    async def stop(self) -> None:
        if self._task is None:
            return
        self._stop.set()
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None


def next_fire_times(trigger: ScheduleTrigger, after_ms: int, count: int = 5) -> list[JsonDict]:
    """The next ``count`` ticks as documents: epoch ms, UTC and local ISO times."""
    zone = ZoneInfo(trigger.timezone)
    return [
        {"atMs": ms, "utc": _iso(ms), "local": _dt(ms, zone).isoformat()}
        for ms in next_ticks(trigger, after_ms, count)
    ]


async def trigger_summary(store: Store, plan: Plan, now_ms: int, count: int = 5) -> list[JsonDict]:
    """Every trigger of ``plan`` as a document; schedules with their state and next ticks."""
    out: list[JsonDict] = []
    for t in plan.triggers:
        doc: JsonDict = trigger_to_json(t)
        if isinstance(t, ScheduleTrigger):
            state = await schedule_state(store, plan.name, t.name)
            doc["paused"] = bool(state and state.get("paused"))
            doc["lastRun"] = state.get("lastRun") if state else None
            doc["buffered"] = state.get("buffered") if state else None
            doc["next"] = [] if doc["paused"] else next_fire_times(t, now_ms, count)  # type: ignore[assignment]
        out.append(doc)
    return out
