"""The distributed back-ends of the engine benchmark, and the engine's RSS in a process of its own.

:func:`keyspace` hands :mod:`bench.bench_engine` and :mod:`bench.bench_fleet` (whose engine and
worker processes share them) a store URL and a transport URL on fresh prefixes: the Redis store
(database 15) with the BullMQ transport on the same server, or with RabbitMQ (durable quorum
queues, publisher confirms). Afterwards every key under both prefixes is
deleted and, for RabbitMQ, every queue the transport declared (with the fixed job, outcome and
control queues and their dead-letter queues, in case a declaration was not recorded). The
services must already answer (``make bench-services`` starts them); when they do not, the
benchmark fails with a clear error rather than measuring nothing.

:func:`fresh_rss_mib` runs the SQLite variant once in a new interpreter and reports its peak
resident set (``ru_maxrss``): inside ``python -m bench`` the process has already loaded every
other benchmark module, so its own RSS says more about them than about the engine.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aio_pika
import redis

from accord.engine.runtime.intake import OUTCOMES_QUEUE
from accord.engine.runtime.outbox import control_queue
from accord.testing.plans import QUEUES

REDIS_HOST, REDIS_PORT, REDIS_DB = "127.0.0.1", 6379, 15
AMQP = "amqp://guest:guest@127.0.0.1:5672/"
ROOT = Path(__file__).resolve().parents[1]
# the Redis store's shard count: enough for the fleet's 4 engines, 2 shards each (each shard's
# outcome queue is batched apart by the workers: ACCORD_BENCH_SHARDS measures what that costs)
SHARDS = int(os.environ.get("ACCORD_BENCH_SHARDS", "8"))
FIXED_QUEUES = (  # with the outcome queue of each of the store's shards (SHARDS above)
    *QUEUES,
    OUTCOMES_QUEUE,
    *(f"{OUTCOMES_QUEUE}.s{shard}" for shard in range(SHARDS)),
    *(control_queue(q) for q in QUEUES),
)


def _check_redis() -> None:
    try:
        redis.Redis(host=REDIS_HOST, port=REDIS_PORT, socket_timeout=2).ping()
    except redis.RedisError as exc:
        raise RuntimeError(
            f"Redis on {REDIS_HOST}:{REDIS_PORT} is not answering ({exc});"
            " run `make bench-services`"
        ) from exc


def _check_rabbitmq() -> None:
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=2) as sock:
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            if sock.recv(1) != b"\x01":
                raise OSError("no AMQP handshake")
    except OSError as exc:
        raise RuntimeError(
            f"RabbitMQ on 127.0.0.1:5672 is not answering ({exc}); run `make bench-services`"
        ) from exc


def _delete_keys(prefixes: tuple[str, ...]) -> None:
    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=REDIS_DB)
    try:
        for prefix in prefixes:
            keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
            for first in range(0, len(keys), 500):
                client.delete(*keys[first : first + 500])
    finally:
        client.close()


async def _delete_queues(names: set[str]) -> None:
    connection = await aio_pika.connect(AMQP)
    async with connection:
        channel = await connection.channel()
        for name in sorted(names):
            await channel.queue_delete(name)  # deleting a queue that is absent is a no-op


@contextlib.asynccontextmanager
async def keyspace(broker: str, declared: set[str]) -> AsyncIterator[tuple[str, str]]:
    """``(store URL, transport URL)`` for ``broker`` (``bullmq`` or ``rabbitmq``) on fresh
    prefixes; the caller adds the broker queue names its transport declared to ``declared``
    so they are deleted with the rest. ``postgres``: store and queue in one fresh schema of
    ``BENCH_POSTGRES_DSN`` (the loopback server's ``test`` database), dropped afterwards."""
    if broker == "postgres":
        async with _postgres_schema() as url:
            yield url, url
        return
    _check_redis()
    tag = uuid.uuid4().hex[:10]
    store_prefix, queue_prefix = f"be{tag}", f"beq{tag}"
    store_url = (
        f"redis://{REDIS_HOST}:{REDIS_PORT}/{REDIS_DB}?prefix={store_prefix}&shards={SHARDS}"
    )
    if broker == "bullmq":
        transport_url = f"bullmq://{REDIS_HOST}:{REDIS_PORT}/{REDIS_DB}?prefix={queue_prefix}"
    elif broker == "rabbitmq":
        _check_rabbitmq()
        queue_prefix += "."
        transport_url = f"{AMQP}?prefix={queue_prefix}"
    else:
        raise ValueError(f"unknown broker {broker!r}")
    try:
        yield store_url, transport_url
    finally:
        _delete_keys((store_prefix, queue_prefix))
        if broker == "rabbitmq":
            fixed = {f"{queue_prefix}{q}{dead}" for q in FIXED_QUEUES for dead in ("", ".dead")}
            await _delete_queues(fixed | {n for n in declared if n.startswith(queue_prefix)})


POSTGRES_DSN = os.environ.get("BENCH_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")


@contextlib.asynccontextmanager
async def _postgres_schema() -> AsyncIterator[str]:
    import asyncpg  # only the PostgreSQL configuration needs it

    schema = f"bench_{uuid.uuid4().hex[:10]}"
    try:
        yield f"{POSTGRES_DSN}?schema={schema}"
    finally:
        conn = await asyncpg.connect(POSTGRES_DSN)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()


_RSS_SCRIPT = """
import resource, sys, tempfile
from pathlib import Path
from accord.loop import run as run_loop
from bench.bench_engine import _measure
n = int(sys.argv[1])
with tempfile.TemporaryDirectory(prefix="accord-bench-rss-") as tmp:
    url = f"sqlite:///{Path(tmp) / 'bench.db'}"
    run_loop(_measure(url, url, n, 1))
# VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so a child of a large parent would
# report the parent's peak; VmHWM belongs to this image alone
status = Path("/proc/self/status").read_text().splitlines()
hwm = [line for line in status if line.startswith("VmHWM:")]
peak_kib = int(hwm[0].split()[1]) if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(peak_kib / 1024)
"""


def fresh_rss_mib(n: int) -> float:
    """Peak RSS (MiB) of a new interpreter that runs the SQLite variant once with ``n`` runs."""
    done = subprocess.run(
        [sys.executable, "-c", _RSS_SCRIPT, str(n)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"RSS subprocess failed ({done.returncode}): {done.stderr[-2000:]}")
    return round(float(done.stdout.strip().splitlines()[-1]), 1)
