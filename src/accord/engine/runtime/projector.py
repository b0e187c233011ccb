"""The projector: keeps the search projection (:class:`~accord.engine.ports.Projection`) in step
with durable history. docs/observability.md, "Projection and search".

It is a :class:`~accord.engine.ports.Sink`. Every accepted transition commits telemetry events to
the outbox; the dispatcher hands them over in batches, and the projector turns the runs they name
into documents read from the store itself (the run record and its history), never from the event
payloads. So the live projection and one rebuilt from the store (:func:`rebuild`) are built by
the same function from the same data and give the same documents.

- **Documents.** One per run (``doc_id`` the run id; workflow, plan digest, tenant, status,
  terminal intent, stage statuses and times, failure classes, late/stale/duplicate counts,
  trigger, requester) and one per history entry (``<run id>/<seq>``). Both are built from an
  allow-list of structural fields: no context, request, result, error message or note enters a
  document, so no field a contract marks ``sensitive`` (nor any value it held) can.
- **Guarded upserts.** A run document carries the store version it was read at, an event
  document its history ``seq``; the projection replaces a document only with a higher one, so a
  redelivered, duplicated or reordered batch never regresses it.
- **Batches and backpressure.** :meth:`Projector.emit` indexes before it returns, in bulk
  requests of at most ``batch`` documents. The dispatcher's telemetry queue is bounded: while the
  projection is slow it fills, entries stay in the outbox and the sweep offers them later.
- **Retries with backoff.** A bulk request that cannot reach the index is retried ``retries``
  times with doubling delays; if it still fails, ``emit`` raises and the outbox keeps the events.
  Items the index refuses one by one are retried the same way, then written to the failure
  destination (:meth:`~accord.engine.ports.Projection.failures`): visible, counted
  (``failed``) and re-driven by :meth:`Projector.redrive`.
- **Coalescing.** A run's events in one batch cost one read of the run and one run document.
  ``linger_ms`` (100 in ``accord engine run`` and ``accord serve``) is the least time from one
  batch to the next: the dispatcher gathers what comes meanwhile, so under load a run's several
  transitions are indexed together, for at most that much more lag.
- **Lag.** :attr:`Projector.lag_ms` is the age of the newest event of the last batch when it
  was indexed; the projection's mark says how far it has got, and search results report it.
- **Commits with no telemetry.** Most transitions write telemetry events, but some commits of an
  ended run write none: a duplicate run request, a stale timer or any other refusal the machine
  records without an event. They still change the run's record (its version, its refusal
  counts), and nothing would bring them to the sink. The projector is therefore also an engine
  observer (:meth:`Projector.__call__`): a committed transition of an ended run that carries no
  telemetry event has its run indexed again ``linger_ms`` later (several coalesce into one
  read), without a rebuild. The run's ``ended_at_ms`` and ``duration_ms`` are those of its last
  accepted entry, so a late report counts as late without moving the end.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from accord.engine.machine.effects import EmitTelemetry
from accord.engine.machine.state import RUN_STATUSES, RUN_TERMINAL
from accord.engine.ports import (
    Clock,
    Document,
    FailedDocument,
    IndexOutcome,
    JsonDict,
    JsonValue,
    Projection,
    SearchQuery,
    Store,
    StoredRun,
)
from accord.errors import StoreError

__all__ = [
    "Divergence",
    "ProjectionStats",
    "Projector",
    "documents_for",
    "event_document",
    "is_run",
    "parse_query",
    "rebuild",
    "run_document",
    "verify",
]

log = logging.getLogger("accord.engine.runtime.projector")

_STAGE_FAILED = frozenset({"failed", "timed-out", "quarantined", "cancelled"})
_REFUSALS = ("late", "stale", "duplicate")
_READS = 32  # store reads in flight at once
_SEEN_MAX = 100_000  # live runs whose indexed history length is remembered


# -- documents ---------------------------------------------------------------------------------


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _trigger(requested_by: str) -> str:
    """``trigger:<name>``, ``schedule:<name>``, ``webhook:<name>`` → their kind; a principal or
    nothing → ``request``."""
    kind, sep, _ = requested_by.partition(":")
    return kind if sep and kind in ("trigger", "schedule", "webhook", "message") else "request"


def _stage_doc(stage: Mapping[str, Any]) -> JsonDict:
    attempts = stage.get("attempts") or []
    first = attempts[0] if attempts else {}
    last = attempts[-1] if attempts else {}
    error = stage.get("error") or {}
    doc: JsonDict = {
        "status": str(stage.get("status", "pending")),
        "kind": str(stage.get("kind", "")),
        "attempt": int(stage.get("attempt", 0)),
        "dispatched_at_ms": first.get("dispatched_at_ms"),
        "finished_at_ms": last.get("finished_at_ms"),
    }
    if isinstance(error, Mapping) and error.get("code"):
        doc["error_code"] = str(error["code"])
    return doc


def run_document(
    stored: StoredRun, history: Sequence[Mapping[str, Any]], plan_version: str = ""
) -> Document:
    """The run's document, from its record, its history and its plan's version (pure; no
    payload is read)."""
    state = stored.state
    stages_raw = state.get("stages") or {}
    assert isinstance(stages_raw, dict)
    stages = {name: _stage_doc(s) for name, s in sorted(stages_raw.items()) if isinstance(s, dict)}
    failed = sorted(n for n, s in stages.items() if s["status"] in _STAGE_FAILED)
    classes = sorted({str(s["error_code"]) for s in stages.values() if "error_code" in s})
    run_error = state.get("error")
    if isinstance(run_error, dict) and run_error.get("code"):
        classes = sorted(set(classes) | {str(run_error["code"])})
    counts: dict[str, JsonValue] = {r: 0 for r in _REFUSALS}
    refused = 0
    for entry in history:
        if not entry.get("accepted", True):
            refused += 1
            reason = str(entry.get("reason") or "")
            if reason in _REFUSALS:
                counts[reason] = _int(counts[reason]) + 1
    counts["refused"] = refused
    counts["events"] = len(history)
    status = str(state.get("status", "running"))
    started = _int(state.get("started_at_ms") or 0)
    updated = max([int(e.get("at_ms", 0)) for e in history] or [started])
    # a run ends with its last accepted entry: refusals recorded later do not move the end
    ended = max([int(e.get("at_ms", 0)) for e in history if e.get("accepted", True)] or [updated])
    requested_by = str(state.get("requested_by") or "")
    digest = str(state.get("plan_digest", ""))
    workflow = str(state.get("workflow", ""))
    body: JsonDict = {
        "kind": "run",
        "run_id": stored.run_id,
        "tenant": str(state.get("tenant", "")),
        "workflow": workflow,
        "plan_digest": digest,
        "version": plan_version,
        "workflow_version": f"{workflow}@{plan_version or digest[:19]}",
        "status": status,
        "intent": state.get("intent"),
        "trigger": _trigger(requested_by),
        "requester": requested_by,
        "stages": stages,  # type: ignore[dict-item]
        "failed_stages": failed,  # type: ignore[dict-item]
        "failure_classes": classes,  # type: ignore[dict-item]
        "counts": counts,
        "started_at_ms": started,
        "updated_at_ms": updated,
        "ended_at_ms": ended if status in RUN_TERMINAL else None,
        "duration_ms": (ended - started) if status in RUN_TERMINAL else None,
        "seq": stored.version,
    }
    return Document(stored.run_id, "run", stored.run_id, str(body["tenant"]), stored.version, body)


def event_document(run_id: str, tenant: str, entry: Mapping[str, Any]) -> Document:
    """One history entry's document: what happened, to which stage and attempt, and whether it
    was accepted (the event's payload, result, error message and note are left out)."""
    event = entry.get("event") or {}
    seq = int(entry.get("seq", 0))
    body: JsonDict = {
        "kind": "event",
        "run_id": run_id,
        "tenant": tenant,
        "seq": seq,
        "at_ms": int(entry.get("at_ms", 0)),
        "type": str(event.get("kind", "")),
        "stage": str(event.get("stage", "")),
        "attempt": int(event.get("attempt", 0) or 0),
        "accepted": bool(entry.get("accepted", True)),
        "reason": entry.get("reason"),
    }
    timer = event.get("timer")
    if isinstance(timer, str):
        body["timer"] = timer
    error = event.get("error")
    if isinstance(error, Mapping) and error.get("code"):
        body["error_code"] = str(error["code"])
    return Document(f"{run_id}/{seq}", "event", run_id, tenant, seq, body)


def is_run(stored: StoredRun) -> bool:
    """Whether a store record is a run (a schedule's fire or an admission refusal is not)."""
    return stored.state.get("status") in RUN_STATUSES and isinstance(
        stored.state.get("stages"), dict
    )


def documents_for(
    stored: StoredRun, history: Sequence[Mapping[str, Any]], plan_version: str = ""
) -> list[Document]:
    run = run_document(stored, history, plan_version)
    return [run, *(event_document(stored.run_id, run.tenant, e) for e in history)]


# -- the projector -----------------------------------------------------------------------------


@dataclass(slots=True)
class ProjectionStats:
    """Counters a metrics exporter reads (all monotonic but ``lag_ms`` and ``indexed_through``)."""

    events: int = 0  # telemetry events received
    batches: int = 0  # bulk requests made
    indexed: int = 0  # documents written
    unchanged: int = 0  # documents the guard kept (as new or newer already)
    failed: int = 0  # documents sent to the failure destination
    retries: int = 0  # bulk requests or items tried again
    lag_ms: int = 0
    indexed_through_ms: int = 0

    def as_json(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__slots__}


@dataclass(slots=True)
class Projector:
    """The projection's :class:`~accord.engine.ports.Sink` (see the module docstring)."""

    store: Store
    projection: Projection
    clock: Clock
    batch: int = 500
    retries: int = 4
    backoff_ms: int = 50
    linger_ms: int = 0  # least time from one batch to the next (see "Coalescing")
    stats: ProjectionStats = field(default_factory=ProjectionStats)
    _seen: dict[str, int] = field(default_factory=dict)  # run id → history entries projected
    _versions: dict[str, str] = field(default_factory=dict)  # plan digest → workflow version
    _untold: set[str] = field(default_factory=set)  # ended runs committed to with no telemetry
    _telling: asyncio.Task[None] | None = None

    @property
    def lag_ms(self) -> int:
        return self.stats.lag_ms

    def __call__(self, done: Any) -> None:
        """The engine observer (see "Commits with no telemetry"): ``done`` is a
        :class:`~accord.engine.runtime.orchestrator.Delivered`."""
        run = done.run
        if not done.history or run is None or not run.terminal:
            return
        if any(isinstance(effect, EmitTelemetry) for effect in done.effects):
            return  # the sink hears of this commit through the outbox
        self._untold.add(done.run_id)
        if self._telling is None or self._telling.done():
            self._telling = asyncio.get_running_loop().create_task(self._tell())

    async def _tell(self) -> None:
        while self._untold:
            await self.clock.sleep(max(self.linger_ms, 1))  # gather what commits meanwhile
            runs, self._untold = sorted(self._untold), set()
            try:
                await self.project(runs, incremental=True)
            except Exception:  # the index away: keep them for the next commit to retry
                self._untold.update(runs)
                log.warning("projection of %d run(s) committed without telemetry failed",
                            len(runs), exc_info=True)  # fmt: skip
                return

    async def drain(self) -> None:
        """Wait for the runs :meth:`__call__` noted to be indexed (before closing)."""
        if self._telling is not None and not self._telling.done():
            await self._telling

    async def emit(self, events: Sequence[Mapping[str, JsonValue]]) -> None:
        began = self.clock.now_ms()
        await self._emit(events)
        rest = self.linger_ms - (self.clock.now_ms() - began)
        if rest > 0:  # meanwhile the dispatcher gathers the next batch
            await self.clock.sleep(rest)

    async def _emit(self, events: Sequence[Mapping[str, JsonValue]]) -> None:
        self.stats.events += len(events)
        runs = list(dict.fromkeys(str(e.get("run_id", "")) for e in events if e.get("run_id")))
        newest = max((_int(e.get("at_ms")) for e in events), default=0)
        await self.project(runs, incremental=True)
        now = self.clock.now_ms()
        if newest:
            self.stats.lag_ms = max(0, now - newest)
            self.stats.indexed_through_ms = max(self.stats.indexed_through_ms, newest)
        await self._retrying(lambda: self.projection.mark(self.stats.indexed_through_ms, now))

    async def project(self, run_ids: Sequence[str], *, incremental: bool = False) -> int:
        """Read these runs from the store and index their documents; how many were indexed."""
        docs: list[Document] = []
        seen: dict[str, int | None] = {}
        for stored, history in await self._read(run_ids):
            run_id = stored.run_id
            run = run_document(stored, history, await self.plan_version(stored))
            # events this process indexed already need not be built and sent again
            done = self._seen.get(run_id, 0) if incremental else 0
            docs.append(run)
            docs.extend(event_document(run_id, run.tenant, e) for e in history[done:])
            if incremental:
                ended = stored.state.get("status") in RUN_TERMINAL
                seen[run_id] = None if ended else len(history)
        before = self.stats.indexed
        for start in range(0, len(docs), self.batch):
            await self._bulk(docs[start : start + self.batch])
        if len(self._seen) > _SEEN_MAX:  # forgetting costs only a resend the guard absorbs
            self._seen.clear()
        for run_id, count in seen.items():  # only once indexed (or kept as failures)
            if count is None:
                self._seen.pop(run_id, None)
            else:
                self._seen[run_id] = count
        return self.stats.indexed - before

    async def _read(self, run_ids: Sequence[str]) -> list[tuple[StoredRun, list[JsonDict]]]:
        """The runs and their histories, read ``_READS`` at a time: the store's reads queue up
        behind each other instead of each waiting for the one before to come back."""

        async def one(run_id: str) -> tuple[StoredRun, list[JsonDict]] | None:
            stored = await self.store.load(run_id)
            if stored is None or not is_run(stored):
                return None  # pruned since (its documents go with the next rebuild), or no run
            return stored, await self.store.history(run_id)

        out: list[tuple[StoredRun, list[JsonDict]]] = []
        for start in range(0, len(run_ids), _READS):
            chunk = run_ids[start : start + _READS]
            out.extend(r for r in await asyncio.gather(*map(one, chunk)) if r is not None)
        return out

    async def plan_version(self, stored: StoredRun) -> str:
        """The ``version`` of the run's plan (read once per digest; plans are immutable)."""
        digest = str(stored.state.get("plan_digest", ""))
        if digest not in self._versions:
            plan = await self.store.get_plan(digest) if digest else None
            version = plan.get("version") if plan else None
            self._versions[digest] = version if isinstance(version, str) else ""
        return self._versions[digest]

    async def _bulk(self, docs: Sequence[Document]) -> None:
        pending = list(docs)
        errors: dict[str, str] = {}
        for attempt in range(self.retries + 1):
            now = self.clock.now_ms()
            outcomes = await self._retrying(
                lambda batch=pending, now=now: self.projection.upsert(batch, now)
            )
            self.stats.batches += 1
            retry: list[Document] = []
            for doc, outcome in zip(pending, outcomes, strict=True):
                self._count(outcome)
                if outcome.status == "failed":
                    errors[doc.doc_id] = outcome.error
                    retry.append(doc)
            if not retry:
                return
            pending = retry
            if attempt < self.retries:
                self.stats.retries += len(retry)
                await self.clock.sleep(self.backoff_ms * 2**attempt)
        now = self.clock.now_ms()
        failures = [
            FailedDocument(d.doc_id, d.run_id, errors[d.doc_id], self.retries + 1, now)
            for d in pending
        ]
        self.stats.failed += len(failures)
        log.warning("projection refused %d document(s); kept as failures", len(failures))
        await self._retrying(lambda: self.projection.record_failures(failures))

    def _count(self, outcome: IndexOutcome) -> None:
        if outcome.status == "indexed":
            self.stats.indexed += 1
        elif outcome.status == "unchanged":
            self.stats.unchanged += 1

    async def _retrying(self, call: Any) -> Any:
        """``call()`` with retries and doubling backoff while the index cannot be reached."""
        for attempt in range(self.retries + 1):
            try:
                return await call()
            except StoreError as exc:
                if not exc.retryable or attempt == self.retries:
                    raise
                self.stats.retries += 1
                await self.clock.sleep(self.backoff_ms * 2**attempt)
        raise AssertionError("unreachable")

    async def redrive(self, limit: int = 1000) -> tuple[int, int]:
        """Index the runs of recorded failures again; ``(re-driven, still failing)``."""
        failed = await self.projection.failures(limit)
        if not failed:
            return 0, 0
        await self.projection.clear_failures([f.doc_id for f in failed])
        before = self.stats.failed
        await self.project(list(dict.fromkeys(f.run_id for f in failed)))
        return len(failed), self.stats.failed - before


# -- rebuild and verify ------------------------------------------------------------------------


async def rebuild(store: Store, projector: Projector, *, limit: int = 10_000_000) -> int:
    """Replace the projection with documents rebuilt from every run in the store."""
    await projector.projection.reset()
    runs = [r for r in await store.list_runs(limit=limit) if is_run(r)]
    newest = 0
    ids: list[str] = []
    for stored in runs:
        ids.append(stored.run_id)
    for start in range(0, len(ids), 100):
        await projector.project(ids[start : start + 100])
    for stored in runs:
        history = await store.history(stored.run_id)
        newest = max([newest, *(_int(e.get("at_ms")) for e in history)])
    projector.stats.indexed_through_ms = newest
    await projector.projection.mark(newest, projector.clock.now_ms())
    return len(ids)


@dataclass(frozen=True, slots=True)
class Divergence:
    run_id: str
    problem: str  # missing | stale | different | extra
    detail: str = ""

    def as_json(self) -> JsonDict:
        return {"run_id": self.run_id, "problem": self.problem, "detail": self.detail}


async def verify(
    store: Store, projector: Projector, *, sample: int | None = None
) -> tuple[int, list[Divergence]]:
    """Compare the projection with documents built from the store: every run, or the ``sample``
    most recent ones. Returns (runs checked, divergences)."""
    projection = projector.projection
    listed = await store.list_runs(limit=sample if sample is not None else 10_000_000)
    runs = [r for r in listed if is_run(r)]
    found: list[Divergence] = []
    for stored in runs:
        history = await store.history(stored.run_id)
        built = documents_for(stored, history, await projector.plan_version(stored))
        expected = {d.doc_id: d for d in built}
        actual = {d.doc_id: d for d in await projection.documents(stored.run_id)}
        run = actual.get(stored.run_id)
        if run is None:
            found.append(Divergence(stored.run_id, "missing", "no run document"))
            continue
        if run.seq < stored.version:
            found.append(
                Divergence(stored.run_id, "stale", f"version {run.seq} < {stored.version}")
            )
            continue
        wrong = sorted(
            i for i, d in expected.items() if i not in actual or actual[i].body != d.body
        )
        extra = sorted(set(actual) - set(expected))
        if wrong or extra:
            found.append(Divergence(stored.run_id, "different", ", ".join([*wrong, *extra][:5])))
    if sample is None:
        known = {r.run_id for r in runs}
        after = ""
        while batch := await projection.run_ids(1000, after):
            found.extend(
                Divergence(r, "extra", "not in the store") for r in batch if r not in known
            )
            after = batch[-1]
    return len(runs), found


# -- the query language ------------------------------------------------------------------------

_TERM = re.compile(r"(?:(?P<key>[a-z_]+):)?(?P<value>\"[^\"]*\"|\S+)")
_DURATION = re.compile(r"(?P<n>\d+)(?P<unit>ms|s|m|h|d|w)\Z")
_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
KEYS = (
    "workflow", "version", "status", "stage", "intent", "trigger", "requester", "tenant", "run",
    "since", "until",
)  # fmt: skip


def _duration(key: str, value: str) -> int:
    m = _DURATION.match(value)
    if m is None:
        raise ValueError(f"{key}:{value}: expected a duration such as 90s, 15m, 1h, 7d")
    return int(m["n"]) * _UNITS[m["unit"]]


def parse_query(
    text: str, now_ms: int, *, tenants: tuple[str, ...] | None = None, limit: int = 50
) -> SearchQuery:
    """``workflow:model-ingest status:failed stage:publish tenant:acme since:1h`` → a query.
    ``tenants`` (when not ``None``) confines the search to those tenants: a ``tenant:`` term
    outside them matches nothing. ``ValueError`` names the offending term."""
    fields: dict[str, Any] = {}
    words: list[str] = []
    tenant: str | None = None
    for m in _TERM.finditer(text):
        key, value = m["key"], m["value"].strip('"')
        if key is None:
            words.append(value)
            continue
        if key not in KEYS:
            raise ValueError(f"{key}:{value}: unknown key {key!r}; known: {', '.join(KEYS)}")
        if not value:
            raise ValueError(f"{key}: needs a value")
        if key in fields or (key == "tenant" and tenant is not None):
            raise ValueError(f"{key}:{value}: {key} given twice")
        if key == "since":
            fields["since_ms"] = now_ms - _duration(key, value)
        elif key == "until":
            fields["until_ms"] = now_ms - _duration(key, value)
        elif key == "tenant":
            tenant = value
        elif key == "run":
            fields["run_id"] = value
        elif key == "stage":
            name, _, status = value.partition("=")
            fields["stage"], fields["stage_status"] = name, status
        elif key == "workflow" and "@" in value:
            fields["workflow"], _, fields["version"] = value.partition("@")
        else:
            fields[key] = value
    scope = tenants
    if tenant is not None:
        scope = (tenant,) if tenants is None or tenant in tenants else ()
    if fields.get("stage") and not fields.get("stage_status") and fields.get("status") == "failed":
        fields["stage_status"] = "failed"  # "failed in publish": the run failed, there
    return SearchQuery(tenants=scope, text=" ".join(words), limit=limit, **fields)
