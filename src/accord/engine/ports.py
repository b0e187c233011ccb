"""Ports: every Protocol the engine shell talks to. Adapters implement them.

No connection, cursor or transaction type leaks through. Everything crossing a port is plain data
(JSON values, bytes, ints), so the same contract test suite runs over every adapter.

- :class:`Store` — durable run state. ``commit`` is the one atomic step of docs/architecture.md §4:
the
  new run record, its history entries, outbox entries and timer changes land together, or not at
  all, guarded by the record's version (compare-and-set; :class:`~accord.errors.ConflictError`
  on a lost race: the caller reloads and re-applies).
- :class:`Transport` — delivery of jobs and outcomes. Delivery is not acceptance.
- :class:`JointQueue` and :class:`JointCommit` — a transport whose queue lives in the store's own
  database offers a joint commit: the transition, the jobs it dispatches and the acknowledgement
  of the delivery that carried its event land in one transaction (:mod:`.runtime.joint`).
- :class:`Sink` — where telemetry goes (a projection, OpenTelemetry…).
- :class:`Projection` — the derived search index of durable history (docs/observability.md).
- :class:`Clock` — time in integer milliseconds since the Unix epoch.
- :class:`Shards` — single-writer ownership of runs: runs hash to a fixed number of shards
  (:func:`shard_of`), engines heartbeat into the store and hold each shard they own under a
  lease with an epoch; a :class:`Commit` made under a :class:`Fence` lands only while that lease
  is still held at that epoch (:class:`~accord.errors.OwnershipLost` otherwise), checked in the
  same atomic step as the run's version (docs/distributed.md, "Shards").
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias, runtime_checkable
from zlib import crc32

__all__ = [
    "Clock",
    "Commit",
    "DeadLetter",
    "Delivery",
    "Document",
    "FailedDocument",
    "Fence",
    "IndexOutcome",
    "JointCommit",
    "JointQueue",
    "JsonDict",
    "JsonValue",
    "OutboxEntry",
    "Projection",
    "QueueAdmin",
    "QueuedMessage",
    "SearchQuery",
    "SearchResult",
    "ShardLease",
    "Shards",
    "Sink",
    "Store",
    "StoredRun",
    "Timer",
    "Transport",
    "Waiting",
    "Withdraw",
    "shard_of",
]

JsonValue: TypeAlias = "bool | int | float | str | list[JsonValue] | dict[str, JsonValue] | None"
JsonDict: TypeAlias = "dict[str, JsonValue]"  # a JSON object, as every port carries documents


@dataclass(frozen=True, slots=True)
class StoredRun:
    run_id: str
    version: int  # grows by one per commit; 0 means "does not exist yet"
    state: JsonDict  # the machine's run record, as JSON


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """Something to publish after the commit: a job, an action invocation, a cancel request or a
    telemetry event. ``entry_id`` is deterministic, so republishing is harmless."""

    entry_id: str
    run_id: str
    topic: str  # ``job:<queue>``, ``action``, ``cancel:<queue>``, ``telemetry``
    payload: JsonDict
    created_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class Timer:
    timer_id: str  # deterministic: run, stage, attempt, kind
    run_id: str
    due_at_ms: int
    payload: JsonDict  # enough to build the TimerFired event


def shard_of(run_id: str, shard_count: int) -> int:
    """The shard a run belongs to, for ever: ``crc32(run id) mod shard_count``."""
    return crc32(run_id.encode("utf-8")) % shard_count


@dataclass(frozen=True, slots=True)
class Fence:
    """The shard lease a commit is made under: the store applies the commit only if ``shard``'s
    lease is held by ``owner`` at ``epoch`` (whatever its expiry: a lapsed lease nobody took
    changes no epoch), in the same atomic step as the version check."""

    shard: int
    owner: str
    epoch: int


@dataclass(frozen=True, slots=True)
class ShardLease:
    shard: int
    owner: str
    epoch: int  # grows by one each time the shard changes hands (or is taken back after lapsing)
    expires_at_ms: int


@dataclass(frozen=True, slots=True)
class Commit:
    run_id: str
    expected_version: int  # 0 to create
    state: JsonDict
    history: Sequence[JsonDict] = ()
    outbox: Sequence[OutboxEntry] = ()
    timers_set: Sequence[Timer] = ()
    timers_cancel: Sequence[str] = ()
    index: Mapping[str, str] = field(default_factory=dict)  # searchable columns: status, workflow…
    fence: Fence | None = None  # made by a shard's owner: refused once that lease is lost

    @property
    def new_version(self) -> int:
        return self.expected_version + 1


@runtime_checkable
class Store(Protocol):
    async def load(self, run_id: str) -> StoredRun | None: ...

    async def commit(self, commit: Commit) -> int:
        """Apply atomically if the stored version equals ``expected_version``; return the new
        version, else raise :class:`~accord.errors.ConflictError` and change nothing."""
        ...

    async def history(self, run_id: str) -> list[JsonDict]: ...

    async def claim_timers(
        self,
        now_ms: int,
        limit: int,
        owner: str,
        lease_ms: int,
        shards: Collection[int] | None = None,
    ) -> list[Timer]:
        """Lease up to ``limit`` due timers to ``owner``; a lease that lapses makes them due again.
        A timer is removed only by a commit that cancels it. ``shards``: only timers of runs in
        those shards (:func:`shard_of`); ``None``: every shard."""
        ...

    async def claim_outbox(
        self, limit: int, owner: str, lease_ms: int, shards: Collection[int] | None = None
    ) -> list[OutboxEntry]:
        """Lease up to ``limit`` pending outbox entries (of runs in ``shards``, if given)."""
        ...

    async def outbox_done(self, entry_ids: Sequence[str]) -> None: ...

    async def list_runs(self, limit: int = 100, **filters: str) -> list[StoredRun]: ...

    async def prune(self, ended_before_ms: int, limit: int) -> int:
        """Remove up to ``limit`` ended runs (status ``completed``, ``failed`` or ``cancelled``)
        whose last commit is older than ``ended_before_ms``: record, history, index entries and
        any timers or outbox entries left behind. A live run is never removed, whatever its age.
        Work is done in short steps, so a large prune never holds the store; returns how many
        runs were removed (fewer than ``limit``: nothing older is left). Idempotent."""
        ...

    # plans and capability announcements
    async def put_plan(self, digest: str, document: JsonDict) -> None:
        """Store an immutable plan; the same digest with different content is refused."""
        ...

    async def get_plan(self, digest: str) -> JsonDict | None: ...

    async def set_active(self, workflow: str, digest: str) -> None: ...

    async def get_active(self, workflow: str) -> str | None: ...

    async def announce(
        self, worker_id: str, capabilities: Sequence[str], expires_at_ms: int
    ) -> None: ...

    async def live_capabilities(self, now_ms: int) -> dict[str, list[str]]:
        """``capability ref → [worker ids]`` for announcements not yet expired."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class Shards(Protocol):
    """Engine membership and shard leases, kept in the store and on the store's clock.

    ``shard_count`` is fixed when the store is created and recorded there; opening it with
    another count is refused. Engines call :meth:`beat` and :meth:`hold_shards` every few
    seconds; ownership is decided by the engines (rendezvous hashing over :meth:`beat`'s live
    engines), the store only makes each lease exclusive and fences commits with its epoch."""

    @property
    def shard_count(self) -> int: ...

    async def beat(self, engine: str, ttl_ms: int) -> list[str]:
        """Record ``engine`` as live for ``ttl_ms``; return every live engine's id, sorted."""
        ...

    async def leave(self, engine: str) -> None:
        """``engine`` stops: it is no longer live and every lease it holds is released."""
        ...

    async def hold_shards(self, engine: str, shards: Sequence[int], ttl_ms: int) -> dict[int, int]:
        """Take or renew the lease of each of ``shards`` for ``engine`` for ``ttl_ms``; return
        ``shard → epoch`` for those it now holds. A lease held by another engine and not yet
        expired is left alone (absent from the answer). A lease ``engine`` holds unexpired is
        renewed at the same epoch; a free or expired one (even ``engine``'s own) is taken at
        a new epoch, one above the last."""
        ...

    async def release_shards(self, engine: str, shards: Sequence[int]) -> None:
        """Give up ``engine``'s leases of ``shards`` (expired at once; epochs kept)."""
        ...

    async def shard_leases(self) -> list[ShardLease]:
        """Every shard lease ever taken (expired ones too), by shard."""
        ...


@dataclass(frozen=True, slots=True)
class Delivery:
    queue: str
    message_id: str
    body: bytes
    delivery_count: int  # 1 on first delivery
    receipt: str  # opaque handle for ack/nack


@runtime_checkable
class Transport(Protocol):
    async def publish(self, queue: str, message_id: str, body: bytes, delay_ms: int = 0) -> None:
        """Enqueue; publishing the same ``message_id`` again while it is known is a no-op."""
        ...

    def consume(self, queue: str, prefetch: int = 1) -> AsyncIterator[Delivery]:
        """Deliveries from ``queue``, each leased until acked or nacked (or its lease lapses)."""
        ...

    async def ack(self, delivery: Delivery) -> None: ...

    async def nack(self, delivery: Delivery, delay_ms: int = 0) -> None:
        """Return for redelivery; past the queue's delivery limit it is dead-lettered instead."""
        ...

    async def dead_letters(self, queue: str) -> list[Delivery]: ...

    async def close(self) -> None: ...


@runtime_checkable
class Withdraw(Protocol):
    """A transport that can take back a job nobody has taken yet (BullMQ, the queue tables).
    The dispatcher withdraws the job of every attempt the engine fences, so a superseded job is
    not delivered at all; a broker that cannot remove a message from the middle of a queue
    (RabbitMQ) leaves it to the worker, which checks its attempt is current before running it."""

    async def withdraw(self, queue: str, message_id: str) -> bool:
        """Remove ``message_id`` from ``queue`` if it is waiting or delayed; a job a consumer
        holds, one already settled, or an unknown id is left alone. Whether it was withdrawn."""
        ...


class Clock(Protocol):
    def now_ms(self) -> int: ...

    async def sleep(self, ms: int) -> None: ...


@dataclass(frozen=True, slots=True)
class QueuedMessage:
    """A message a joint commit puts in the queue inside its own transaction."""

    queue: str
    message_id: str
    body: bytes


class JointCommit(Protocol):
    """A store and a queue that share one database, committing together."""

    async def commit(
        self,
        commit: Commit,
        messages: Sequence[QueuedMessage],
        acked: Sequence[Delivery],
        *,
        durable: bool,
    ) -> int:
        """:meth:`Store.commit`, with ``messages`` enqueued and ``acked`` settled in the same
        transaction; then wakes the queues' consumers and releases the acknowledged deliveries.
        ``durable=False`` lets the commit skip its own fsync (see :mod:`.runtime.joint`)."""
        ...


@runtime_checkable
class JointQueue(Protocol):
    """A transport that can share a store's transaction."""

    def joint_commit(self, store: Store) -> JointCommit | None:
        """The joint commit with ``store``, or ``None`` when they do not share a database."""
        ...


class Sink(Protocol):
    """Where telemetry goes (a projection, OpenTelemetry…). Failures are retried via the sweep."""

    async def emit(self, events: Sequence[Mapping[str, JsonValue]]) -> None: ...


# -- the search projection (docs/observability.md) ---------------------------------------------


@dataclass(frozen=True, slots=True)
class Document:
    """One document of the search projection: a run (``kind`` ``run``, ``doc_id`` the run id) or
    one history entry (``kind`` ``event``, ``doc_id`` ``<run id>/<seq>``). ``seq`` guards the
    upsert: a document is replaced only by one with a higher ``seq``, so a redelivered or
    reordered event never regresses it. ``body`` is plain JSON with no payload in it."""

    doc_id: str
    kind: str  # run | event
    run_id: str
    tenant: str
    seq: int
    body: JsonDict


@dataclass(frozen=True, slots=True)
class IndexOutcome:
    """The item-level outcome of a bulk upsert: ``indexed``, ``unchanged`` (the stored document
    is as new or newer) or ``failed`` with ``error``."""

    doc_id: str
    status: str
    error: str = ""


@dataclass(frozen=True, slots=True)
class SearchQuery:
    """A parsed search; empty fields match everything. ``since_ms``/``until_ms`` bound the run's
    last update; ``text`` is full-text over the run document's words."""

    tenants: tuple[str, ...] | None = None  # None: every tenant; () matches nothing
    workflow: str = ""
    version: str = ""  # plan digest prefix
    status: str = ""
    stage: str = ""
    stage_status: str = ""
    intent: str = ""
    trigger: str = ""
    requester: str = ""
    run_id: str = ""
    since_ms: int | None = None
    until_ms: int | None = None
    text: str = ""
    limit: int = 50
    # keyset paging: only runs after this ``(updated_at_ms, run_id)`` in the result order (newest
    # update first, then run id); ``total`` and the facets still count the whole match
    after: tuple[int, str] | None = None


@dataclass(frozen=True, slots=True)
class SearchResult:
    runs: list[JsonDict]  # run document bodies, newest update first
    total: int  # matches before ``limit``
    # ``status``, ``version`` (``workflow@digest``), ``failed_stage``, ``failure_class``, ``tenant``
    facets: dict[str, dict[str, int]]
    indexed_through_ms: int  # event time of the newest event applied (0: none yet)
    projected_at_ms: int  # when the projector last wrote (0: never)


@dataclass(frozen=True, slots=True)
class FailedDocument:
    """A document the projector could not index after its retries: kept for an operator."""

    doc_id: str
    run_id: str
    error: str
    attempts: int
    failed_at_ms: int


@runtime_checkable
class Projection(Protocol):
    """A derived, searchable index of durable history; never the source of run state."""

    async def upsert(self, documents: Sequence[Document], now_ms: int) -> list[IndexOutcome]:
        """Bulk upsert, one outcome per document in order, each guarded by ``seq``; an error
        reaching the index at all raises a retryable :class:`~accord.errors.StoreError`."""
        ...

    async def get(self, doc_id: str) -> Document | None: ...

    async def documents(self, run_id: str) -> list[Document]:
        """The run's document and its event documents, by ``doc_id``."""
        ...

    async def search(self, query: SearchQuery) -> SearchResult: ...

    async def run_ids(self, limit: int = 1000, after: str = "") -> list[str]:
        """Run ids with a run document, in id order after ``after``."""
        ...

    async def record_failures(self, failures: Sequence[FailedDocument]) -> None: ...

    async def failures(self, limit: int = 1000) -> list[FailedDocument]: ...

    async def clear_failures(self, doc_ids: Sequence[str]) -> None: ...

    async def mark(self, indexed_through_ms: int, now_ms: int) -> None:
        """Record how far the projection has got (the newest event time applied)."""
        ...

    async def reset(self) -> None:
        """Remove every document, failure and mark (before a rebuild)."""
        ...

    async def close(self) -> None: ...


# -- operating on what was refused -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Waiting:
    """A message waiting on a queue, as an operator reads it without consuming it."""

    queue: str
    message_id: str
    body: bytes
    delivery_count: int  # deliveries made so far (0: never delivered)
    published_at_ms: int  # 0 when the broker does not say


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message past its queue's delivery limit (or unreadable at the broker), kept for an
    operator: never dropped, never delivered again unless redriven."""

    queue: str
    message_id: str
    body: bytes
    delivery_count: int
    reason: str
    dead_at_ms: int


@runtime_checkable
class QueueAdmin(Protocol):
    """Operator access to a transport's queues: the quarantine queues nobody consumes and the
    dead letters, read without consuming anything and acted on by message id. A queue the
    broker cannot tell exists reads as empty."""

    async def queue_names(self) -> list[str] | None:
        """Queues holding messages or dead letters, or ``None`` when the broker cannot list
        its queues (the caller then names them)."""
        ...

    async def waiting(self, queue: str, limit: int = 1000) -> list[Waiting]:
        """Up to ``limit`` messages waiting on ``queue``, oldest first; none is consumed."""
        ...

    async def remove(self, queue: str, message_ids: Sequence[str]) -> list[str]:
        """Remove the waiting messages with these ids; return the ids removed."""
        ...

    async def dead_letter_records(self, queue: str) -> list[DeadLetter]:
        """The dead letters of ``queue``, oldest first (non-destructive)."""
        ...

    async def redrive_dead(self, queue: str, message_ids: Sequence[str]) -> list[str]:
        """Put these dead letters back on ``queue`` with a fresh delivery count, each out of
        the dead letters only once it is back (never lost, at worst delivered twice); return
        the ids redriven."""
        ...
