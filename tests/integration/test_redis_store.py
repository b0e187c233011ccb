"""The Redis store on real Redis servers: races, failures, restarts and the startup refusals.

The shared store contract runs over Redis from ``tests/contract``; this file covers what only a
real server shows. Races use the shared server (database 15, a fresh key prefix per test); a
restart, a memory squeeze and a wrong eviction policy use a private ``redis-server`` with AOF
``appendfsync always`` in the test's temp directory. The file doubles as the child program of
the multi-process test (``python this_file.py child <url> <name> <times>``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from redis.crc import key_slot

from accord.adapters import open_store
from accord.adapters.stores.memory import MemoryStore
from accord.adapters.stores.redis import RedisStore
from accord.adapters.stores.redis.keys import (
    MAX_UPDATED_AT,
    StoreKeys,
    check_identifier,
    index_member,
    index_prefix,
    order_key,
)
from accord.engine.ports import Commit, OutboxEntry, Store, Timer
from accord.errors import ConflictError, StoreError
from accord.testing.clock import FakeClock

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # tests/integration is no package: reach tests.services from the root
    sys.path.insert(0, ROOT)
from tests.services import PrivateRedis, ensure_redis, redis_url  # noqa: E402

T = TypeVar("T")
# the child is this file run as a script: give it the repository root too
CHILD_ENV = {**os.environ, "PYTHONPATH": ROOT}


# ---- helpers ----------------------------------------------------------------------------------


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


async def keyspace(store: RedisStore) -> dict[str, bytes]:
    """Every key of the store's prefix with its serialised value: equal snapshots mean nothing
    was written in between."""
    client = store.client
    names = sorted([k async for k in client.scan_iter(match=f"{store.keys.prefix}:*")])
    dumps = [await client.execute_command("DUMP", k, NEVER_DECODE=True) for k in names]
    return dict(zip(names, dumps, strict=True))


async def retrying(call: Callable[[], Awaitable[T]]) -> T:
    """What a caller does with a retryable StoreError: try again shortly."""
    for _ in range(100):
        try:
            return await call()
        except StoreError as exc:
            if not exc.retryable:
                raise
            await asyncio.sleep(0.05)
    raise AssertionError("still failing after 100 retries")


@pytest.fixture
async def store() -> AsyncIterator[RedisStore]:
    ensure_redis()
    handle = await RedisStore.connect(redis_url(), FakeClock())
    yield handle
    await handle.close()


@pytest.fixture
def private(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path).start()
    yield server
    server.kill()


# ---- keys (pure) -----------------------------------------------------------------------------

IDENTIFIER = re.compile(r"[A-Za-z0-9._@/+=-]{1,200}")


@given(st.text(max_size=210) | st.from_regex(IDENTIFIER, fullmatch=True))
def test_only_grammatical_identifiers_reach_a_key(value: str) -> None:
    grammatical = IDENTIFIER.fullmatch(value) is not None and ".." not in value.split("/")
    try:
        check_identifier(value, "run id")
    except StoreError:
        assert not grammatical
    else:
        assert grammatical
        assert not set(value) & set(":{}* \n\r\t") and len(value) <= 200


@given(st.from_regex(IDENTIFIER, fullmatch=True), st.integers(1, 64))
def test_every_key_of_a_commit_is_in_one_cluster_slot(run_id: str, shards: int) -> None:
    assume(".." not in run_id.split("/"))
    keys = StoreKeys("accord", shards).run(run_id).commit_keys()
    assert len({key_slot(k.encode()) for k in keys}) == 1


@given(
    st.lists(
        st.tuples(st.integers(0, MAX_UPDATED_AT), st.from_regex(IDENTIFIER, fullmatch=True)),
        min_size=2,
        max_size=20,
    ),
    st.text(min_size=0, max_size=8),
)
def test_index_entries_sort_newest_first_then_by_run_id(
    runs: list[tuple[int, str]], value: str
) -> None:
    members = {index_member("status", value, order_key(at), rid): (at, rid) for at, rid in runs}
    by_bytes = [members[m] for m in sorted(members, key=lambda m: m.encode())]
    assert by_bytes == sorted(members.values(), key=lambda r: (-r[0], r[1]))
    assert all(m.startswith(index_prefix("status", value)) for m in members)


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


# ---- nothing half-written ---------------------------------------------------------------------


async def test_a_refused_commit_script_writes_nothing(store: RedisStore) -> None:
    timers = [Timer("t1", "r1", 100, {"k": 1})]
    await store.commit(Commit("r1", 0, {"v": 1}, [{"h": 1}], [box("o1")], timers, index={"a": "x"}))
    before = await keyspace(store)
    doomed = Commit(
        "r1", 1, {"v": "half"}, [{"h": "half"}], [box("o2")],
        [Timer("t2", "r1", "soon", {})],  # type: ignore[arg-type]  # a due time that is no number
        ["t1"], index={"a": "y"},
    )  # fmt: skip
    with pytest.raises(StoreError, match="refused its arguments"):
        await store.commit(doomed)
    assert await keyspace(store) == before

    keys = store.keys.run("r1").commit_keys()
    good = ["1", '{"v":2}', "9" * 15, "{}", "r1", "1", "0", "0", "0", '{"h":2}']
    malformed = {
        "count mismatch": [*good[:5], "2", *good[6:]],
        "expected not a number": ["one", *good[1:]],
        "index not JSON": [*good[:3], "{oops", *good[4:]],
        "index value not a string": [*good[:3], '{"a":1}', *good[4:]],
        "bad index field": [*good[:3], '{"a b":"1"}', *good[4:]],
        "ordering key short": [*good[:2], "123", *good[3:]],
    }
    for name, args in malformed.items():
        reply = await store.scripts.commit(keys=keys, args=args)
        assert reply[0] == -5, name
        assert await keyspace(store) == before, name
    assert (await store.scripts.commit(keys=keys, args=good))[0] == 2  # the well-formed one lands


async def test_a_run_id_that_cannot_be_a_key_is_refused_before_any_write(
    store: RedisStore,
) -> None:
    for bad in ["a:b", "x{y}", "star*", "line\nbreak", "../up", "a" * 201, ""]:
        with pytest.raises(StoreError):
            await store.commit(Commit(bad, 0, {}, [{"h": 1}], [box("o", bad)]))
        assert await store.load(bad) is None
        assert await store.history(bad) == []
    assert list(await keyspace(store)) == [f"{store.keys.prefix}:meta"]  # nothing but the meta


# ---- leases -----------------------------------------------------------------------------------


async def test_a_crashed_dispatchers_entries_are_reclaimed_after_the_lease() -> None:
    ensure_redis()
    clock, url = FakeClock(), redis_url()
    crashed = await RedisStore.connect(url, clock)
    await crashed.commit(Commit("r1", 0, {}, outbox=[box("o1"), box("o2"), box("o3")]))
    assert len(await crashed.claim_outbox(10, "d1", 1_000)) == 3
    await crashed.close()  # dies without marking anything done
    other = await RedisStore.connect(url, clock)
    assert await other.claim_outbox(10, "d2", 1_000) == []
    clock.advance(1_000)
    taken = await other.claim_outbox(10, "d2", 1_000)
    assert [e.entry_id for e in taken] == ["o1", "o2", "o3"]
    shard = other.keys.run("r1").shard
    pending = await other.client.xpending_range(shard.outbox, "accord", "-", "+", 10)
    assert {(p["consumer"], p["times_delivered"]) for p in pending} == {("d2", 2)}
    third = await RedisStore.connect(url, clock)  # knows nothing of the claim: asks every shard
    await third.outbox_done(["o1", "o2", "o3"])
    assert await other.client.xlen(shard.outbox) == 0
    assert await other.client.xpending_range(shard.outbox, "accord", "-", "+", 10) == []
    clock.advance(5_000)
    assert await third.claim_outbox(10, "d3", 1_000) == []
    for handle in (other, third):
        await handle.close()


async def test_timers_of_many_shards_are_each_claimed_once(store: RedisStore) -> None:
    for n in range(24):
        timer = Timer(f"t{n}", f"run{n}", 100 + n, {"n": n})
        await store.commit(Commit(f"run{n}", 0, {}, timers_set=[timer]))
    assert len({store.keys.shard_of(f"run{n}") for n in range(24)}) == store.keys.shard_count
    second = await RedisStore.connect(
        f"redis://127.0.0.1:6379/15?prefix={store.keys.prefix}&shards=4", store.clock
    )

    async def claimant(handle: RedisStore, owner: str) -> list[str]:
        got: list[str] = []
        while batch := await handle.claim_timers(1_000, 5, owner, 60_000):
            got += [t.timer_id for t in batch]
        return got

    results = await asyncio.gather(*(claimant((store, second)[n % 2], f"o{n}") for n in range(6)))
    assert sorted(t for got in results for t in got) == sorted(f"t{n}" for n in range(24))
    await second.close()


async def test_list_runs_matches_the_memory_store_across_shards(store: RedisStore) -> None:
    memory = MemoryStore(store.clock)
    rnd = random.Random(7)
    versions: dict[str, int] = {}
    for step in range(120):
        run_id = f"run-{rnd.randrange(30):02d}"
        index = {"updated_at": str(rnd.randrange(8))}  # many ties: order then falls to run id
        if rnd.random() < 0.7:
            index["status"] = rnd.choice(["running", "done", "failed"])
        if rnd.random() < 0.5:
            index["region"] = rnd.choice(["eu", "us", "ünï|code"])
        commit = Commit(run_id, versions.get(run_id, 0), {"step": step}, index=index)
        versions[run_id] = await store.commit(commit)
        assert await memory.commit(commit) == versions[run_id]
    queries: list[dict[str, Any]] = [
        {}, {"limit": 7}, {"status": "running"}, {"status": "done", "limit": 3},
        {"region": "ünï|code"}, {"status": "failed", "region": "eu"}, {"tenant": "none"},
    ]  # fmt: skip
    for query in queries:
        want = [(r.run_id, r.version, r.state) for r in await memory.list_runs(**query)]
        got = [(r.run_id, r.version, r.state) for r in await store.list_runs(**query)]
        assert got == want, query


# ---- restarts, memory and startup refusals ----------------------------------------------------


async def test_redis_killed_mid_run_keeps_state_and_history(private: PrivateRedis) -> None:
    store = await RedisStore.connect(private.url(), FakeClock())
    timer = Timer("deadline", "r1", 500, {"kind": "run"})
    await store.commit(Commit("r1", 0, {"step": 0}, [{"step": 0}], timers_set=[timer]))
    for step in range(1, 5):
        await store.commit(Commit("r1", step, {"step": step}, [{"step": step}], [box(f"o{step}")]))
    private.kill()  # SIGKILL: only what AOF (appendfsync always) holds survives
    with pytest.raises(StoreError) as down:
        await store.load("r1")
    assert down.value.retryable
    private.start()
    run = await retrying(lambda: store.load("r1"))
    assert run is not None and (run.version, run.state) == (5, {"step": 4})
    assert await store.history("r1") == [{"step": n} for n in range(5)]
    assert [e.entry_id for e in await store.claim_outbox(10, "d", 1_000)] == [
        f"o{n}" for n in range(1, 5)
    ]
    assert await store.claim_timers(500, 10, "t", 1_000) == [timer]
    # the script cache died with the server: the next commit reloads the script and lands
    done = Commit("r1", 5, {"step": "done"}, [{"step": "done"}], timers_cancel=["deadline"])
    assert await store.commit(done) == 6
    assert [h["step"] for h in await store.history("r1")] == [0, 1, 2, 3, 4, "done"]
    await store.close()


async def test_at_maxmemory_commits_fail_closed(private: PrivateRedis) -> None:
    store = await RedisStore.connect(private.url())
    admin = private.client()
    await store.commit(Commit("r1", 0, {"n": 0}, [{"n": 0}]))
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory", used + 400_000)
    blob, refused, version = "x" * 20_000, None, 1
    for n in range(1, 200):
        try:
            version = await store.commit(Commit("r1", version, {"n": n}, [{"n": n, "b": blob}]))
        except StoreError as exc:
            refused = exc
            break
    assert refused is not None and refused.retryable
    assert "maxmemory" in str(refused)
    run = await store.load("r1")
    assert run is not None and run.version == version
    assert len(await store.history("r1")) == version  # the refused commit left no entry behind
    admin.config_set("maxmemory", 0)
    assert await store.commit(Commit("r1", version, {"n": "after"}, [{"n": "after"}])) == (
        version + 1
    )
    await store.close()


async def test_an_evicting_redis_is_refused(private: PrivateRedis) -> None:
    private.client().config_set("maxmemory-policy", "allkeys-lru")
    with pytest.raises(StoreError, match=r"maxmemory-policy=allkeys-lru.*noeviction"):
        await RedisStore.connect(private.url())
    lazy = open_store(private.url())
    with pytest.raises(StoreError, match="noeviction"):
        await lazy.load("r1")
    await lazy.close()


async def test_persistence_off_is_logged_as_a_warning(
    private: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="accord.store.redis"):
        await (await RedisStore.connect(private.url())).close()
        assert not caplog.records  # AOF with appendfsync always: nothing to say
        private.client().config_set("appendonly", "no")
        await (await RedisStore.connect(private.url(prefix="other"))).close()
    assert any("no persistence" in r.getMessage() for r in caplog.records)


async def test_the_documented_acl_is_enough_and_fences_other_prefixes(
    private: PrivateRedis,
) -> None:
    rules = (  # the rule line of docs/redis.md
        "on >s3cret resetkeys ~accord:* resetchannels"
        " -@all +@read +@write +@stream +@scripting +@connection +info +config|get"
    )
    admin: Any = private.client()  # execute_command is untyped in redis-py
    admin.execute_command("ACL", "SETUSER", "accord", *rules.split())
    url = f"redis://accord:s3cret@127.0.0.1:{private.port}/0?prefix=accord"
    store = await RedisStore.connect(url, FakeClock())
    timers = [Timer("t1", "r1", 5, {})]
    await store.commit(Commit("r1", 0, {}, [{"h": 1}], [box("o1")], timers, index={"a": "b"}))
    assert [e.entry_id for e in await store.claim_outbox(5, "d", 100)] == ["o1"]
    await store.outbox_done(["o1"])
    assert [t.timer_id for t in await store.claim_timers(5, 5, "t", 100)] == ["t1"]
    assert [r.run_id for r in await store.list_runs(a="b")] == ["r1"]
    await store.put_plan("sha256:aa", {"p": 1})
    await store.set_active("wf", "sha256:aa")
    await store.announce("w1", ["cap@1"], 10)
    assert await store.live_capabilities(5) == {"cap@1": ["w1"]}
    await store.close()
    with pytest.raises(StoreError, match="no permissions"):
        await RedisStore.connect(url.replace("prefix=accord", "prefix=elsewhere"))


async def test_a_keyspace_keeps_its_shard_count(store: RedisStore) -> None:
    url = f"redis://127.0.0.1:6379/15?prefix={store.keys.prefix}&shards=8"
    with pytest.raises(StoreError, match="created with shards=4"):
        await RedisStore.connect(url)


if __name__ == "__main__":
    _, role, url_arg, name_arg, times_arg = sys.argv
    assert role == "child"
    print(json.dumps(asyncio.run(child(url_arg, name_arg, int(times_arg)))))
