"""The dispatcher: hands committed outbox entries to where they go, then marks them done (I7).

Two paths feed it. The fast path: right after a commit the orchestrator passes the new entries
straight in, so a hop costs no polling delay. The sweep: entries nobody finished (the engine died
between commit and publish, or between publish and marking done) are claimed from the store with
a lease and handed over again once they are older than ``grace_ms``; younger ones are left to the
fast path that is presumably still holding them. Publishing twice is harmless: job ids are
deterministic and the transport drops a message id it already knows (I4).

An entry whose hand-off fails (the broker refused or did not confirm the publish) stays in the
outbox: the commit that made it is durable, so the failure is logged and the delivery that
committed it still succeeds; the sweep offers the entry again once it is ``grace_ms`` old. The
other entries of the commit are handed off regardless.

A cancellation request fences an attempt for good, so its job, if still waiting in the broker,
is withdrawn before the request is published, on a transport that can take a message back
(:class:`~accord.engine.ports.Withdraw`: BullMQ and the queue tables). A job a worker already holds
stays, and so does every job on RabbitMQ: the worker checks that its attempt is current before it
runs the handler. A withdrawal that fails leaves the entry to the sweep, like a failed publish.

Done-marks are buffered and written in batches: a late mark costs at most a harmless republish.
Telemetry has its own bounded queue and consumer; when the sink is slow the queue fills, entries
stay in the outbox, and the sweep offers them again later — progress never waits for it.

**Claim checks.** With an object store for claims (``Engine(claims=…)``, ``open_engine(claims=…)``,
``accord engine run --claims URL``), a job envelope whose payload's canonical JSON is above
:data:`~accord.objects.claims.THRESHOLD_BYTES` is checked in before its commit
(:func:`check_in_jobs`, called by the orchestrator, so the outbox row, the queue message of a
joint commit and every republish carry the same ``payloadRef``); the dispatcher checks in any
such entry it still meets (written without claims configured). Object I/O runs off the event loop.

``crash_at`` is a fault-injection point for the crash tests (``after-commit``: die before
publishing; ``after-publish``: die before marking done; ``point:n`` dies the n-th time the point
is passed). It is ``None`` in normal operation.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import replace

from accord.canonical import canonical_json
from accord.engine.ports import Clock, Commit, OutboxEntry, Sink, Store, Transport, Withdraw
from accord.engine.runtime.actions import ActionExecutor
from accord.engine.runtime.outbox import control_body, control_queue, withdrawal
from accord.objects.claims import THRESHOLD_BYTES, check_in
from accord.objects.ports import ObjectStore

__all__ = ["Dispatcher", "check_in_job", "check_in_jobs"]


def _large(entry: OutboxEntry, threshold: int) -> bool:
    if not entry.topic.startswith("job:"):
        return False
    envelope = entry.payload.get("envelope")
    if not isinstance(envelope, dict) or not isinstance(envelope.get("payload"), dict):
        return False
    return len(canonical_json(envelope["payload"])) > threshold


async def check_in_job(
    entry: OutboxEntry, claims: ObjectStore, threshold: int = THRESHOLD_BYTES
) -> OutboxEntry:
    """``entry`` with its job envelope's payload checked in when above ``threshold`` bytes."""
    if not _large(entry, threshold):
        return entry
    envelope = entry.payload["envelope"]
    assert isinstance(envelope, dict)
    checked = await asyncio.to_thread(check_in, envelope, claims, threshold=threshold)
    return replace(entry, payload={**entry.payload, "envelope": checked})


async def check_in_jobs(
    commit: Commit, claims: ObjectStore, threshold: int = THRESHOLD_BYTES
) -> Commit:
    """``commit`` with every large job payload of its outbox checked in (the same commit when
    none is large)."""
    if not any(_large(e, threshold) for e in commit.outbox):
        return commit
    outbox = tuple([await check_in_job(e, claims, threshold) for e in commit.outbox])
    return replace(commit, outbox=outbox)


log = logging.getLogger("accord.engine.runtime.dispatcher")


class Dispatcher:
    def __init__(
        self,
        store: Store,
        transport: Transport,
        clock: Clock,
        actions: ActionExecutor | None,
        sink: Sink | None,
        *,
        owner: str,
        lease_ms: int = 30_000,
        grace_ms: int = 5_000,
        crash_at: str | None = None,
        telemetry_buffer: int = 10_000,
    ) -> None:
        self._store, self._transport, self._clock = store, transport, clock
        self.actions = actions
        self._sink = sink
        self._owner, self._lease_ms, self.grace_ms = owner, lease_ms, grace_ms
        self._crash_at = crash_at
        self._done: list[str] = []
        self._telemetry: asyncio.Queue[OutboxEntry] = asyncio.Queue(telemetry_buffer)
        self._telemetry_pending: set[str] = set()
        self.published = 0
        self.failed = 0  # hand-offs that failed and were left to the sweep
        self.withdrawn = 0  # jobs of fenced attempts taken back before any worker took them
        self._withdraw = transport if isinstance(transport, Withdraw) else None
        self._crash_hits = 0
        self.claims: ObjectStore | None = None  # where large job payloads are checked in
        # the shards whose stranded entries this engine sweeps (None: every shard's)
        self.shards: Callable[[], list[int] | None] = lambda: None
        self.claim_threshold = THRESHOLD_BYTES

    async def dispatch(self, entries: Sequence[OutboxEntry], *, inline: int = 0) -> None:
        """Hand off entries of a commit that just became durable. ``inline`` counts messages
        the commit itself already put in the queue (:mod:`accord.engine.runtime.joint`): they pass
        the
        crash points like any other entry, so a crash there still follows a durable commit."""
        if not entries and not inline:
            return
        self._crash("after-commit")
        for entry in entries:
            await self._guarded(entry)
        self._crash("after-publish")

    async def _guarded(self, entry: OutboxEntry) -> bool:
        """Hand ``entry`` off; a failure is logged and leaves it to the sweep."""
        try:
            await self._hand_off(entry)
        except Exception as exc:
            self.failed += 1
            log.warning(
                "outbox entry %s (%s) not handed off, left for the sweep: %s",
                entry.entry_id, entry.topic, exc,
            )  # fmt: skip
            return False
        return True

    async def _hand_off(self, entry: OutboxEntry) -> None:
        topic = entry.topic
        if topic.startswith("job:"):
            if self.claims is not None:
                entry = await check_in_job(entry, self.claims, self.claim_threshold)
            body = canonical_json(entry.payload.get("envelope", {}))
            await self._transport.publish(topic[4:], entry.entry_id, body)
            self.published += 1
            self._done.append(entry.entry_id)
        elif topic == "action":
            if self.actions is None:
                return  # another engine process with actions will sweep it up
            self.actions.submit(entry.entry_id, entry.run_id, entry.payload)
        elif topic.startswith("cancel:"):
            if self._withdraw is not None and (job := withdrawal(entry)) is not None:
                self.withdrawn += await self._withdraw.withdraw(*job)
            queue = control_queue(topic[7:] or None)
            await self._transport.publish(queue, entry.entry_id, control_body(entry.payload))
            self._done.append(entry.entry_id)
        elif topic == "telemetry":
            if self._sink is None:
                self._done.append(entry.entry_id)
            elif entry.entry_id not in self._telemetry_pending:
                try:
                    self._telemetry.put_nowait(entry)
                    self._telemetry_pending.add(entry.entry_id)
                except asyncio.QueueFull:
                    pass  # stays in the outbox; the sweep offers it again
        else:
            log.error("outbox entry %s has unknown topic %r", entry.entry_id, topic)

    @property
    def has_sink(self) -> bool:
        return self._sink is not None

    def mark_done(self, entry_id: str) -> None:
        self._done.append(entry_id)

    async def flush(self) -> int:
        """Write buffered done-marks in one store call."""
        if not self._done:
            return 0
        batch, self._done = self._done, []
        try:
            await self._store.outbox_done(batch)
        except BaseException:  # kept for the next flush (a lost mark costs only a republish)
            self._done[:0] = batch
            raise
        return len(batch)

    async def sweep(self, limit: int = 500) -> int:
        """Re-hand entries left unfinished past ``grace_ms``; returns how many were handed."""
        # a lease no longer than the grace: a young entry skipped now is claimable again as soon
        # as it is old enough to count as stranded
        lease = min(self._lease_ms, max(self.grace_ms, 1)) if self.grace_ms else self._lease_ms
        shards = self.shards()
        if shards is not None and not shards:
            return 0  # owns nothing: the owners sweep their shards
        claimed = await self._store.claim_outbox(limit, self._owner, lease, shards=shards)
        horizon = self._clock.now_ms() - self.grace_ms
        busy = self.actions.in_flight() if self.actions else set()
        handed = 0
        for entry in claimed:
            if entry.created_at_ms > horizon or entry.entry_id in busy:
                continue
            handed += await self._guarded(entry)
        await self.flush()
        return handed

    async def run_telemetry(self, stop: asyncio.Event) -> None:
        """The telemetry consumer: its own loop, so a slow sink delays only telemetry."""
        assert self._sink is not None
        while not stop.is_set():
            try:
                first = await asyncio.wait_for(self._telemetry.get(), 0.2)
            except TimeoutError:
                continue
            batch = [first]
            while not self._telemetry.empty() and len(batch) < 500:
                batch.append(self._telemetry.get_nowait())
            try:
                await self._sink.emit([e.payload for e in batch])
                self._done.extend(e.entry_id for e in batch)
            except Exception:  # the sink is down: entries stay in the outbox for the sweep
                log.warning("telemetry sink failed for %d event(s)", len(batch), exc_info=True)
            finally:
                self._telemetry_pending.difference_update(e.entry_id for e in batch)

    def _crash(self, point: str) -> None:
        if self._crash_at is None:
            return
        name, _, nth = self._crash_at.partition(":")
        if name == point:
            self._crash_hits += 1
            if self._crash_hits >= int(nth or 1):
                os._exit(137)
