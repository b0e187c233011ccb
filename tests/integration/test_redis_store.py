"""Many writers on one run in Redis: asyncio tasks, OS processes and two whole engines.

Every writer loads, commits with compare-and-set and retries on conflict; afterwards the version,
the history and the released outbox entries must account for every successful commit exactly
once (no lost update, no double release). The races use the shared server (database 15, a fresh
key prefix per test). The file doubles as the child program of the multi-process test
(``python this_file.py child <url> <name> <times>``).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from accord.adapters import open_store, open_transport
from accord.adapters.clock import SystemClock
from accord.adapters.stores.redis import RedisStore
from accord.engine.machine.encoding import EncodedDoc
from accord.engine.ports import Commit, OutboxEntry, Store, StoredRun
from accord.engine.runtime.orchestrator import Engine
from accord.errors import ConflictError, StoreError
from accord.testing.plans import model_ingest_shape

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # tests/integration is no package: reach tests.services from the root
    sys.path.insert(0, ROOT)
from engine_shell_support import ACTIONS, assert_drained, wait_terminal, worker_fleet  # noqa: E402
from tests.services import ensure_redis, redis_url  # noqa: E402

from accord.engine.runtime.orchestrator import EngineOptions  # noqa: E402

# the child is this file run as a script: give it the repository root too
CHILD_ENV = {**os.environ, "PYTHONPATH": ROOT}


# ---- helpers -------------------------------------------------------------------------------------


def box(entry_id: str, run_id: str = "r1") -> OutboxEntry:
    return OutboxEntry(entry_id, run_id, "job:q", {"id": entry_id}, created_at_ms=1)


async def bump(store: Store, run_id: str, name: str, times: int) -> int:
    """Increment ``count`` ``times`` by load / commit / retry-on-conflict; returns conflicts.
    Each commit appends one history entry and releases one outbox entry named after it."""
    conflicts = 0
    for n in range(times):
        while True:
            run = await store.load(run_id)
            assert run is not None
            commit = Commit(
                run_id, run.version, {"count": run.state["count"] + 1},
                [{"by": name, "n": n}], [box(f"{name}-{n}", run_id)],
            )  # fmt: skip
            try:
                await store.commit(commit)
                break
            except ConflictError:
                conflicts += 1
    return conflicts


# ---- concurrency ------------------------------------------------------------------------------


async def test_many_tasks_on_one_run_lose_no_update_and_release_nothing_twice() -> None:
    ensure_redis()
    url = redis_url()
    handles = [await RedisStore.connect(url) for _ in range(3)]
    await handles[0].commit(Commit("shared", 0, {"count": 0}))
    tasks, times = 12, 10
    conflicts = await asyncio.gather(
        *(bump(handles[n % 3], "shared", f"t{n}", times) for n in range(tasks))
    )
    run = await handles[1].load("shared")
    assert run is not None
    assert sum(conflicts) > 0  # the tasks really raced
    assert run.state == {"count": tasks * times}
    assert run.version == 1 + tasks * times
    history = await handles[2].history("shared")
    assert sorted((h["by"], h["n"]) for h in history) == sorted(
        (f"t{t}", n) for t in range(tasks) for n in range(times)
    )
    released = await handles[0].claim_outbox(10_000, "check", 60_000)
    assert sorted(e.entry_id for e in released) == sorted(
        f"t{t}-{n}" for t in range(tasks) for n in range(times)
    )
    for handle in handles:
        await handle.close()


async def test_a_commit_cancelled_before_its_group_is_sent_is_not_sent() -> None:
    ensure_redis()
    store = await RedisStore.connect(redis_url())
    tasks = [
        asyncio.create_task(store.commit(Commit(f"r{n}", 0, {"n": n}, [{"n": n}])))
        for n in range(5)
    ]
    await asyncio.sleep(0)  # every task has queued its commit; the flusher has not run yet
    tasks[2].cancel()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(outcomes[2], asyncio.CancelledError)
    assert [outcomes[n] for n in (0, 1, 3, 4)] == [1, 1, 1, 1]
    assert await store.load("r2") is None
    assert (await store.load("r3")) == StoredRun("r3", 1, {"n": 3})
    await store.close()


async def test_the_state_text_an_encoded_doc_carries_is_stored_as_it_is() -> None:
    """The store takes the carried text and never encodes the document again (this one could
    not be encoded: a set is no JSON); other documents are encoded, naming the field that fails."""
    ensure_redis()
    store = await RedisStore.connect(redis_url())
    text = '{"a":[1,2],"b":null}'
    await store.commit(Commit("r1", 0, EncodedDoc({"a": {1, 2}, "b": None}, text), [{}]))
    assert await store.client.hget(store.keys.run("r1").record, "state") == text
    assert await store.load("r1") == StoredRun("r1", 1, {"a": [1, 2], "b": None})
    bad = Commit("r1", 1, {}, [{"ok": 1}, {"no": {1, 2}}], [box("o1")])
    with pytest.raises(StoreError, match=r"history\[1\] is not JSON-serialisable"):
        await store.commit(bad)
    with pytest.raises(StoreError, match=r"outbox\[0\]\.payload"):
        await store.commit(Commit("r1", 1, {}, outbox=[OutboxEntry("o1", "r1", "q", {"x": b""})]))
    await store.close()


async def child(url: str, name: str, times: int) -> dict[str, Any]:
    store = open_store(url)
    conflicts = await bump(store, "shared", name, times)
    await store.close()
    return {"conflicts": conflicts}


def test_several_processes_on_one_run_lose_no_update() -> None:
    ensure_redis()
    url = redis_url()

    async def create() -> None:
        store = await RedisStore.connect(url)
        await store.commit(Commit("shared", 0, {"count": 0}))
        await store.close()

    asyncio.run(create())
    procs, times = 4, 25
    children = [
        subprocess.Popen(
            [sys.executable, __file__, "child", url, f"p{n}", str(times)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=CHILD_ENV,
        )
        for n in range(procs)
    ]
    for proc in children:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "conflicts" in json.loads(out.strip().splitlines()[-1])

    async def check() -> None:
        store = await RedisStore.connect(url)
        run = await store.load("shared")
        assert run is not None
        assert (run.version, run.state) == (1 + procs * times, {"count": procs * times})
        history = await store.history("shared")
        assert sorted((h["by"], h["n"]) for h in history) == sorted(
            (f"p{p}", n) for p in range(procs) for n in range(times)
        )
        released = await store.claim_outbox(10_000, "check", 60_000)
        assert len({e.entry_id for e in released}) == len(released) == procs * times
        await store.close()

    asyncio.run(check())


# ---- the engine on Redis ----------------------------------------------------------------------


async def test_two_engines_share_one_redis_store_and_every_run_completes() -> None:
    """Two engines, each with its own Redis connection (as two processes have), compete for
    outcomes, timers and the outbox; every run completes, replays to its record, and drains."""
    ensure_redis()
    url, clock = redis_url(), SystemClock()
    transport = open_transport("memory://", clock=clock)
    plan = model_ingest_shape(name="on-redis", lookup_action=True, finaliser=True)
    engines = [
        Engine(
            open_store(url, clock=clock),
            transport,
            clock,
            options=EngineOptions(poll_ms=10, owner=f"engine-{i}"),
            actions=ACTIONS,
        )
        for i in range(2)
    ]
    await engines[0].register_plan(plan)
    for engine in engines:
        await engine.start()
    try:
        async with worker_fleet(transport):
            runs = [
                await engines[i % 2].start_run(plan.name, {"modelId": f"m{i}"}) for i in range(12)
            ]
            await wait_terminal(engines[1].store, runs)
        for engine in engines:
            await engine.executor.wait_idle()
        finished = await assert_drained(engines[0], plan, runs)
        assert {r.status for r in finished} == {"completed"}
        assert all(e.transitions > 0 for e in engines)
    finally:
        for engine in engines:
            await engine.stop()
            await engine.store.close()
        await transport.close()


if __name__ == "__main__":
    _, role, url_arg, name_arg, times_arg = sys.argv
    assert role == "child"
    print(json.dumps(asyncio.run(child(url_arg, name_arg, int(times_arg)))))
