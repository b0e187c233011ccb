"""The engine shell: load, decide, persist, hand off.

:class:`Engine` is the only place where the pure machine meets I/O. One delivery is::

    stamp(event)                    at_ms from the clock, fresh entropy (fences, jitter)
    run = load(run_id)              from a small version-tagged cache, else the store
    t = machine.apply(plan, run, e) pure: the next record, effects, history entries
    store.commit(...)               record + history + outbox + timers, one atomic CAS step
    dispatcher.dispatch(outbox)     hand off; the sweep covers us if we die right here

A lost compare-and-set (another engine process, or a stale cache) reloads and re-applies, a
bounded number of times. The shell makes no domain decision: rejections (stale, duplicate, late)
come back from the machine as history to commit like any other. Deliveries for one run in this
process keep their arrival order, so contention only comes from other processes; when several
are waiting at once (an ``accepted`` and its ``succeeded``, two joining branches) they are
applied in that order and committed together, once (:mod:`accord.engine.runtime.coalesce`). While
other deliveries are in flight, news of an attempt (``accepted``, a heartbeat, progress) waits up to
``accept_linger_ms`` (5 ms) for its run's next event to share the commit.

Nothing poisons a commit: a coalesced commit that cannot be stored is made again one member at
a time, and only the member that cannot be stored is refused (intake quarantines it). Refused
callbacks are recorded at most :data:`REFUSALS_RECORDED` times per attempt (:class:`RefusalBook`).
:meth:`start_run` refuses an unsafe tenant and a context its plan's contract rejects.

**Shards.** The engine owns the shards :class:`~accord.engine.runtime.shards.ShardKeeper` holds
leases of: it reads their outcome queues (jobs name them as ``replyTo``), claims their timers
and stranded outbox entries, reconciles their runs, and commits their runs under the lease's
fence. A run whose shard it does not own is still committed when an event for it reaches this
engine directly (a run request's start, an operator's cancel through this process), unfenced:
the run's version decides, as before shards existed. A refused fenced commit
(:class:`~accord.errors.OwnershipLost`) drops the shard and its cached runs, and the delivery
goes back unacknowledged to the new owner.

The loops (:meth:`start`) are the dispatcher's sweep and done-mark flush, the timer service,
outcome intake, run requests (``run-requested@1`` on ``accord.runs``, :mod:`.requests`),
telemetry, the reconciler, and history retention (ended runs older than ``retention_ms`` are
pruned, :mod:`.retention`). :meth:`stop` stops intake and timers first,
waits for in-flight deliveries and actions, flushes, and closes the ports it owns. The engine
never imports an adapter: :func:`accord.adapters.open_engine` opens the ports from URLs.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from accord.contracts.sealing import Keyring
from accord.contracts.validate import Validator
from accord.engine import machine
from accord.engine.machine import ids
from accord.engine.machine.effects import Effect
from accord.engine.machine.events import (
    CALLBACKS,
    CancelRequested,
    Event,
    HeartbeatReceived,
    ProgressReported,
    RedriveRequested,
    RunStarted,
    StageAccepted,
    StageSucceeded,
    TimerFired,
)
from accord.engine.machine.state import HistoryEntry, RunState
from accord.engine.ports import (
    Clock,
    Delivery,
    JointCommit,
    JointQueue,
    JsonValue,
    QueuedMessage,
    Sink,
    Store,
    Transport,
)
from accord.engine.runtime import canary
from accord.engine.runtime.actions import ActionExecutor, ActionHandler, ActionRegistry
from accord.engine.runtime.capabilities import Capabilities
from accord.engine.runtime.checks import MessageCatalog, ResultHook, run_result_checks
from accord.engine.runtime.coalesce import Failed, Mailboxes
from accord.engine.runtime.dispatcher import Dispatcher, check_in_jobs
from accord.engine.runtime.holding import HOLD_MS, Hold
from accord.engine.runtime.intake import OUTCOMES_QUEUE, Intake, RefusedOutcome
from accord.engine.runtime.joint import durable, split_outbox
from accord.engine.runtime.lifecycle import Loops
from accord.engine.runtime.outbox import (
    build_commit,
    changed_index,
    with_reply_to,
    without_telemetry,
)
from accord.engine.runtime.plans import PlanBook
from accord.engine.runtime.reconciler import Reconciler, ReconcileReport
from accord.engine.runtime.requests import RUNS_QUEUE, RunRequests
from accord.engine.runtime.retention import DEFAULT_RETENTION_MS, Retention
from accord.engine.runtime.runcache import RunCache
from accord.engine.runtime.sealed import seal_context, seal_result
from accord.engine.runtime.shards import ShardKeeper
from accord.engine.runtime.stamping import stamp
from accord.engine.runtime.timers import TimerService
from accord.engine.runtime.wire import MalformedOutcome, check_storable
from accord.errors import (
    ConflictError,
    Diagnostic,
    EngineError,
    FieldViolation,
    OwnershipLost,
    StoreError,
    ValidationError,
)
from accord.objects.ports import ObjectStore
from accord.workflow.plan import Plan

__all__ = ["Delivered", "Engine", "EngineOptions", "Observer"]

log = logging.getLogger("accord.engine")


@dataclass(frozen=True, slots=True)
class Delivered:
    """What one delivery did: the committed record (``None`` if no run exists) and its outputs."""

    run_id: str
    version: int
    run: RunState | None
    effects: tuple[Effect, ...]
    history: tuple[HistoryEntry, ...]
    unrecorded: str = ""  # a refusal past the per-attempt limit: why, and nothing was recorded


Observer = Callable[[Delivered], None]  # told of every committed transition, in commit order
_Item = tuple[Event, tuple[Delivery, ...]]  # an event and the deliveries its commit may settle
_NEWS = (StageAccepted, HeartbeatReceived, ProgressReported)
_CALLBACK_KINDS = frozenset(c.kind for c in CALLBACKS)
TENANT_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")  # in full; within envelope@1's
REFUSALS_RECORDED = 20  # refused callbacks recorded per attempt; the rest are counted


class RefusalBook:
    """How many refused callbacks each attempt has in its run's history, so that at most
    ``limit`` are recorded per attempt (forged stale outcomes cannot grow a history without
    bound). The count is read from the stored history the first time a run's refusal is seen,
    then kept; a refusal past the limit is not recorded and changes nothing (a refusal changes
    nothing but ``seq`` anyway), so the history still replays to the record exactly (I12).
    ``unrecorded`` counts those, and intake quarantines them, so nothing is lost."""

    def __init__(self, store: Store, limit: int = REFUSALS_RECORDED, runs: int = 4096) -> None:
        self._store, self.limit, self._runs = store, limit, runs
        self._counts: dict[str, dict[tuple[str, int], int]] = {}
        self.unrecorded = 0

    @staticmethod
    def _key(run: RunState, stage: str) -> tuple[str, int]:
        st = run.stages.get(stage)
        return ("", 0) if st is None else (stage, st.attempt)

    async def admit(self, run: RunState, stage: str) -> bool:
        """Whether one more refusal for ``stage``'s current attempt is recorded (counted so)."""
        counts = self._counts.get(run.run_id)
        if counts is None:
            counts = await self._seed(run)
        key = self._key(run, stage)
        seen = counts.get(key, 0)
        if seen >= self.limit:
            self.unrecorded += 1
            return False
        counts[key] = seen + 1
        return True

    def forget(self, run_id: str) -> None:
        """The commit that counted did not land: count again from the history next time."""
        self._counts.pop(run_id, None)

    async def _seed(self, run: RunState) -> dict[tuple[str, int], int]:
        if len(self._counts) >= self._runs:
            self._counts.clear()
        counts: dict[tuple[str, int], int] = {}
        for doc in await self._store.history(run.run_id):
            event, seq = doc.get("event"), doc.get("seq")
            if doc.get("accepted") or not isinstance(event, dict) or not isinstance(seq, int):
                continue
            if event.get("kind") not in _CALLBACK_KINDS:
                continue
            stage = str(event.get("stage", ""))
            st = run.stages.get(stage)
            if st is not None and st.current is not None and seq <= st.current.caused_by:
                continue  # refused before the current attempt was dispatched
            key = self._key(run, stage)
            counts[key] = counts.get(key, 0) + 1
        self._counts[run.run_id] = counts
        return counts


class _Unstorable(Exception):
    """A commit canonical JSON cannot encode (its ``__cause__`` says why)."""


def _in_shards(keeper: ShardKeeper, shards: frozenset[int], run_id: str) -> bool:
    return keeper.shard(run_id) in shards


def _may_wait(item: _Item) -> bool:
    """Whether an event may wait a little for its run's next one to share its commit: news of an
    attempt (accepted, heartbeat, progress) releases nothing and dispatches nothing."""
    return isinstance(item[0], _NEWS)


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """The engine's tuning knobs, fixed for the life of an :class:`Engine`."""

    owner: str | None = None  # names this process in leases; default: ``engine-<random>``
    outcomes_queue: str = OUTCOMES_QUEUE
    runs_queue: str = RUNS_QUEUE  # run-requested@1 messages (accord.engine.runtime.requests)
    lease_ms: int = 30_000  # outbox and timer claims
    shard_lease_ms: int = 10_000  # a shard's lease: an engine gone this long loses its shards
    shard_beat_ms: int | None = None  # beats and lease renewals (default: a quarter lease)
    grace_ms: int = 5_000  # an outbox entry younger than this is left to the process that wrote it
    poll_ms: int = 50
    reconcile_every_ms: int = 10_000
    crash_at: str | None = None  # a crash point for fault tests (``ACCORD_CRASH_AT``)
    conflict_retries: int = 32  # lost compare-and-sets before a delivery gives up
    cache_size: int = 4096  # runs kept in the version-tagged cache
    dispatch: bool = True  # False: leave the outbox to the engine processes' sweep
    accept_linger_ms: float = 5.0  # news of an attempt waits this long to share a commit
    store_hold_ms: int = HOLD_MS  # a store outage is ridden out in place this long
    # ended runs with no commit for this long are removed, history and all (retention.py);
    # None or 0 keeps them for ever
    retention_ms: int | None = DEFAULT_RETENTION_MS
    prune_every_ms: int = 3_600_000  # how often the retention loop runs
    canary_every_ms: int = 5_000  # how often running canaries are settled (canary.Keeper); 0: off
    # share of runs whose trace is kept, decided once at start and recorded on the run (its jobs'
    # traceparent flags); None: as the process's tracing says (open_engine), else all
    trace_sample: float | None = None

    def __post_init__(self) -> None:
        for name in ("lease_ms", "grace_ms", "poll_ms", "reconcile_every_ms", "store_hold_ms",
                     "prune_every_ms", "canary_every_ms", "shard_lease_ms"):  # fmt: skip
            if getattr(self, name) < 0:
                raise ValueError(f"EngineOptions.{name} must not be negative")
        if self.retention_ms is not None and self.retention_ms < 0:
            raise ValueError("EngineOptions.retention_ms must not be negative (None: for ever)")
        if self.conflict_retries < 1 or self.cache_size < 1:
            raise ValueError("EngineOptions: conflict_retries and cache_size must be at least 1")
        if self.trace_sample is not None and not 0.0 <= self.trace_sample <= 1.0:
            raise ValueError("EngineOptions.trace_sample must be a ratio from 0 to 1 (or None)")


class Engine:
    def __init__(
        self,
        store: Store,
        transport: Transport,
        clock: Clock,
        options: EngineOptions | None = None,
        *,
        actions: ActionRegistry | Mapping[str, ActionHandler] | None = None,
        sink: Sink | None = None,
        result_checks: Sequence[ResultHook] = (),
        observers: Sequence[Observer] = (),
        owns_ports: bool = False,
        catalog: MessageCatalog | None = None,
        sealing: Keyring | None = None,
        claims: ObjectStore | None = None,
    ) -> None:
        opts = self.options = options or EngineOptions()
        self.store, self.transport, self.clock = store, transport, clock
        # outcomes (and actions' outcomes) whose commit met a store outage are made again in
        # place for up to store_hold_ms before they are given back (accord.engine.runtime.holding)
        self.hold = Hold(opts.store_hold_ms)
        self.owner = opts.owner or f"engine-{secrets.token_hex(4)}"
        self.registry = actions if isinstance(actions, ActionRegistry) else ActionRegistry(actions)
        self._owns_ports = owns_ports
        self._retries = opts.conflict_retries
        self.observers: list[Observer] = list(observers)
        self._dispatch = opts.dispatch  # False: leave the outbox to the engine processes' sweep
        # a queue in the store's own database takes jobs and acks inside the commit (joint.py)
        self._joint: JointCommit | None = None
        if opts.dispatch and isinstance(transport, JointQueue):
            self._joint = transport.joint_commit(store)
        self.plans = PlanBook(store)
        self.runs = RunCache(opts.cache_size)
        self.shards = ShardKeeper(
            store, clock, self.owner, base_queue=opts.outcomes_queue,
            lease_ms=opts.shard_lease_ms, beat_ms=opts.shard_beat_ms,
        )  # fmt: skip
        self.shards.listeners.append(self._on_shards)
        self.mail: Mailboxes[_Item, tuple[Delivered, bool]] = Mailboxes(
            self.runs.lock,
            may_wait=_may_wait,
            linger_s=opts.accept_linger_ms / 1000,
            busy=lambda: self._inflight > 1,
        )
        self.capabilities = Capabilities(store, clock, self.registry, self.owner)
        self.executor = ActionExecutor(self.registry, self.deliver, self._action_done, self.hold)
        self.dispatcher = Dispatcher(
            store, transport, clock, self.executor, sink, owner=self.owner,
            lease_ms=opts.lease_ms, grace_ms=opts.grace_ms, crash_at=opts.crash_at,
        )  # fmt: skip
        # large job payloads travel as payloadRef, checked in here (dispatcher.check_in_jobs)
        self.claims = self.dispatcher.claims = claims
        self.dispatcher.shards = self.shards.claim_shards
        self.timers = TimerService(
            store, clock, self.deliver, owner=self.owner, lease_ms=opts.lease_ms,
            poll_ms=opts.poll_ms, shards=self.shards.claim_shards,
        )  # fmt: skip
        self.intake = Intake(
            transport, self._deliver_outcome, queue=opts.outcomes_queue, hold=self.hold
        )
        self.intake.claims = claims
        self.intake.route = self._route
        self.result_checks = list(result_checks)
        # where a plan's context contract is looked up (start_run validates the context with it)
        self.catalog = catalog
        # sensitive fields are sealed at rest with this ring (accord.engine.runtime.sealed) and
        # opened only where the engine binds an action's inputs
        self.sealing = self.executor.keyring = sealing
        # any process starts a run by publishing run-requested@1 on runs_queue (requests.py)
        self.requests = RunRequests(self, transport, queue=opts.runs_queue, hold=self.hold)
        if catalog is not None:  # quarantine records mask what these contracts mark sensitive
            self.intake.contracts = self.requests.contracts = catalog.messages()
        self.refusals = RefusalBook(store)
        self.reconciler = Reconciler(
            store, transport, clock, self.deliver, dispatcher=self.dispatcher, runs=self.runs,
            plans=self.plan, lease_ms=opts.lease_ms,
        )  # fmt: skip
        self.reconciler.owns, self.reconciler.fence = self.shards.owns, self.shards.fence
        self.canaries = canary.Keeper(store, clock, owner=self.owner)  # settles canaries
        self.loops = Loops(
            dispatcher=self.dispatcher, timers=self.timers, intake=self.intake,
            executor=self.executor, reconcile=self.reconcile, quiesce=self._idle_wait,
            poll_ms=opts.poll_ms, reconcile_every_ms=opts.reconcile_every_ms,
            canaries=self.canaries.run_once, canary_every_ms=opts.canary_every_ms,
        )  # fmt: skip
        self.retention = (
            Retention(store, clock, opts.retention_ms, every_ms=opts.prune_every_ms)
            if opts.retention_ms
            else None
        )  # started with the loops (start), stopped first (stop)
        self._retention_stop = asyncio.Event()
        self._retention_task: asyncio.Task[None] | None = None
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.transitions = 0  # events committed (several may share one commit)
        self.commits = 0
        self.conflicts = 0
        self.ownership_lost = 0  # fenced commits refused: the shard had changed hands
        self._intake_on = False  # whether this engine takes outcomes and run requests
        self._taking = False  # the shared queue and run requests are being consumed

    # -- plans -----------------------------------------------------------------------------

    async def register_plan(self, plan: Plan, *, activate: bool = True) -> str:
        return await self.plans.register(plan, activate=activate)

    async def plan(self, digest: str) -> Plan:
        return await self.plans.get(digest)

    # -- the one path every event takes ----------------------------------------------------

    async def start_run(
        self,
        workflow: str,
        context: Mapping[str, JsonValue] | None = None,
        tenant: str = "default",
        run_id: str | None = None,
        requested_by: str = "",
    ) -> str:
        """Start a run of ``workflow`` (a name, using its active plan, or a plan digest).

        Refused with :class:`~accord.errors.ValidationError`, creating nothing, when ``tenant``
        is not a safe id (:data:`TENANT_PATTERN`) or ``context`` is not a JSON object canonical
        JSON can store that satisfies the plan's context contract (looked up in ``catalog``; a
        plan that names one the catalog lacks is refused too). The run's context is the one the
        contract's check gives back: its defaults applied where a field is missing, so that a
        binding the compiler accepted for a field with a default finds it. ``requested_by``
        names who asked (a principal, a requester), recorded on the run for approval gates'
        ``exclude_requester``.

        The low-level primitive: it makes no admission decision (plan budgets, live workers,
        owner). :class:`~accord.engine.runtime.admission.Admission` is the layer above it, and
        every entry point (triggers, ``POST /v1/runs``, run requests, ``accord runs start``)
        goes through it (docs/triggers.md §5)."""
        rid = run_id or self._new_run_id()
        chosen, admission = await canary.admit(self.store, workflow, rid)  # a canary's share
        self.canaries.note(workflow, admission)
        plan = await self.plans.resolve(chosen or workflow)
        checked = self._check_start(plan, tenant, context)
        ratio = self.options.trace_sample
        await self.deliver(
            RunStarted(
                run_id=rid,
                tenant=tenant,
                workflow=plan.name,
                plan_digest=plan.digest,
                context=seal_context(self.catalog, plan, checked, self.sealing),
                contracts=dict(plan.contracts),
                requested_by=requested_by[:128],
                admission=admission,
                sampled=ratio is None or ids.trace_sampled(rid, ratio),
            )
        )
        return rid

    def _new_run_id(self) -> str:
        """A fresh run id in a shard this engine owns (when it owns any), so the run is started,
        and then moved on, by its owner: no other engine ever commits it."""
        rid = f"run_{secrets.token_hex(12)}"
        keeper = self.shards
        if keeper.count > 1 and keeper.owned:
            while keeper.shard(rid) not in keeper.owned:
                rid = f"run_{secrets.token_hex(12)}"
        return rid

    async def check_start(
        self, workflow: str, context: Mapping[str, JsonValue] | None, tenant: str
    ) -> Plan:
        """The plan :meth:`start_run` would start, after the checks it would make (raising what
        it would raise), starting nothing: for requesters that want the answer first."""
        plan = await self.plans.resolve(workflow)
        self._check_start(plan, tenant, context)
        return plan

    def _check_start(self, plan: Plan, tenant: Any, context: Any) -> dict[str, JsonValue]:
        """The context a run of ``plan`` starts with (defaults applied), or the refusal."""
        where = f"start of {plan.name}"
        if not isinstance(tenant, str) or not TENANT_PATTERN.fullmatch(tenant):
            why = f"tenant {tenant!r} must match {TENANT_PATTERN.pattern}"
            raise ValidationError(where, [FieldViolation("tenant", why)])
        if context is not None and not isinstance(context, Mapping):
            raise ValidationError(where, [FieldViolation("context", "must be a JSON object")])
        doc = dict(context or {})
        try:
            check_storable(doc, "context")
        except MalformedOutcome as exc:
            raise ValidationError(where, [FieldViolation("context", str(exc))]) from None
        ref = plan.context_contract
        if ref is None or self.catalog is None:
            return doc
        contract = self.catalog.message(ref)
        if contract is None:
            why = f"context contract {ref} is not in the catalog"
            raise ValidationError(where, [FieldViolation("context", why)])
        result = Validator.for_contract(contract).validate(doc)
        if not result.ok:
            raise ValidationError(f"{where}: context contract {ref}", result.violations)
        return dict(result.value)

    async def cancel(self, run_id: str, reason: str = "", by: str = "operator") -> Delivered:
        return await self.deliver(CancelRequested(run_id=run_id, reason=reason, by=by))

    async def redrive(self, run_id: str, stage: str, by: str = "operator") -> Delivered:
        return await self.deliver(RedriveRequested(run_id=run_id, stage=stage, by=by))

    def stamp(self, event: Event) -> Event:
        return stamp(event, self.clock.now_ms())

    async def deliver(self, event: Event) -> Delivered:
        """Load → apply → commit → hand off, for one event (see the module docstring)."""
        return (await self._deliver(event, ()))[0]

    async def _deliver(self, event: Event, acked: Sequence[Delivery]) -> tuple[Delivered, bool]:
        event = self.stamp(event)
        self._inflight += 1
        self._idle.clear()
        try:  # a fired timer names the one timer its commit removes: it never shares a commit
            alone = isinstance(event, TimerFired)
            return await self.mail.submit(
                event.run_id, (event, tuple(acked)), self._deliver_batch, alone=alone
            )
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()

    async def _deliver_batch(self, items: list[_Item]) -> list[tuple[Delivered, bool] | Failed]:
        """Apply one run's events in order and commit them once (see :mod:`.coalesce`); each
        item's delivery and whether the commit also acknowledged its ``acked`` (joint commits).

        A commit that cannot be stored (canonical JSON refuses something an event carried) never
        sinks the events that shared it: they are committed one by one, and only the one that
        cannot be stored fails, with :class:`RefusedOutcome` (intake quarantines it)."""
        try:
            return list(await self._commit_batch(items))
        except _Unstorable as exc:
            if len(items) == 1:
                raise RefusedOutcome(f"cannot be stored: {exc.__cause__}") from exc.__cause__
        log.warning("run %s: a coalesced commit cannot be stored; committing one by one",
                    items[0][0].run_id)  # fmt: skip
        out: list[tuple[Delivered, bool] | Failed] = []
        for item in items:
            try:
                out.extend(await self._deliver_batch([item]))
            except RefusedOutcome as refused:
                out.append(Failed(refused))
        return out

    async def _commit_batch(self, items: list[_Item]) -> list[tuple[Delivered, bool]]:
        run_id = items[0][0].run_id
        fired = items[0][0].timer_id if isinstance(items[0][0], TimerFired) else None
        for attempt in range(self._retries):
            if attempt == 0 and isinstance(items[0][0], RunStarted) and not self.runs.get(run_id):
                version, run = 0, None  # a new run: the create-only commit checks that it is
            else:
                version, run = await self._current(run_id, fresh=attempt > 0)
            current = run
            applied: list[tuple[RunState | None, tuple[Effect, ...], tuple[HistoryEntry, ...]]] = []
            unrecorded: dict[int, str] = {}  # refusals past the per-attempt limit
            for item_event, _ in items:
                event = item_event
                digest = current.plan_digest if current else getattr(event, "plan_digest", "")
                if not digest:  # no such run
                    applied.append((None, (), ()))
                    continue
                plan = await self.plan(digest)
                if current is not None and self.result_checks and isinstance(event, StageSucceeded):
                    event = run_result_checks(self.result_checks, plan, current, event)
                if self.sealing is not None and isinstance(event, StageSucceeded):
                    event = seal_result(self.catalog, plan, event, self.sealing)
                t = machine.apply(plan, current, event)
                if (
                    current is not None
                    and isinstance(event, CALLBACKS)
                    and not t.history[0].accepted
                    and not await self.refusals.admit(current, event.stage)
                ):
                    entry = t.history[0]
                    unrecorded[len(applied)] = (
                        f"refused ({entry.reason}: {entry.note}) past the "
                        f"{self.refusals.limit} refusals recorded for this attempt of "
                        f"stage {event.stage!r}"
                    )
                    applied.append((None, (), ()))
                    continue
                current = t.run if t.run is not None else current
                applied.append((t.run, tuple(t.effects), tuple(t.history)))
            effects = [e for _, done, _ in applied for e in done]
            history = [h for _, _, hist in applied for h in hist]
            if current is None or (not history and not effects and fired is None):
                return [
                    (Delivered(run_id, version, after or run, done, hist, unrecorded.get(i, "")),
                     False)
                    for i, (after, done, hist) in enumerate(applied)
                ]  # fmt: skip
            new = current
            try:
                state = new.encoded()
            except (ValueError, TypeError) as exc:  # NaN, a lone surrogate: never storable
                raise _Unstorable from exc
            commit = build_commit(
                run_id,
                expected_version=version,
                state=state,
                history=[h.to_json() for h in history],
                effects=effects,
                now_ms=self.clock.now_ms(),
                index=changed_index(run, new),
                fired_timer=fired,
            )
            fence = self.shards.fence(run_id)
            if fence is not None:
                commit = replace(commit, fence=fence)
            reply = self.shards.reply_to(run_id)
            if reply is not None:
                commit = with_reply_to(commit, reply)
            if self._dispatch and not self.dispatcher.has_sink:
                # nobody here would read them: the dispatcher would mark them done unseen
                commit = without_telemetry(commit)
            if self.claims is not None:
                commit = await check_in_jobs(commit, self.claims)
            messages: list[QueuedMessage] = []
            try:
                if self._joint is None:
                    new_version = await self.store.commit(commit)
                else:  # the store shares the queue's database: see accord.engine.runtime.joint
                    acked = [  # an unrecorded refusal is quarantined, and acknowledged, by intake
                        d
                        for i, (_, item_acked) in enumerate(items)
                        if i not in unrecorded
                        for d in item_acked
                    ]
                    commit, messages = split_outbox(commit)
                    new_version = await self._joint.commit(
                        commit, messages, acked,
                        durable=new.terminal or durable(commit, messages, acked),
                    )  # fmt: skip  # an end is always synced: readers act on it
            except OwnershipLost as lost:  # nothing landed; the new owner takes the delivery
                self.ownership_lost += 1
                self.runs.forget(run_id)
                self.refusals.forget(run_id)
                self.shards.lost(lost.shard, lost.epoch)
                raise
            except ConflictError:
                self.conflicts += 1
                self.runs.forget(run_id)
                self.refusals.forget(run_id)
                continue
            except (ValueError, TypeError) as exc:  # the store could not encode the history
                self.refusals.forget(run_id)
                raise _Unstorable from exc
            except StoreError as exc:  # the store's own rules refused to encode it
                self.refusals.forget(run_id)
                if exc.retryable or not isinstance(exc.__cause__, ValueError | TypeError):
                    raise
                raise _Unstorable from exc.__cause__
            except BaseException:
                self.refusals.forget(run_id)
                raise
            self.commits += 1
            self.transitions += sum(1 for _, done, hist in applied if done or hist)
            if self.shards.owns(run_id):  # another owner's run: it moves on elsewhere
                self.runs.remember(run_id, new_version, new)
            if self._dispatch:
                await self.dispatcher.dispatch(commit.outbox, inline=len(messages))
            out = []
            joint = self._joint is not None
            for i, ((_, item_acked), (after, done, hist)) in enumerate(
                zip(items, applied, strict=True)
            ):
                delivered = Delivered(
                    run_id, new_version, after or new, done, hist, unrecorded.get(i, "")
                )
                for observe in self.observers:
                    observe(delivered)
                out.append((delivered, joint and bool(item_acked) and i not in unrecorded))
            return out
        raise EngineError(f"run {run_id}: gave up after {self._retries} conflicting commits")

    async def _current(self, run_id: str, *, fresh: bool) -> tuple[int, RunState | None]:
        cached = None if fresh else self.runs.get(run_id)
        if cached is not None:
            return cached
        stored = await self.store.load(run_id)
        if stored is None:
            return 0, None
        run = RunState.from_json(stored.state)
        if self.shards.owns(run_id):
            self.runs.remember(run_id, stored.version, run)
        return stored.version, run

    async def _deliver_outcome(
        self, event: Event, delivery: Delivery | None, tenant: str = ""
    ) -> bool | None:
        """For intake: ``None`` if no run took it, else whether the commit acknowledged
        ``delivery`` (never when there is none to settle: a batch member's). An outcome naming
        another tenant than its run's is refused (:class:`RefusedOutcome`) before the machine
        sees it, whatever its fence: it never changes the run. A run never changes tenant, so
        the cached record answers."""
        if tenant:
            _, run = await self._current(event.run_id, fresh=False)
            if run is not None and run.tenant != tenant:
                raise RefusedOutcome(
                    f"outcome names tenant {tenant!r} but run {event.run_id!r} belongs to "
                    f"tenant {run.tenant!r}"
                )
        joint = (delivery,) if self._joint is not None and delivery is not None else ()
        done, acked = await self._deliver(event, joint)
        if done.unrecorded:  # kept on the quarantine queue instead of the run's history
            raise RefusedOutcome(done.unrecorded)
        return None if done.run is None else acked

    async def _idle_wait(self) -> None:
        await self._idle.wait()

    # -- shards (see accord.engine.runtime.shards) -----------------------------------------

    def _route(self, run_id: str) -> str | None:
        """For intake: None when this engine takes ``run_id``'s outcomes, else the queue of the
        engine that owns its shard."""
        keeper = self.shards
        return None if keeper.owns(run_id) else keeper.queue(keeper.shard(run_id))

    async def _on_shards(self, gained: frozenset[int], lost: frozenset[int]) -> None:
        """Read the outcome queues of the shards gained; stop reading those lost (their
        deliveries in hand finish first) and forget their cached runs. While it owns anything,
        the engine also reads the shared outcome queue and run requests."""
        keeper = self.shards
        shared = self.intake.queue
        for shard in sorted(lost):
            queue = keeper.queue(shard)
            if queue != shared:
                await self.intake.close_lane(queue)
        # a lost shard's runs move on elsewhere; what is cached of a gained one (from before the
        # engine started) is older than its last owner's commits
        if lost or gained:
            self.runs.forget_where(partial(_in_shards, keeper, lost | gained))
        if not keeper.owned:
            await self._stop_taking()
        if not self._intake_on:
            return
        for shard in sorted(gained):
            queue = keeper.queue(shard)
            if queue != shared and shard in keeper.owned:
                self.intake.open_lane(queue)
        if keeper.owned and not self._taking:
            self._taking = True
            self.intake.start()
            self.requests.start()

    async def _stop_taking(self) -> None:
        if self._taking:
            self._taking = False
            await self.requests.stop()
            await self.intake.stop()

    def _action_done(self, entry_id: str) -> None:
        self.dispatcher.mark_done(entry_id)

    # -- reading ---------------------------------------------------------------------------

    async def load(self, run_id: str) -> RunState | None:
        stored = await self.store.load(run_id)
        return RunState.from_json(stored.state) if stored else None

    async def history(self, run_id: str) -> list[HistoryEntry]:
        return [HistoryEntry.from_json(h) for h in await self.store.history(run_id)]

    # -- capabilities ----------------------------------------------------------------------

    async def announce(self, worker_id: str, capabilities: Sequence[str], ttl_ms: int) -> None:
        await self.capabilities.announce(worker_id, capabilities, ttl_ms)

    async def live_capabilities(self) -> dict[str, list[str]]:
        return await self.capabilities.live()

    async def admit(self, plan: Plan) -> list[Diagnostic]:
        """The compiler's admission check against what is live now (workers and actions)."""
        return await self.capabilities.admit(plan)

    # -- loops (see :mod:`accord.engine.runtime.lifecycle`)
    # -----------------------------------------

    async def reconcile(self) -> ReconcileReport:
        return await self.reconciler.run_once()

    async def pump(self) -> int:
        """One pass of the background work, for callers that drive the engine by hand."""
        fired = await self.timers.fire_due()
        handed = await self.dispatcher.sweep()
        await self.dispatcher.flush()
        return fired + handed

    async def start(self, *, intake: bool = True, reconcile_first: bool = True) -> None:
        """Take this engine's shards (a store that does not answer refuses the start), run the
        first reconciliation of their runs, then take outcomes and run requests for them."""
        self._intake_on = False
        await self.shards.step()
        await self.loops.start(intake=False, reconcile_first=reconcile_first)
        self._intake_on = intake  # run requests are intake too: taken only where outcomes are
        await self._on_shards(frozenset(self.shards.owned), frozenset())
        self.shards.start()
        if self.retention is not None and self._retention_task is None:
            self._retention_stop.clear()
            run = self.retention.run(self._retention_stop)
            self._retention_task = asyncio.get_running_loop().create_task(run)

    async def stop(self) -> None:
        """Stop the loops, finish in-flight deliveries and actions, flush, close owned ports."""
        if self._retention_task is not None:
            self._retention_stop.set()
            await asyncio.gather(self._retention_task, return_exceptions=True)
            self._retention_task = None
        self._intake_on = False
        await self.intake.close_lanes()  # no new outcomes or runs, then the loops stop as before
        await self._stop_taking()
        await self.loops.stop()
        await self.shards.stop(leave=True)  # the others take its shards at once
        if self._owns_ports:
            await self.transport.close()
            await self.store.close()

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
