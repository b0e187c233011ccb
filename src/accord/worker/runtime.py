"""The worker runtime: serves a :class:`~accord.worker.sdk.Worker` over any transport.

One job, in order::

    read + validate (wire.read_job)     poison → <queue>.quarantine; invalid → terminal failure
    acceptance record (AcceptanceLog)   already accepted → re-announce, never a second run
    take a task slot                    ``slots`` handlers at once
    publish "accepted"                  BEFORE the handler starts: from here the engine owns it
    run handler, heartbeating           sync handlers in a thread; progress as it is reported
    validate result                     invalid → terminal "invalid-result"
    give the slot back; publish final outcome, record, ack

A slot is held from acceptance to the handler's end, so a job is accepted only when it can start
at once. Its answer is published and the job acknowledged after the slot is given back: waiting
for the broker's confirm of the answer does not keep the next job from starting. A worker holds
up to twice ``slots`` jobs (running, answering, or waiting for a slot unaccepted), which is the
prefetch it asks of the transport for each queue.

Outcomes ready at the same moment leave as one batch message (:mod:`accord.worker.batching`);
each publish still returns only once the message carrying it is confirmed.

Cancellation requests arrive on the control queue of each served queue and set the matching
attempt's :attr:`Context.cancelled`. Unclassified exceptions are retryable until the stage has
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

from accord.contracts.catalog import Catalog
from accord.engine.ports import Delivery, Transport
from accord.engine.runtime.intake import OUTCOMES_QUEUE
from accord.engine.runtime.outbox import control_queue
from accord.engine.runtime.wire import outcome_message_id
from accord.errors import StageFailed
from accord.worker import wire
from accord.worker.acceptance import AcceptanceLog
from accord.worker.batching import OutcomeBatcher
from accord.worker.sdk import Binding, Context, Worker
from accord.worker.wire import Announcer, Job, Poison, Refused, failure, outcome

__all__ = ["Observer", "Runtime"]

Observer = Callable[[str, Job], None]  # ("start", job) on receipt, ("end", job) once answered

log = logging.getLogger("accord.worker")


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
    ) -> None:
        self.worker, self.transport, self.catalog = worker, transport, catalog
        self.acceptance = acceptance or AcceptanceLog()
        self.worker_id = worker_id or f"{worker.name}-{secrets.token_hex(3)}"
        self._announce, self._ttl = announce, announce_ttl_ms
        self._heartbeat_ms = heartbeat_ms
        self._observe = observe
        # outcomes ready at once (several jobs' answers, heartbeats) leave as one message
        self.outcomes = OutcomeBatcher(transport, outcomes_queue)
        self._max_crashes, self._drain_s = max_crashes, drain_s
        self._slots = asyncio.Semaphore(slots)  # handlers at once
        self._prefetch = 2 * slots
        self._held = asyncio.Semaphore(self._prefetch)  # jobs held at once
        self.queues: dict[str, Binding] = {self._queue_of(b): b for b in worker.bindings.values()}
        self.inflight: dict[str, Context] = {}  # fence → context of the running attempt
        self.stats = {"served": 0, "handler_runs": 0, "reannounced": 0, "quarantined": 0}
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

    async def _pull(self, queue: str, binding: Binding) -> None:
        async for delivery in self.transport.consume(queue, self._prefetch):
            await self._held.acquire()
            task = asyncio.get_running_loop().create_task(self._guarded(delivery, binding))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _guarded(self, delivery: Delivery, binding: Binding) -> None:
        try:
            await self.serve(delivery, binding)
        except Exception:  # not acknowledged: the transport redelivers it
            log.exception("job %s not served", delivery.message_id)
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

    async def serve(self, delivery: Delivery, binding: Binding) -> None:
        try:
            job, payload = wire.read_job(
                delivery.body, self.catalog, self._contract(binding, "request")
            )
        except Poison as exc:
            await self._quarantine(delivery, str(exc))
            return
        except Refused as exc:
            if self._claim(exc.job, delivery) is None:
                await self._publish(*outcome(exc.job, "accepted", worker_id=self.worker_id))
                refused = failure(exc.code, exc.message, retryable=False)
                await self._finish(exc.job, outcome(exc.job, *refused))
            await self._ack(delivery)
            return
        if self._observe is not None:
            self._observe("start", job)
        async with self._slots:  # from acceptance to the handler's end
            if self._claim(job, delivery) is not None:
                await self._ack(delivery)
                return
            await self._publish(*outcome(job, "accepted", worker_id=self.worker_id))
            answer = await self._execute(job, payload, binding)
        await self._finish(job, answer)
        if self._observe is not None:
            self._observe("end", job)
        await self._ack(delivery)
        self.stats["served"] += 1

    def _claim(self, job: Job, delivery: Delivery) -> Any:
        """``None`` to go ahead; otherwise the prior record (answered by :meth:`_answer_again`)."""
        prior = self.acceptance.claim(job.run_id, job.stage, job.attempt, job.fence)
        if prior is not None:
            self.stats["reannounced"] += 1
            task = asyncio.get_running_loop().create_task(self._answer_again(job, prior.outcome))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return prior

    async def _answer_again(self, job: Job, final: bytes | None) -> None:
        await self._publish(*outcome(job, "accepted", worker_id=self.worker_id))
        if final is not None:
            await self._publish(outcome_message_id(final), final)

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
                *outcome(job, "progress", {"percent": percent, "message": message}, seq=next(seq))
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
            result = await self._call(binding, payload, ctx)
            final = wire.check_result(self.catalog, self._contract(binding, "result"), result)
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
        return outcome(job, kind, body)

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
            await self._publish(*outcome(job, "heartbeat", {"at": time.time()}, seq=n))
            await asyncio.sleep(self._heartbeat_ms / 1000)

    async def _finish(self, job: Job, answer: tuple[str, bytes]) -> None:
        message_id, body = answer
        self.acceptance.finish(job.run_id, job.stage, job.attempt, job.fence, body)
        await self._publish(message_id, body)

    async def _publish(self, message_id: str, body: bytes) -> None:
        await self.outcomes.publish(message_id, body)

    async def _ack(self, delivery: Delivery) -> None:
        with contextlib.suppress(Exception):  # a lapsed lease: the redelivery is answered
            await self.transport.ack(delivery)

    async def _quarantine(self, delivery: Delivery, reason: str) -> None:
        log.warning("quarantined job %s: %s", delivery.message_id, reason)
        contracts = self.catalog.messages() if self.catalog else ()
        await self.transport.publish(*wire.quarantine(delivery, reason, contracts))
        self.stats["quarantined"] += 1
        await self._ack(delivery)
