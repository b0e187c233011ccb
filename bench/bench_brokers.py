"""Broker transports: one message's round trip and bulk throughput, next to the bare client.

For BullMQ (Redis on 127.0.0.1:6379, db 15) and RabbitMQ (127.0.0.1:5672, durable quorum queues,
publisher confirms), in the same run:

- ``<broker>.bare.p50_ms`` / ``p99_ms``: the bare client library's round trip, publish → consumer
  receives → settled (BullMQ-py ``Queue.add`` → ``Worker`` processor → completed; aio-pika confirmed
  persistent publish to a durable quorum queue → consumer → ack; ``bare_classic``: the same on a
  classic durable queue). The floor to report against (measured before: ~1.7 ms BullMQ-py,
  ~1.2 ms RabbitMQ durable). ``bare.throughput``: the bare client with 32 messages in flight.
- ``<broker>.transport.p50_ms`` / ``p99_ms``: the same through Accord's transport: ``publish`` →
  ``anext(consume(...))`` → ``ack``, one message at a time.
- ``<broker>.throughput``: ``publish`` of N messages (32 in flight), then ``consume`` (prefetch 32)
  and ``ack`` all of them: messages per second, end to end.
- ``<broker>.delay_late_ms``: how late a delayed publish arrives (median, max over a few delays).

Run: ``python -m bench.bench_brokers`` (or ``--smoke``); ``python -m bench`` runs it with the rest.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
import redis

from accord.adapters import open_transport
from accord.engine.ports import Transport
from accord.loop import run as run_loop

REDIS_DB = 15
AMQP = "amqp://guest:guest@127.0.0.1:5672/"
IN_FLIGHT = 32


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 3),
    }


async def _timed(n: int, one: Callable[[int], Awaitable[None]]) -> dict[str, float]:
    for warm in range(10):
        await one(-1 - warm)
    samples = []
    for i in range(n):
        started = time.perf_counter()
        await one(i)
        samples.append(time.perf_counter() - started)
    return _percentiles(samples)


async def _through_transport(transport: Transport, n: int, bulk: int) -> dict[str, Any]:
    stream = transport.consume("rt")

    async def one(i: int) -> None:
        await transport.publish("rt", f"rt-{i}", b'{"n":1}')
        await transport.ack(await anext(stream))

    latency = await _timed(n, one)
    await stream.aclose()  # type: ignore[attr-defined]
    started = time.perf_counter()
    for first in range(0, bulk, IN_FLIGHT):
        last = min(first + IN_FLIGHT, bulk)
        await asyncio.gather(
            *(transport.publish("bulk", f"b-{i}", b"{}") for i in range(first, last))
        )
    bulk_stream = transport.consume("bulk", prefetch=IN_FLIGHT)
    left = [bulk]

    async def drain() -> None:  # IN_FLIGHT of these share the stream, acking as they go
        while left[0] > 0:
            left[0] -= 1
            await transport.ack(await anext(bulk_stream))

    await asyncio.gather(*(drain() for _ in range(IN_FLIGHT)))
    rate = bulk / (time.perf_counter() - started)
    await bulk_stream.aclose()  # type: ignore[attr-defined]
    delays = await _delays(transport, (100, 250, 400) if bulk < 1000 else (100, 200, 300, 400, 500))
    late = [round(x, 1) for x in delays]
    return {
        "transport": latency,
        "throughput": round(rate),
        "delay_late_ms": {"median": statistics.median(late), "max": max(late)},
    }


async def _delays(transport: Transport, delays: tuple[int, ...]) -> list[float]:
    stream, late = transport.consume("delayed"), []
    for n, delay_ms in enumerate(delays):
        started = time.perf_counter()
        await transport.publish("delayed", f"d-{n}", b"{}", delay_ms=delay_ms)
        await transport.ack(await anext(stream))
        late.append((time.perf_counter() - started) * 1000 - delay_ms)
    await stream.aclose()  # type: ignore[attr-defined]
    return late


async def _bare_bullmq(prefix: str, n: int, bulk: int) -> dict[str, float]:
    from bullmq import Queue, Worker  # type: ignore[import-untyped]

    arrived: dict[str, asyncio.Future[None]] = {}

    async def processor(job: Any, token: str) -> None:
        return None

    def completed(job: Any, result: Any) -> None:
        waiter = arrived.get(job.id)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    opts = {"connection": "redis://127.0.0.1:6379/15", "prefix": prefix}
    queue = Queue("bare", opts)
    worker = Worker("bare", processor, opts)  # concurrency 1 for the one-at-a-time round trip
    worker.on("completed", completed)

    async def one(i: int) -> None:
        arrived[f"j{i}"] = asyncio.get_running_loop().create_future()
        await queue.add("bare", {"n": i}, {"jobId": f"j{i}", "removeOnComplete": True})
        await arrived[f"j{i}"]

    try:
        figures: dict[str, float] = await _timed(n, one)
        await worker.close(force=True)
        worker = Worker("bare", processor, opts | {"concurrency": IN_FLIGHT})
        worker.on("completed", completed)
        started = time.perf_counter()
        for first in range(0, bulk, IN_FLIGHT):
            await asyncio.gather(
                *(one(-100 - i) for i in range(first, min(first + IN_FLIGHT, bulk)))
            )
        figures["throughput"] = round(bulk / (time.perf_counter() - started))
        return figures
    finally:
        await worker.close(force=True)
        await queue.close()


async def _bare_rabbitmq(name: str, n: int, kind: str, bulk: int) -> dict[str, float]:
    connection = await aio_pika.connect(AMQP)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(name, durable=True, arguments={"x-queue-type": kind})
        inbox: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
        consuming = await connection.channel()  # as the transport does: its own channel
        await consuming.set_qos(prefetch_count=IN_FLIGHT)
        source = await consuming.get_queue(name)
        tag = await source.consume(inbox.put, no_ack=False)

        async def one(i: int) -> None:
            message = aio_pika.Message(b"{}", delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
            await channel.default_exchange.publish(message, name)
            await (await inbox.get()).ack()

        try:
            figures: dict[str, float] = await _timed(n, one)
            started = time.perf_counter()
            for first in range(0, bulk, IN_FLIGHT):
                await asyncio.gather(*(one(i) for i in range(first, min(first + IN_FLIGHT, bulk))))
            figures["throughput"] = round(bulk / (time.perf_counter() - started))
            return figures
        finally:
            await source.cancel(tag)
            await consuming.close()
            await channel.queue_delete(name)


async def _bullmq(smoke: bool) -> dict[str, Any]:
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    n, bulk = (100, 300) if smoke else (2000, 5000)
    transport = open_transport(f"bullmq://127.0.0.1:6379/{REDIS_DB}?prefix={prefix}")
    try:
        return {"bare": await _bare_bullmq(prefix, n, bulk)} | await _through_transport(
            transport, n, bulk
        )
    finally:
        await transport.close()
        client = redis.Redis(db=REDIS_DB)
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for first in range(0, len(keys), 500):
            client.delete(*keys[first : first + 500])


async def _rabbitmq(smoke: bool) -> dict[str, Any]:
    prefix = f"bench-{uuid.uuid4().hex[:8]}."
    n, bulk = (100, 300) if smoke else (2000, 5000)
    transport: Any = open_transport(f"{AMQP}?prefix={prefix}")
    try:
        bare = {
            "bare": await _bare_rabbitmq(f"{prefix}bare", n, "quorum", bulk),
            "bare_classic": await _bare_rabbitmq(f"{prefix}bare-classic", n, "classic", bulk),
        }
        return bare | await _through_transport(transport, n, bulk)
    finally:
        await transport.close()
        connection = await aio_pika.connect(AMQP)
        async with connection:
            channel = await connection.channel()
            for name in sorted(transport.declared):
                await channel.queue_delete(name)


def run(smoke: bool) -> dict[str, Any]:
    return {"bullmq": run_loop(_bullmq(smoke)), "rabbitmq": run_loop(_rabbitmq(smoke))}


if __name__ == "__main__":
    print(json.dumps(run(smoke="--smoke" in sys.argv), indent=2))
