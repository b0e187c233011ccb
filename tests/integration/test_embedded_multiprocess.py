"""Several OS processes on one SQLite file: the embedded store and queue stay correct.

The test file doubles as the child program (``python this_file.py <role> …``), so each child is a
real, separate interpreter with its own connection; results come back as one JSON line on stdout.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from accord.adapters import open_store, open_transport
from accord.engine.ports import Commit, Timer
from accord.errors import ConflictError, StoreError

QUEUE_OPTS = "synchronous=NORMAL&visibility_ms=400&poll_ms=10"


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def results(procs: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, stderr
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


# ---- children ---------------------------------------------------------------------------------


async def child_increment(url: str, name: str, times: int) -> dict[str, Any]:
    store = open_store(url)
    conflicts = 0
    for n in range(times):
        while True:
            run = await store.load("shared")
            assert run is not None
            state = {"count": run.state["count"] + 1}
            try:
                await store.commit(Commit("shared", run.version, state, [{"by": name, "n": n}]))
                break
            except ConflictError:
                conflicts += 1
            except StoreError as exc:
                if not exc.retryable:
                    raise
    await store.close()
    return {"conflicts": conflicts}


async def child_claim_timers(url: str, name: str) -> dict[str, Any]:
    store = open_store(url)
    claimed: list[str] = []
    while batch := await store.claim_timers(10**6, 2, name, 60_000):
        claimed += [t.timer_id for t in batch]
    await store.close()
    return {"claimed": claimed}


async def child_publish(url: str, count: int) -> dict[str, Any]:
    transport = open_transport(url)
    for n in range(count):
        await transport.publish("jobs", f"m{n:04}", f"body-{n}".encode())
    await transport.close()
    return {}


async def child_consume(url: str, crash_after: int) -> dict[str, Any]:
    transport = open_transport(url)
    acked: list[list[Any]] = []
    stream = transport.consume("jobs", prefetch=4)
    taken = 0
    while True:
        try:
            async with asyncio.timeout(1.5):  # idle well past the visibility timeout: drained
                delivery = await anext(stream)
        except TimeoutError:
            break
        taken += 1
        if crash_after:
            if taken == crash_after:
                os._exit(0)  # die holding leased, unacked deliveries
            continue
        assert delivery.body == f"body-{int(delivery.message_id[1:])}".encode()
        await transport.ack(delivery)
        acked.append([delivery.message_id, delivery.delivery_count])
    await transport.close()
    return {"acked": acked}


# ---- tests ------------------------------------------------------------------------------------


async def test_concurrent_cas_commits_from_processes_lose_no_update(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db?synchronous=NORMAL"
    store = open_store(url)
    await store.commit(Commit("shared", 0, {"count": 0}, [{"by": "parent", "n": 0}]))
    workers, times = 4, 40
    outcome = results([spawn("increment", url, f"w{w}", str(times)) for w in range(workers)])
    run = await store.load("shared")
    history = await store.history("shared")
    await store.close()
    assert run is not None
    assert run.version == 1 + workers * times
    assert run.state == {"count": workers * times}
    expected = [{"by": f"w{w}", "n": n} for w in range(workers) for n in range(times)]
    assert history[0] == {"by": "parent", "n": 0}
    assert sorted(history[1:], key=lambda h: (h["by"], h["n"])) == expected
    for name in (f"w{w}" for w in range(workers)):  # each writer's commits stay in its order
        assert [h["n"] for h in history if h["by"] == name] == list(range(times))
    assert sum(o["conflicts"] for o in outcome) >= 0


async def test_each_due_timer_is_claimed_by_one_process(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/timers.db?synchronous=NORMAL"
    store = open_store(url)
    timers = [Timer(f"t{n:03}", "r", n, {}) for n in range(120)]
    await store.commit(Commit("r", 0, {}, timers_set=timers))
    await store.close()
    claims = results([spawn("claim", url, f"p{p}") for p in range(3)])
    everything = [t for c in claims for t in c["claimed"]]
    assert sorted(everything) == [t.timer_id for t in timers]


async def test_processes_share_one_embedded_queue_without_loss(tmp_path: Path) -> None:
    url = f"embedded+sqlite:///{tmp_path}/queue.db?{QUEUE_OPTS}"
    count = 200
    results([spawn("publish", url, str(count)) for _ in range(2)])  # same ids twice: deduped
    crasher = spawn("consume", url, "4")
    crasher.communicate(timeout=60)
    started = time.monotonic()
    acked = [a for r in results([spawn("consume", url, "0") for _ in range(3)]) for a in r["acked"]]
    ids = [message_id for message_id, _ in acked]
    assert sorted(ids) == [f"m{n:04}" for n in range(count)]  # each acked exactly once
    redelivered = [message_id for message_id, deliveries in acked if deliveries > 1]
    assert len(redelivered) >= 1  # the crashed consumer's leases lapsed and were delivered again
    transport = open_transport(url)
    assert await transport.dead_letters("jobs") == []
    await transport.close()
    assert time.monotonic() - started < 30


def main(role: str, *args: str) -> None:
    jobs = {
        "increment": lambda: child_increment(args[0], args[1], int(args[2])),
        "claim": lambda: child_claim_timers(args[0], args[1]),
        "publish": lambda: child_publish(args[0], int(args[1])),
        "consume": lambda: child_consume(args[0], int(args[1])),
    }
    print(json.dumps(asyncio.run(jobs[role]())))


if __name__ == "__main__":
    main(*sys.argv[1:])
