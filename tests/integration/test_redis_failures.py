"""The Redis store when things go wrong: refused scripts, restarts, a full Redis, and refusals.

A commit the script refuses writes nothing (the whole keyspace is compared before and after). A
``redis-server`` killed with SIGKILL and restarted keeps every acknowledged commit (AOF with
``appendfsync always``); at ``maxmemory`` commits fail closed; an evicting server, another
keyspace's shard count and keys outside the ACL'd prefix are refused. Restarts, the memory
squeeze and policy changes use a private server in the test's temp directory, never the shared one.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from accord.adapters import open_store
from accord.adapters.stores.redis import RedisStore
from accord.engine.ports import Commit, OutboxEntry, Timer
from accord.errors import ConflictError, StoreError
from accord.testing.clock import FakeClock

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # tests/integration is no package: reach tests.services from the root
    sys.path.insert(0, ROOT)
from tests.services import PrivateRedis, ensure_redis, redis_url  # noqa: E402

T = TypeVar("T")


# ---- helpers -------------------------------------------------------------------------------------


def box(entry_id: str, run_id: str = "r1") -> OutboxEntry:
    return OutboxEntry(entry_id, run_id, "job:q", {"id": entry_id}, created_at_ms=1)


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
    good = ["1", '{"v":2}', "9" * 15, "{}", "r1", "1", "0", "0", "0", "", "", '{"h":2}']  # no fence
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


# ---- the call group -----------------------------------------------------------------------------


async def test_a_group_meeting_an_empty_script_cache_reloads_each_script_once(
    private: PrivateRedis,
) -> None:
    """Commits, claims and done-marks sent in one group after ``SCRIPT FLUSH``: each script meets
    NOSCRIPT (so it did not run), is loaded again, and every call lands exactly once."""
    store = await RedisStore.connect(private.url(shards=4), FakeClock())
    timers = [Timer(f"t{n}", f"r{n}", 5, {}) for n in range(6)]
    await asyncio.gather(
        *(store.commit(Commit(f"r{n}", 0, {}, [{"n": n}], [box(f"o{n}", f"r{n}")], [timers[n]]))
          for n in range(6))
    )  # fmt: skip
    claimed = await store.claim_outbox(3, "d", 1_000)
    private.client().script_flush()
    commits = [Commit(f"r{n}", 1, {"n": n}, [{"n": n, "again": True}]) for n in range(6)]
    outcomes = await asyncio.gather(
        *(store.commit(c) for c in commits),
        store.claim_timers(5, 10, "t", 1_000),
        store.outbox_done([e.entry_id for e in claimed]),
        store.commit(Commit("r0", 1, {"lost": True})),  # loses the race to commits[0]
        return_exceptions=True,
    )
    assert outcomes[:6] == [2] * 6
    fired: Any = outcomes[6]
    assert sorted(t.timer_id for t in fired) == [t.timer_id for t in timers]
    assert outcomes[7] is None
    assert isinstance(outcomes[8], ConflictError)
    for n in range(6):
        assert await store.history(f"r{n}") == [{"n": n}, {"n": n, "again": True}]
    left = await store.claim_outbox(10, "d2", 1_000)
    assert sorted(e.entry_id for e in left) == sorted(
        {f"o{n}" for n in range(6)} - {e.entry_id for e in claimed}
    )
    await store.close()


async def test_every_call_of_a_group_fails_retryably_while_redis_is_down(
    private: PrivateRedis,
) -> None:
    store = await RedisStore.connect(private.url(), FakeClock())
    await store.commit(Commit("r0", 0, {}))
    private.kill()
    commits = [Commit(f"r{n}", 1 if n == 0 else 0, {"n": n}) for n in range(8)]
    outcomes = await asyncio.gather(
        *(store.commit(c) for c in commits),
        store.claim_timers(5, 10, "t", 1_000),
        return_exceptions=True,
    )
    assert all(isinstance(o, StoreError) and o.retryable for o in outcomes), outcomes
    private.start()
    landed = await retrying(lambda: asyncio.gather(*(store.commit(c) for c in commits)))
    assert landed == [2, 1, 1, 1, 1, 1, 1, 1]
    await store.close()


async def test_many_concurrent_commits_share_one_connection(private: PrivateRedis) -> None:
    store = await RedisStore.connect(private.url(), FakeClock())
    admin = private.client()
    versions = await asyncio.gather(
        *(store.commit(Commit(f"r{n}", 0, {}, [{"n": n}], [box(f"o{n}", f"r{n}")]))
          for n in range(300))
    )  # fmt: skip
    assert versions == [1] * 300
    # the store's pool connection (startup checks), the call group's own one, and this client
    assert len(admin.client_list()) <= 3
    await store.close()
