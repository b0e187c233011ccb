"""A minimal worker loop for tests, scenarios and benchmarks (the full Worker SDK is separate).

:func:`run_noop_worker` consumes job queues and answers every job the way a well-behaved worker
does: publish ``accepted`` (with the fence from the job envelope), run the handler, publish
``succeeded`` with its result (or ``failed`` for a :class:`~accord.errors.StageFailed`), then
acknowledge the job (in one step with the answer when the transport offers
``publish_and_ack``, as the embedded queue does). Outcomes ready at once leave as one message
(:class:`~accord.worker.batching.OutcomeBatcher`), as the worker runtime's do. Outcome message
ids are derived from the job's message id, so a redelivered job produces the same outcome ids
(the transport, or else the engine, drops the copies). A job's outcomes go to its ``replyTo``
queue (envelope@2: the queue of the engine owning the run's shard), else to ``outcomes_queue``.

``task_slots`` bounds how many jobs run at once across all queues. ``observe`` is called with
``("start", envelope)`` as soon as a job is received (before ``accepted`` is published) and with
``("end", envelope)`` once its answer is published, which is how the benchmark measures per-hop
latency (one task's end to the next one's receipt) without touching the engine.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from accord.engine.ports import Delivery, Transport
from accord.engine.runtime import wire
from accord.engine.runtime.intake import OUTCOMES_QUEUE
from accord.engine.runtime.wire import encode_outcome, outcome_id
from accord.errors import StageFailed
from accord.worker.batching import OutcomeBatcher
from accord.worker.wire import REPLY_TO

__all__ = ["JobHandler", "outcome", "reply_to", "run_noop_worker"]

log = logging.getLogger("accord.testing.workers")

JobHandler = Callable[[Mapping[str, Any]], Awaitable[dict[str, Any]]]
Observer = Callable[[str, Mapping[str, Any]], None]


async def _noop(_envelope: Mapping[str, Any]) -> dict[str, Any]:
    return {}


def outcome(
    envelope: Mapping[str, Any], kind: str, payload: Mapping[str, Any] | None = None, **extra: Any
) -> tuple[str, bytes]:
    """``(message id, body)`` of an outcome envelope answering the job ``envelope``."""
    message_id = outcome_id(envelope[wire.MESSAGE_ID], kind)
    body = encode_outcome(
        message_id, kind, run_id=envelope[wire.RUN_ID], stage=envelope[wire.STAGE],
        attempt=envelope[wire.ATTEMPT], fence=envelope[wire.FENCE],
        tenant=envelope.get(wire.TENANT, ""), payload=payload, **extra,
    )  # fmt: skip
    return message_id, body


def reply_to(envelope: Mapping[str, Any]) -> str | None:
    """The job's ``replyTo`` queue when it names a valid one (as the worker runtime reads it),
    else ``None``: the outcome queue."""
    queue = envelope.get("replyTo")
    return queue if isinstance(queue, str) and REPLY_TO.fullmatch(queue) else None


async def run_noop_worker(
    transport: Transport,
    queues: Sequence[str],
    *,
    outcomes_queue: str = OUTCOMES_QUEUE,
    worker_id: str = "noop-worker",
    handler: JobHandler = _noop,
    task_slots: int = 4,
    stop: asyncio.Event | None = None,
    observe: Observer | None = None,
) -> None:
    """Serve ``queues`` until ``stop`` is set (or the task is cancelled)."""
    stop = stop or asyncio.Event()
    slots = asyncio.Semaphore(task_slots)
    running: set[asyncio.Task[None]] = set()
    # a transport that can publish the answer and settle the job in one step saves a write
    settle: Callable[[str, str, bytes, Delivery], Awaitable[None]] | None = getattr(
        transport, "publish_and_ack", None
    )
    # outcomes ready at once: one message
    answers = OutcomeBatcher(transport, outcomes_queue)

    async def serve(delivery: Delivery) -> None:
        try:
            envelope = json.loads(delivery.body)
            answer_to = reply_to(envelope)
            if observe:  # the job is received: a hop ends here, before any answer goes out
                observe("start", envelope)
            await answers.publish(*outcome(envelope, "accepted", worker_id=worker_id), answer_to)
            try:
                result = await handler(envelope)
                answer = outcome(envelope, "succeeded", result)
            except StageFailed as exc:
                failure = {"code": exc.failure_code, "message": exc.reason}
                answer = outcome(envelope, "failed", failure | {"retryable": exc.retryable})
            if settle is None:
                await answers.publish(*answer, answer_to)
            else:
                await settle(answer_to or outcomes_queue, *answer, delivery)
            if observe:
                observe("end", envelope)
            if settle is None:
                await transport.ack(delivery)
        except Exception:  # unacked: the transport redelivers it after the visibility timeout
            log.exception("job %s not served", delivery.message_id)
        finally:
            slots.release()

    async def pull(queue: str) -> None:
        async for delivery in transport.consume(queue, task_slots):
            await slots.acquire()
            task = asyncio.get_running_loop().create_task(serve(delivery))
            running.add(task)
            task.add_done_callback(running.discard)

    pullers = [asyncio.get_running_loop().create_task(pull(q)) for q in queues]
    try:
        await stop.wait()
    finally:
        for p in pullers:
            p.cancel()
        await asyncio.gather(*pullers, return_exceptions=True)
        await asyncio.gather(*running, return_exceptions=True)
