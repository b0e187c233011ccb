"""The BullMQ transport on the real Redis: what is BullMQ's own (the shared Transport contract
runs over it in tests/contract): a consumer killed with -9, leases lapsing, the dedup window
ending, job-id mapping, measured delay precision, jobs of other BullMQ producers (their own
options, BullMQ's deferred failures, data that is not JSON), what the fetch loop leaves in Redis
(jobs given back unlocked and uncounted, no stale marker) and an ack taking the next job.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from accord.adapters import open_transport
from accord.adapters.transports.bullmq import BullmqTransport, job_id_for, message_id_of
from accord.errors import TransportError
from accord.testing.clock import FakeClock

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # tests/integration is no package: reach tests.* from the root
    sys.path.insert(0, ROOT)
from tests.contract import test_transport as contract  # noqa: E402
from tests.services import REDIS_DB, ensure_redis, held_open  # noqa: E402

OPTS = "visibility_ms=1000&max_deliveries=3&dedup_ms=1000&stalled_ms=300"


def url_for(prefix: str, opts: str = OPTS) -> str:
    return f"bullmq://127.0.0.1:6379/{REDIS_DB}?prefix={prefix}&{opts}"


@pytest.fixture
def prefix() -> Any:
    ensure_redis()
    name = f"tb-{uuid.uuid4().hex[:10]}"
    yield name
    client = held_open(redis.Redis(port=6379, db=REDIS_DB))
    keys = list(client.scan_iter(match=f"{name}:*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture
async def opener(prefix: str, clock: FakeClock) -> AsyncIterator[Callable[[], BullmqTransport]]:
    opened: list[Any] = []

    def make(opts: str = OPTS) -> BullmqTransport:
        handle = open_transport(url_for(prefix, opts), clock=clock)
        opened.append(handle)
        assert isinstance(handle, BullmqTransport)
        return handle

    yield make
    for handle in opened:
        await handle.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@given(st.text(min_size=1, max_size=60))
def test_job_ids_are_valid_for_node_bullmq_and_map_back(message_id: str) -> None:
    job_id = job_id_for(message_id)
    assert ":" not in job_id
    assert not job_id.lstrip("-").isdigit()
    assert message_id_of(job_id) == message_id


async def test_bullmq_stores_the_mapped_id_and_refuses_a_second_job(
    opener: Callable[[], BullmqTransport], prefix: str
) -> None:
    transport = opener()
    await transport.publish("q", "run:1/stage:2", b"first")
    await transport.publish("q", "run:1/stage:2", b"again")
    client = held_open(redis.Redis(port=6379, db=REDIS_DB, decode_responses=True))
    assert client.lrange(f"{prefix}:q:wait", 0, -1) == ["m-run%3A1/stage%3A2"]
    async with contract.consumer(transport) as stream:
        (got,) = await contract.take(stream)
        assert (got.message_id, got.body) == ("run:1/stage:2", b"first")
        await transport.ack(got)


async def test_the_dedup_window_ends_after_dedup_ms(opener: Callable[[], BullmqTransport]) -> None:
    transport = opener()
    await transport.publish("q", "m1", b"first")
    async with contract.consumer(transport) as stream:
        (got,) = await contract.take(stream)
        await transport.ack(got)
        await transport.publish("q", "m1", b"inside-the-window")
        assert await contract.nothing_within(stream)
        await asyncio.sleep(1.1)  # dedup_ms=1000, and no later job completed to clean it up
        await transport.publish("q", "m1", b"later")
        (again,) = await contract.take(stream)
        assert (again.body, again.delivery_count) == (b"later", 1)
        await transport.ack(again)


async def test_a_job_from_another_bullmq_producer_is_served_by_its_own_options(
    opener: Callable[[], BullmqTransport], prefix: str
) -> None:
    transport = opener()
    data = {"message_id": "foreign:1", "body": "{}"}
    await transport.queue("q").add("other", data, {"jobId": "f1", "removeOnComplete": True})
    async with contract.consumer(transport) as stream:
        (got,) = await contract.take(stream)
        assert (got.message_id, got.body, got.delivery_count) == ("foreign:1", b"{}", 1)
        await transport.ack(got)
    client = held_open(redis.Redis(port=6379, db=REDIS_DB, decode_responses=True))
    assert not client.exists(f"{prefix}:q:f1")  # removeOnComplete: true, as a BullMQ worker does
    assert client.zcard(f"{prefix}:q:completed") == 0


async def test_a_job_bullmq_gave_up_on_is_dead_lettered_not_handed_out(
    opener: Callable[[], BullmqTransport], prefix: str
) -> None:
    transport = opener()
    await transport.publish("q", "stalled-often", b"x")
    client = held_open(redis.Redis(port=6379, db=REDIS_DB, decode_responses=True))
    reason = "job stalled more than allowable limit"  # what BullMQ's stalled check records
    client.hset(f"{prefix}:q:{job_id_for('stalled-often')}", "defa", reason)
    async with contract.consumer(transport) as stream:
        assert await contract.nothing_within(stream, 0.3)
    (dead,) = await transport.dead_letter_details("q")
    assert (dead["message_id"], dead["reason"]) == ("stalled-often", reason)


async def test_a_job_whose_data_is_not_json_is_dead_lettered_and_consuming_goes_on(
    opener: Callable[[], BullmqTransport], prefix: str
) -> None:
    transport = opener()
    await transport.publish("q", "broken", b"x")
    await transport.publish("q", "fine", b"ok")
    client = held_open(redis.Redis(port=6379, db=REDIS_DB, decode_responses=True))
    broken = job_id_for("broken")
    client.hset(f"{prefix}:q:{broken}", "data", "{not json")
    async with contract.consumer(transport) as stream:
        (got,) = await contract.take(stream)
        assert got.message_id == "fine"
        await transport.ack(got)
    assert client.zrange(f"{prefix}:q:failed", 0, -1) == [broken]
    assert "not JSON" in str(client.hget(f"{prefix}:q:{broken}", "failedReason"))


async def test_jobs_taken_but_not_handed_out_go_back_unlocked_and_uncounted(
    opener: Callable[[], BullmqTransport], prefix: str
) -> None:
    transport = opener()
    for n in range(4):
        await transport.publish("q", f"m{n}", b"x")
    async with contract.consumer(transport, prefetch=4) as stream:
        (first,) = await contract.take(stream)
        await transport.ack(first)
        async with asyncio.timeout(5):
            while await transport.queue("q").getWaitingCount():  # the rest are taken too
                await asyncio.sleep(0.01)
    client = held_open(redis.Redis(port=6379, db=REDIS_DB, decode_responses=True))
    back = [job_id_for(f"m{n}") for n in (1, 2, 3)]
    assert client.lrange(f"{prefix}:q:wait", 0, -1) == back[::-1]  # m1 is next in line
    assert client.llen(f"{prefix}:q:active") == 0
    for job in back:
        assert client.hget(f"{prefix}:q:{job}", "ats") == "0"
        assert not client.exists(f"{prefix}:q:{job}:lock")


async def test_an_ack_takes_the_next_job_on_the_way(
    opener: Callable[[], BullmqTransport], prefix: str
) -> None:
    transport = opener()
    await transport.publish("q", "m1", b"x")
    await transport.publish("q", "m2", b"x")
    client = held_open(redis.Redis(port=6379, db=REDIS_DB, decode_responses=True))
    async with contract.consumer(transport) as stream:  # prefetch 1: m2 waits for room
        (got,) = await contract.take(stream)
        assert client.lrange(f"{prefix}:q:wait", 0, -1) == [job_id_for("m2")]
        await transport.ack(got)
        assert client.lrange(f"{prefix}:q:active", 0, -1) == [job_id_for("m2")]  # taken already
        (second,) = await contract.take(stream)
        assert second.message_id == "m2"
        await transport.ack(second)
        assert await contract.nothing_within(stream)
        # an idle consumer leaves no "jobs waiting" marker behind: it waits, it does not poll
        assert client.zscore(f"{prefix}:q:marker", "0") is None


CONSUMER = """
import asyncio, sys
from accord.adapters import open_transport

async def main():
    transport = open_transport(sys.argv[1])
    stream = transport.consume("q")
    delivery = await anext(stream)
    print(delivery.message_id, delivery.delivery_count, flush=True)
    await asyncio.sleep(3600)  # holds the job, renewing its lock, until killed

asyncio.run(main())
"""


async def test_a_job_whose_consumer_is_killed_is_redelivered_with_a_higher_count(
    opener: Callable[[], BullmqTransport], prefix: str
) -> None:
    transport = opener()
    await transport.publish("q", "accepted-job", b"x")
    child = subprocess.Popen(
        [sys.executable, "-c", CONSUMER, url_for(prefix)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 20)
        assert line.split() == ["accepted-job", "1"]
        async with contract.consumer(transport) as stream:
            await asyncio.sleep(1.5)  # longer than the lock: renewal keeps the job with the child
            assert await contract.nothing_within(stream)
            child.kill()  # -9: no cleanup, the lock just stops being renewed
            async with asyncio.timeout(10):
                again = await anext(stream)
            assert (again.message_id, again.delivery_count) == ("accepted-job", 2)
            await transport.ack(again)
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


async def test_leases_lapsing_past_the_limit_dead_letter_and_stale_acks_do_nothing(
    opener: Callable[[], BullmqTransport],
) -> None:
    transport = opener()
    await transport.publish("q", "crashy", b"x")
    held = []
    for attempt in (1, 2, 3):
        stream = transport.consume("q")
        async with asyncio.timeout(10):
            held.append(await anext(stream))
        assert held[-1].delivery_count == attempt
        await stream.aclose()  # type: ignore[attr-defined]  # stops renewing: the lease lapses
    await transport.ack(held[0])  # superseded receipt: changes nothing
    async with contract.consumer(transport) as stream:
        with pytest.raises(TimeoutError):  # redelivered once more it would pass the limit ...
            async with asyncio.timeout(3):
                await anext(stream)  # ... so it is dead-lettered instead of handed out
    (dead,) = await transport.dead_letter_details("q")
    assert dead["message_id"] == "crashy" and dead["delivery_count"] == 3
    assert "lapsed" in dead["reason"]


async def test_nacks_past_the_limit_dead_letter_stamped_by_the_clock(
    opener: Callable[[], BullmqTransport], clock: FakeClock
) -> None:
    transport = opener()
    await transport.publish("q", "poison", b"bad")
    async with contract.consumer(transport) as stream:
        for attempt in (1, 2, 3):
            (got,) = await contract.take(stream)
            assert got.delivery_count == attempt
            await transport.nack(got)
        assert await contract.nothing_within(stream)
    (dead,) = await transport.dead_letter_details("q")
    assert (dead["body"], dead["delivery_count"], dead["dead_at_ms"]) == (
        b"bad",
        3,
        clock.now_ms(),
    )
    assert "nacked" in dead["reason"]
    await transport.publish("q", "poison", b"again")  # a dead letter stays known
    assert [d.body for d in await transport.dead_letters("q")] == [b"bad"]


async def test_delays_are_precise_to_well_under_a_second(
    opener: Callable[[], BullmqTransport],
) -> None:
    transport = opener()
    late: list[float] = []
    async with contract.consumer(transport) as stream:
        for n, delay_ms in enumerate((150, 300, 450)):
            started = time.perf_counter()
            await transport.publish("q", f"d{n}", b"x", delay_ms=delay_ms)
            (got,) = await contract.take(stream)
            late.append((time.perf_counter() - started) * 1000 - delay_ms)
            assert late[-1] >= -5  # never early (a few ms of timestamp rounding aside)
            await transport.ack(got)
    assert max(late) < 500, f"delivered {late} ms after the delay"  # whole seconds without the fix


async def test_callers_sharing_a_stream_share_one_fetch_loop(
    opener: Callable[[], BullmqTransport], prefix: str
) -> None:
    transport = opener()
    stream = transport.consume("q", prefetch=8)
    waiting = [asyncio.ensure_future(anext(stream)) for _ in range(8)]
    for n in range(8):
        await transport.publish("q", f"m{n}", b"x")
    async with asyncio.timeout(5):
        got = await asyncio.gather(*waiting)
    assert sorted(d.message_id for d in got) == [f"m{n}" for n in range(8)]
    clients = held_open(redis.Redis(port=6379, db=REDIS_DB, decode_responses=True).client_list())
    assert sum(c["name"] == f"{prefix}:q" for c in clients) == 1  # one loop, one connection
    for delivery in got:
        await transport.ack(delivery)
    await stream.aclose()  # type: ignore[attr-defined]


async def test_an_unreachable_redis_is_a_retryable_error() -> None:
    transport = open_transport("bullmq://127.0.0.1:1/0")
    with pytest.raises(TransportError) as failed:
        await transport.publish("q", "m1", b"x")
    assert failed.value.retryable
    await transport.close()


async def test_a_delivery_can_be_acked_after_its_stream_closed(
    opener: Callable[[], BullmqTransport],
) -> None:
    transport = opener()
    await transport.publish("q", "m1", b"x")
    stream = transport.consume("q")
    (held,) = await contract.take(stream)
    await stream.aclose()  # type: ignore[attr-defined]
    await transport.ack(held)  # settled through the transport's own connection
    async with contract.consumer(transport) as again:
        with pytest.raises(TimeoutError):  # past the lock and a stalled check: not redelivered
            async with asyncio.timeout(3):
                await anext(again)
    assert await transport.dead_letters("q") == []
