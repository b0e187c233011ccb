"""The worker runtime: serves a :class:`~accord.worker.sdk.Worker` over any transport.

One job, in order::

    read + validate (wire.read_job)     poison → <queue>.quarantine; invalid → terminal failure
                                        (a payloadRef is checked out of ``claims`` and verified:
                                        a mismatch is the terminal "corrupt-payload")
    attempt still current?              superseded → acknowledged unanswered, never run
    acceptance record (AcceptanceLog)   already accepted → re-announce, never a second run
    take a task slot                    ``slots`` handlers at once
    publish "accepted"                  BEFORE the handler starts: from here the engine owns it
    run handler, heartbeating           sync handlers in a thread; progress as it is reported
    validate result                     invalid → terminal "invalid-result"
                                        (with ``claims``, a result above the threshold is
                                        checked in and answered as ``{"payloadRef": …}``)
    give the slot back; publish final outcome, record, ack

A slot is held from acceptance to the handler's end, so a job is accepted only when it can start
at once. Its answer is published and the job acknowledged after the slot is given back: waiting
for the broker's confirm of the answer does not keep the next job from starting. A worker holds
up to twice ``slots`` jobs (running, answering, or waiting for a slot unaccepted), which is the
prefetch it asks of the transport for each queue.

Every outcome of a job (accepted, heartbeats, progress, the final one, and a recorded one sent
again) goes to the job's ``replyTo`` queue (:attr:`Job.reply_to`, the queue of the engine owning
the run's shard), or to ``outcomes_queue`` when the job has none. Outcomes ready at the same
moment for the same queue leave as one batch message (:mod:`accord.worker.batching`); each
publish still returns only once the message carrying it is confirmed.

Nothing wedges: every job held is answered, or returned to its queue, within a bounded time, and
its slots are always given back. A broker that is briefly away when a job is accepted or answered
must not leave the job held (its lock renewed, never redelivered, a slot lost while the worker
still announces itself alive), so:

- ``accepted`` and the final outcome are published with retries (backoff up to
  :data:`RETRY_MAX_S`) for at most ``answer_s``; heartbeats that fail are skipped, not fatal;
- ``accepted`` never confirmed in that time: the handler has not run and the engine does not
  know of the attempt, so its acceptance is released (:meth:`AcceptanceLog.release`) and the job
  nacked — its redelivery is served as a first delivery;
- a final outcome never confirmed: it is already in the acceptance record (recorded before it is
  published), so the job is nacked and its redelivery republishes it from there, then acks;
- a redelivery of an accepted job re-announces (and republishes a recorded outcome) with the same
  bounded retries and is acknowledged only once those are confirmed, nacked otherwise;
- anything else that goes wrong while serving a job nacks it.

A nack that fails because the broker is away still lets the job go: the transports drop the lease
before settling it (BullMQ stops renewing its lock, which lapses, and the stalled check returns it;
a RabbitMQ channel that closed has its unacknowledged messages requeued by the broker; an embedded
lease lapses). A job returned this way counts a delivery toward its queue's limit. A finished
job returned may be redelivered to another worker, which has no record of it and runs the
handler again: the engine accepts one completion of the attempt and records the other as a
duplicate.

Cancellation requests arrive on the control queue of each served queue and set the matching
attempt's :attr:`Context.cancelled`; their fences are remembered too, since a request can arrive
before its job is taken. A job whose attempt the engine has superseded (a deadline passed, the run
was cancelled or ended) is not run: it is acknowledged without an answer — the engine already
moved on and would refuse any as ``stale`` — once a cancellation request named its fence, or
(with ``current``, the worker reading the engine's store) the run record shows a later attempt or
this one concluded (:mod:`accord.worker.superseded`). The check comes before the job is accepted,
once a slot is free: a job that waited for a slot is looked at when it would start.

Unclassified exceptions are retryable until the stage has
crashed ``max_crashes`` times, then terminal. Capabilities are announced with a TTL and renewed
at a third of it. :meth:`Runtime.run` returns after a graceful shutdown: stop consuming, let
in-flight jobs finish (up to ``drain_s``), then stop heartbeats and announcements.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from accord.adapters.telemetry.metrics import worker_metrics
from accord.adapters.telemetry.otel import worker_span
from accord.canonical import canonical_json
from accord.contracts.catalog import Catalog
from accord.contracts.redact import scrub
from accord.contracts.sealing import Keyring
from accord.engine.ports import Delivery, Transport
from accord.engine.runtime.intake import OUTCOMES_QUEUE
from accord.engine.runtime.outbox import control_queue
from accord.engine.runtime.wire import outcome_message_id
from accord.errors import StageFailed
from accord.objects.claims import THRESHOLD_BYTES, check_in_result
from accord.objects.ports import ObjectError, ObjectStore
from accord.worker import wire
from accord.worker.acceptance import AcceptanceLog
from accord.worker.batching import OutcomeBatcher
from accord.worker.sdk import Binding, Context, Worker
from accord.worker.superseded import CancelledFences, Current
from accord.worker.wire import Announcer, Job, Poison, Refused, failure, outcome

__all__ = ["Observer", "Runtime"]

Observer = Callable[[str, Job], None]  # ("start", job) on receipt, ("end", job) once answered

log = logging.getLogger("accord.worker")

ANSWER_S = 30.0  # how long acceptance and answers are retried before the job is returned
RETRY_FIRST_S, RETRY_MAX_S = 0.05, 1.0  # backoff between those tries: doubling, capped
PULL_RETRY_S = 0.25  # pause before consuming a queue again after its stream failed
CURRENT_S = 5.0  # longest wait for the run record before a job runs unchecked


class Runtime:
    def __init__(
        self,
        worker: Worker,
        transport: Transport,
        *,
        catalog: Catalog | None = None,
        acceptance: AcceptanceLog | None = None,
        announce: Announcer | None = None,
        outcomes_queue: str = OUTCOMES_QUEUE,
        heartbeat_ms: int = 5_000,
        announce_ttl_ms: int = 30_000,
        max_crashes: int = 3,
        slots: int = 4,
        drain_s: float = 30.0,
        worker_id: str | None = None,
        observe: Observer | None = None,
        answer_s: float = ANSWER_S,
        sealing: Keyring | None = None,
        current: Current | None = None,
        claims: ObjectStore | None = None,
    ) -> None:
        if answer_s <= 0:
            raise ValueError("answer_s must be > 0")
        self._answer_s = answer_s
        self.worker, self.transport, self.catalog = worker, transport, catalog
        self.sealing = sealing  # opens sealed requests and seals sensitive result fields
        self.claims = claims  # where payloadRef jobs are checked out (accord.objects.claims)
        self.acceptance = acceptance or AcceptanceLog()
        self.worker_id = worker_id or f"{worker.name}-{secrets.token_hex(3)}"
        self._announce, self._ttl = announce, announce_ttl_ms
        self._heartbeat_ms = heartbeat_ms
        self._observe = observe
        self._metrics = worker_metrics()  # None unless OTEL_* names an OTLP endpoint
        # outcomes ready at once (several jobs' answers, heartbeats) leave as one message
        self.outcomes = OutcomeBatcher(transport, outcomes_queue)
        self._max_crashes, self._drain_s = max_crashes, drain_s
        self._slots = asyncio.Semaphore(slots)  # handlers at once
        self._prefetch = 2 * slots
        self._held = asyncio.Semaphore(self._prefetch)  # jobs held at once
        # several versions of one capability may share a queue: a job goes to the binding whose
        # request contract it names (each must have its own)
        self.queues: dict[str, tuple[Binding, ...]] = {}
        for binding in worker.bindings.values():
            queue = self._queue_of(binding)
            sharing = (*self.queues.get(queue, ()), binding)
            requests = [self._contract(b, "request") for b in sharing]
            if len(sharing) > 1 and (None in requests or len(set(requests)) < len(requests)):
                names = " and ".join(b.capability for b in sharing)
                raise ValueError(
                    f"{worker.name}: {names} both take queue {queue!r}, and a job cannot say "
                    "which it is for: one queue may be shared only by capabilities whose "
                    "request contracts differ (versions of one capability)"
                )
            self.queues[queue] = sharing
        self.inflight: dict[str, Context] = {}  # fence → context of the running attempt
        self.cancelled = CancelledFences()  # (stage, fence) of cancellation requests received
        self._current = current  # reads the run record: is the attempt still current?
        self.stats = {
            "served": 0, "handler_runs": 0, "reannounced": 0, "quarantined": 0, "returned": 0,
            "superseded": 0,
        }  # fmt: skip
        self._tasks: set[asyncio.Task[None]] = set()

    def _queue_of(self, binding: Binding) -> str:
        if binding.queue:
            return binding.queue
        contract = self.catalog.capability(binding.capability) if self.catalog else None
        return (contract.queue if contract else None) or binding.capability.rpartition("@")[0]

    def _contract(self, binding: Binding, part: str) -> str | None:
        contract = self.catalog.capability(binding.capability) if self.catalog else None
        return str(getattr(contract, part)) if contract else None

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then shut down gracefully."""
        spawn = asyncio.get_running_loop().create_task
        pullers = [spawn(self._pull(q, b)) for q, b in self.queues.items()]
        pullers += [spawn(self._control(q)) for q in self.queues]
        keepalive = spawn(self._announcer(stop)) if self._announce else None
        try:
            await stop.wait()
        finally:
            for p in pullers:  # stop consuming first: nothing new starts
                p.cancel()
            await asyncio.gather(*pullers, return_exceptions=True)
            if self._tasks:
                await asyncio.wait(set(self._tasks), timeout=self._drain_s)
            if keepalive is not None:
                keepalive.cancel()
                await asyncio.gather(keepalive, return_exceptions=True)

    async def _pull(self, queue: str, binding: tuple[Binding, ...]) -> None:
        """Take jobs until cancelled; a stream that fails (transport away) is consumed again
        shortly, so the queue is never left unserved while the worker lives."""
        while True:
            try:
                async for delivery in self.transport.consume(queue, self._prefetch):
                    await self._held.acquire()
                    task = asyncio.get_running_loop().create_task(self._guarded(delivery, binding))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                return  # the transport closed
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("consuming %r", queue)
                await asyncio.sleep(PULL_RETRY_S)

    async def _guarded(self, delivery: Delivery, binding: tuple[Binding, ...]) -> None:
        try:
            await self.serve(delivery, binding)
        except Exception:  # never held unanswered: back to the queue for another try
            log.exception("job %s not served: returned to its queue", delivery.message_id)
            await self._return(delivery)
        finally:
            self._held.release()

    async def _control(self, queue: str) -> None:
        """Take cancellation requests until cancelled: one that cannot be read is quarantined,
        and no body, nor a failed settle, ends the loop (later requests must still be taken)."""
        while True:
            try:
                async for delivery in self.transport.consume(control_queue(queue), 16):
                    await self._cancel(delivery)
                return  # the transport closed
            except asyncio.CancelledError:
                raise
            except Exception:  # the stream failed (transport away): consume again shortly
                log.exception("control queue of %r", queue)
                await asyncio.sleep(0.25)

    async def _cancel(self, delivery: Delivery) -> None:
        try:
            fence, stage = wire.read_control(delivery.body)
        except Poison as exc:
            with contextlib.suppress(Exception):  # not recorded: its redelivery tries again
                await self._quarantine(delivery, str(exc))
            return
        self.cancelled.add(stage, fence)  # its job may not have been taken yet
        ctx = self.inflight.get(fence)
        if ctx is not None and ctx.stage == stage:
            ctx.cancel()
        await self._ack(delivery)

    async def _announcer(self, stop: asyncio.Event) -> None:
        assert self._announce is not None
        while not stop.is_set():
            try:
                await self._announce(self.worker_id, self.worker.capabilities, self._ttl)
            except Exception:
                log.exception("announcing capabilities failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._ttl / 3000)

    async def serve(self, delivery: Delivery, bindings: tuple[Binding, ...]) -> None:
        """Serve one job of a queue these bindings share (their request contracts differ)."""
        binding = bindings[0]
        by_request = {self._contract(b, "request"): b for b in bindings}
        request: str | list[str] | None = (
            self._contract(binding, "request")
            if len(bindings) == 1
            else [r for r in by_request if r is not None]
        )
        try:
            if self.claims is not None and b'"payloadRef"' in delivery.body:
                job, payload = await asyncio.to_thread(  # object I/O: off the event loop
                    wire.read_job, delivery.body, self.catalog, request, self.sealing, self.claims
                )
            else:
                job, payload = wire.read_job(delivery.body, self.catalog, request, self.sealing)
        except Poison as exc:
            if self._metrics is not None:
                self._metrics.quarantined(binding.capability)
            await self._quarantine(delivery, str(exc))
            return
        except Refused as exc:
            if self._metrics is not None:
                self._metrics.rejected(binding.capability)
            if await self._superseded(exc.job, delivery):
                return
            prior = self._claim(exc.job)
            if prior is not None:
                await self._answer_again(exc.job, prior.outcome, delivery)
            elif await self._accept(exc.job, delivery):
                refused = failure(exc.code, exc.message, retryable=exc.retryable)
                await self._finish(exc.job, self._outcome(exc.job, *refused), delivery)
            return
        if len(bindings) > 1:  # read_job admitted only a request contract one of them takes
            named = f"{job.envelope.get('messageType')}@{job.envelope.get('contractVersion')}"
            binding = by_request.get(named, binding)
        if self._metrics is not None:
            self._metrics.received(job.envelope, binding.capability)
        if (job.stage, job.fence) in self.cancelled:  # known before waiting for a slot
            await self._superseded(job, delivery)
            return
        if self._observe is not None:
            self._observe("start", job)
        async with self._slots:  # from acceptance to the handler's end
            if await self._superseded(job, delivery):
                return
            prior = self._claim(job)
            if prior is None:
                if not await self._accept(job, delivery):
                    return
                if self._metrics is not None:
                    self._metrics.accepted(job.envelope, binding.capability)
                answer = await self._execute(job, payload, binding)
        if prior is not None:  # answered again outside the slot: it may wait for the broker
            await self._answer_again(job, prior.outcome, delivery)
            return
        if not await self._finish(job, answer, delivery):
            return
        if self._observe is not None:
            self._observe("end", job)
        self.stats["served"] += 1

    async def _superseded(self, job: Job, delivery: Delivery) -> bool:
        """Whether ``job``'s attempt is known to be superseded; if so it is acknowledged with no
        answer and never run. A check that fails or takes over :data:`CURRENT_S` (the store away)
        lets the job run, as it would without the check."""
        gone = (job.stage, job.fence) in self.cancelled
        if not gone and self._current is not None:
            try:
                ask = self._current(job.run_id, job.stage, job.attempt, job.fence)
                async with asyncio.timeout(CURRENT_S):  # no task of its own per job
                    gone = not await ask
            except Exception as exc:  # TimeoutError included: a slow store never holds the job
                log.warning("cannot tell whether job %s is current, running it: %s",
                            job.message_id, str(exc) or type(exc).__name__)  # fmt: skip
        if gone:
            log.info("job %s: attempt %d of %r was superseded, not run",
                     job.message_id, job.attempt, job.stage)  # fmt: skip
            self.stats["superseded"] += 1
            await self._ack(delivery)
        return gone

    def _claim(self, job: Job) -> Any:
        """``None`` to go ahead; otherwise the prior record (answered by :meth:`_answer_again`)."""
        return self.acceptance.claim(job.run_id, job.stage, job.attempt, job.fence)

    async def _accept(self, job: Job, delivery: Delivery) -> bool:
        """Publish ``accepted`` (bounded retries); False if it never was confirmed, and then the
        claim is released and the job returned to its queue: nobody ran it, nobody knows of it."""
        if await self._deliver(job, *self._outcome(job, "accepted", worker_id=self.worker_id)):
            return True
        self.acceptance.release(job.run_id, job.stage, job.attempt, job.fence)
        await self._return(delivery)
        return False

    async def _answer_again(self, job: Job, final: bytes | None, delivery: Delivery) -> None:
        """A redelivery of an accepted job: re-announce it and republish its recorded outcome,
        then ack — or, if the broker does not confirm them in time, return it for another try."""
        self.stats["reannounced"] += 1
        done = await self._deliver(job, *self._outcome(job, "accepted", worker_id=self.worker_id))
        if done and final is not None:
            done = await self._deliver(job, outcome_message_id(final), final)
        if done:
            await self._ack(delivery)
        else:
            await self._return(delivery)

    async def _execute(
        self, job: Job, payload: dict[str, Any], binding: Binding
    ) -> tuple[str, bytes]:
        """Run the handler; the final outcome's message id and body."""
        loop = asyncio.get_running_loop()
        pending: list[Any] = []  # asyncio tasks, or concurrent futures from handler threads
        seq = iter(range(1, 1 << 62))
        owner = threading.get_ident()

        def emit(percent: float, message: str) -> None:
            coro = self._publish(
                job,
                *self._outcome(
                    job, "progress", {"percent": percent, "message": message}, seq=next(seq)
                ),
            )
            if threading.get_ident() == owner:
                pending.append(asyncio.ensure_future(coro))
            else:
                pending.append(asyncio.run_coroutine_threadsafe(coro, loop))

        ctx = Context(
            run_id=job.run_id, stage=job.stage, attempt=job.attempt, fence=job.fence,
            tenant=str(job.envelope.get("tenant", "")), capability=binding.capability,
            idempotency_key=str(job.envelope.get("idempotencyKey") or job.message_id),
            envelope=job.envelope, services=self.worker.services, _emit=emit,
        )  # fmt: skip
        self.inflight[job.fence] = ctx
        # heartbeats start once the handler has run for a heartbeat period: a quick handler
        # costs a timer, not a task
        beats: list[asyncio.Task[None]] = []
        timer = loop.call_later(
            self._heartbeat_ms / 1000, lambda: beats.append(loop.create_task(self._heartbeat(job)))
        )
        self.stats["handler_runs"] += 1
        try:
            with worker_span(job.envelope, binding.capability):  # a no-op unless OTEL_* is set
                result = await self._call(binding, payload, ctx)
            final = wire.check_result(
                self.catalog, self._contract(binding, "result"), result, self.sealing
            )
            if final[0] == "succeeded" and self.claims is not None:
                final = await self._check_in_result(job, final[1])
        except StageFailed as exc:
            final = failure(exc.failure_code, exc.reason, retryable=exc.retryable)
        except Exception as exc:
            crashes = self.acceptance.count_crash(job.run_id, job.stage)
            retry = crashes < self._max_crashes
            note = f"{type(exc).__name__}: {exc}"[:1800] + f" (crash {crashes})"
            final = failure("handler-crashed", note, retryable=retry)
        finally:
            timer.cancel()
            for beat in beats:
                beat.cancel()
            self.inflight.pop(job.fence, None)
        waits = [p if isinstance(p, asyncio.Future) else asyncio.wrap_future(p) for p in pending]
        if beats or waits:
            await asyncio.gather(*beats, *waits, return_exceptions=True)
        kind, body = final
        return self._outcome(job, kind, body)

    async def _check_in_result(
        self, job: Job, result: dict[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        """A result above the claim threshold written to ``claims`` (off the event loop) and
        answered as ``{"payloadRef": …}``, which intake reads back and verifies; a smaller one
        unchanged. A store that fails is a ``storage-unavailable`` failure, retryable if the
        store says so."""
        tenant = job.envelope.get("tenant")
        if not isinstance(tenant, str) or not tenant or self.claims is None:
            return "succeeded", result
        if len(canonical_json(result)) <= THRESHOLD_BYTES:
            return "succeeded", result
        if job.opened is not None:  # as wire.outcome scrubs an inline result
            result = scrub(result, job.opened)
        try:
            ref = await asyncio.to_thread(check_in_result, result, self.claims, tenant)
        except ObjectError as exc:
            why = f"result claim check: the object store refused or failed: {exc}"
            return failure("storage-unavailable", why, retryable=exc.retryable)
        return "succeeded", ref

    async def _call(self, binding: Binding, payload: dict[str, Any], ctx: Context) -> Any:
        if binding.is_async:
            return await binding.handler(payload, ctx)  # type: ignore[misc]
        result = await asyncio.to_thread(binding.handler, payload, ctx)
        if asyncio.iscoroutine(result):  # a sync-looking callable that returned a coroutine
            result = await result
        return result

    async def _heartbeat(self, job: Job) -> None:
        """Beat now (a heartbeat period into the handler), then every period."""
        n = 0
        while True:
            n += 1
            try:
                await self._publish(
                    job, *self._outcome(job, "heartbeat", {"at": time.time()}, seq=n)
                )
            except Exception as exc:  # the broker away: the next beat tries again
                log.warning("heartbeat of job %s not sent: %s", job.message_id, exc)
            await asyncio.sleep(self._heartbeat_ms / 1000)

    async def _finish(self, job: Job, answer: tuple[str, bytes], delivery: Delivery) -> bool:
        """Record the final outcome, publish it (bounded retries) and ack; if it is never
        confirmed the job is returned, and its redelivery republishes it from the record."""
        message_id, body = answer
        self.acceptance.finish(job.run_id, job.stage, job.attempt, job.fence, body)
        if await self._deliver(job, message_id, body):
            await self._ack(delivery)
            return True
        await self._return(delivery)
        return False

    def _outcome(self, job: Job, kind: str, *args: Any, **kwargs: Any) -> tuple[str, bytes]:
        """An outcome answering ``job``, this worker named as its producer."""
        return outcome(job, kind, *args, producer=self.worker_id, **kwargs)

    async def _publish(self, job: Job, message_id: str, body: bytes) -> None:
        """Send an outcome of ``job`` to its ``replyTo`` queue, else to the outcome queue."""
        await self.outcomes.publish(message_id, body, job.reply_to)

    async def _deliver(self, job: Job, message_id: str, body: bytes) -> bool:
        """Publish, trying again with backoff for up to ``answer_s``; whether it was confirmed.
        Each try is bounded by the time left, so a publish that hangs cannot hold the job."""
        loop = asyncio.get_running_loop()
        deadline, pause = loop.time() + self._answer_s, RETRY_FIRST_S
        while True:
            try:
                async with asyncio.timeout_at(deadline):  # no task of its own per publish
                    await self._publish(job, message_id, body)
                return True
            except Exception as exc:  # TimeoutError included: the time is up
                left = deadline - loop.time()
                if left <= 0:
                    log.warning("outcome %s not confirmed in %.0f s: %s", message_id,
                                self._answer_s, str(exc) or type(exc).__name__)  # fmt: skip
                    return False
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, RETRY_MAX_S)

    async def _ack(self, delivery: Delivery) -> None:
        with contextlib.suppress(Exception):  # a lapsed lease: the redelivery is answered
            await self.transport.ack(delivery)

    async def _return(self, delivery: Delivery) -> None:
        """Give a job back for redelivery. A nack that fails (the broker away) still lets it go:
        the transport has dropped its lease, which lapses (see the module docstring)."""
        self.stats["returned"] += 1
        with contextlib.suppress(Exception):
            await self.transport.nack(delivery)

    async def _quarantine(self, delivery: Delivery, reason: str) -> None:
        log.warning("quarantined job %s: %s", delivery.message_id, reason)
        contracts = self.catalog.messages() if self.catalog else ()
        await self.transport.publish(*wire.quarantine(delivery, reason, contracts))
        self.stats["quarantined"] += 1
        await self._ack(delivery)
