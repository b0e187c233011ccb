"""Sensitive fields sealed at rest: a real run whose context carries a canary in
``storageConnectionRef`` (marked ``sensitive`` by ``model-ingest-context@1`` and by the request it
is bound into), with a sealing key configured, leaves the canary nowhere in clear: not in the
SQLite store's files (database, WAL and shared memory) nor any other file the run wrote, not in
Redis (every key's value, job hashes included, and the append-only file), not in the DEBUG log,
not in any ``accord runs …`` view; the store holds it only as a token that opens to it, and the
worker's handler still got it in clear. Without a key the same greps find it (the test can fail),
and a retired key still opens what was sealed before a rotation, with the history left as it
was."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import redis
from engine_shell_support import wait_terminal
from typer.testing import CliRunner

from accord.cli import app
from accord.cli._redaction import (
    SEALING_KEY_ENV,
    SEALING_KEYS_ENV,
    configure_logging,
    note_requests,
    run_observer,
    sealing_from_env,
    unconfigure_logging,
)
from accord.contracts.catalog import Catalog
from accord.contracts.fixture_values import message_of
from accord.contracts.sealing import PREFIX, Keyring, is_sealed
from accord.contracts.sources import load_catalog
from accord.worker import Context, RetryableError, Worker
from accord.worker.fleet import ingest_stack
from accord.workflow.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tests/integration is no package: reach tests.* from the root
    sys.path.insert(0, str(ROOT))
import sensitive_support  # noqa: E402
from tests.services import PrivateRedis  # noqa: E402

CANARY = "canary-5eal3d-9b41"
KEY_A = ("k2026a", bytes(range(32)))
KEY_B = ("k2026b", bytes(range(100, 132)))
WORKFLOW = "sealed-extract"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(ROOT / "schemas" / "contracts")


def compiled(tmp_path: Path, catalog: Catalog) -> Plan:
    return sensitive_support.compiled(tmp_path, catalog, WORKFLOW)


def extractor(catalog: Catalog, seen: list[str]) -> Worker:
    """Fails once with a message naming the secret, then answers; logs the request at DEBUG
    and the secret in a traceback, as careless handler code does. ``seen`` gets what it got."""
    contract = catalog.message("technical-metadata@1")
    assert contract is not None
    result = message_of(contract.payload, full=False)
    log = logging.getLogger("accord.worker.handler.sealed")
    worker = Worker("sealed-extract")

    def handle(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        seen.append(payload["storageConnectionRef"])
        try:
            raise OSError(f"cannot open {payload['storageConnectionRef']}")
        except OSError:
            log.exception("opening the model failed")
        log.debug("request %r", payload)
        if len(seen) == 1:
            raise RetryableError(f"storage {payload['storageConnectionRef']} is not reachable")
        return dict(result) | {"modelId": payload["modelId"]}

    worker.bind("metadata.extract@2", handle)
    return worker


def ring(*keys: tuple[str, bytes]) -> Keyring:
    return Keyring(keys[0], dict(keys[1:]))


class Ran(NamedTuple):
    run_id: str
    log: str  # the DEBUG log of the engine and the worker
    seen: list[str]  # what the handler got in storageConnectionRef
    during: list[str]  # files under tmp_path holding the canary while the stack ran
    live: list[str]  # the SQLite files there while it ran


async def one_run(
    tmp_path: Path,
    catalog: Catalog,
    sealing: Keyring | None,
    *,
    url: str,
    transport: str | None = None,
) -> Ran:
    """One run with the canary, on ``url`` (and ``transport``), sealed with ``sealing``."""
    plan = compiled(tmp_path, catalog)
    seen: list[str] = []
    stream = io.StringIO()
    redacting = configure_logging(catalog, "DEBUG", stream)
    worker = extractor(catalog, seen)
    note_requests(worker, redacting, catalog)  # as `accord worker run` does
    try:
        stack = ingest_stack(
            url, plan, catalog, [worker], state=tmp_path / "state", transport=transport,
            sealing=sealing,
        )  # fmt: skip
        async with stack as s:
            s.engine.observers.append(run_observer(redacting, s.engine, catalog))
            context = {"modelId": "m1", "storageConnectionRef": CANARY}
            run_id = await s.engine.start_run(plan.name, context, tenant="acme")
            await wait_terminal(s.engine.store, [run_id], 30)
            done = await s.engine.load(run_id)
            assert done is not None and done.status == "completed", done
            # while the stores are open: SQLite's -wal and -shm files exist only until closed
            during = files_holding(tmp_path, CANARY.encode())
            live = sorted(p.name for p in tmp_path.glob("*.db*"))
    finally:
        unconfigure_logging()
        logging.getLogger("accord").setLevel(logging.NOTSET)
    return Ran(run_id, stream.getvalue(), seen, during, live)


def files_holding(folder: Path, needle: bytes) -> list[str]:
    return sorted(
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file() and needle in p.read_bytes()
    )


def views(url: str, run_id: str) -> dict[str, str]:
    out = {}
    for command in ("show", "history", "explain"):
        for form in ((), ("--json",)):
            args = ["runs", command, run_id, "--store", url, *form]
            out[" ".join((command, *form))] = invoke(*args)
    for form in ((), ("--json",)):
        out[" ".join(("list", *form))] = invoke("runs", "list", "--store", url, *form)
    return out


def invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def stored_context_ref(url: str, run_id: str) -> Any:
    shown = json.loads(invoke("runs", "show", run_id, "--store", url, "--json"))
    assert shown["context"]["storageConnectionRef"] == "***"  # views mask sealed values too
    return shown


# -- the embedded default: SQLite --------------------------------------------------------------


def test_the_sqlite_store_holds_the_canary_only_sealed(tmp_path: Path, catalog: Catalog) -> None:
    keys = ring(KEY_A)
    db = tmp_path / "accord.db"
    url = f"sqlite:///{db}"
    run_id, log, seen, during, live = asyncio.run(one_run(tmp_path, catalog, keys, url=url))
    assert seen and all(s == CANARY for s in seen)  # the worker opened it
    assert {"accord.db", "accord.db-wal", "accord.db-shm"} <= set(live), live
    assert during == [] and files_holding(tmp_path, CANARY.encode()) == []
    assert PREFIX.encode() in db.read_bytes()
    assert CANARY not in log, [line for line in log.splitlines() if CANARY in line]
    assert "opening the model failed" in log and "request {" in log
    leaking = sorted(name for name, out in views(url, run_id).items() if CANARY in out)
    assert leaking == [], f"the canary is shown by: {leaking}"
    stored_context_ref(url, run_id)
    record, history = asyncio.run(_raw(url, run_id))
    token = record["context"]["storageConnectionRef"]
    assert (
        is_sealed(token) and token.startswith(f"{PREFIX}{KEY_A[0]}:") and keys.open(token) == CANARY
    )
    failed = [h["event"] for h in history if h["event"]["kind"] == "stage-failed"]
    assert failed and "storage *** is not reachable" in failed[0]["message"]


def test_without_a_key_the_same_greps_find_the_canary(tmp_path: Path, catalog: Catalog) -> None:
    url = f"sqlite:///{tmp_path / 'accord.db'}"
    ran = asyncio.run(one_run(tmp_path, catalog, None, url=url))
    run_id = ran.run_id
    assert ran.seen and "accord.db-wal" in ran.during, ran.during
    assert "accord.db" in files_holding(tmp_path, CANARY.encode())
    leaking = sorted(name for name, out in views(url, run_id).items() if CANARY in out)
    assert leaking == []  # views are redacted either way


async def _raw(url: str, run_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from accord.adapters import open_store

    store = open_store(url)
    try:
        stored = await store.load(run_id)
        assert stored is not None
        return dict(stored.state), list(await store.history(run_id))
    finally:
        await store.close()


# -- rotation: a retired key still opens, and history is not rewritten -------------------------


def test_a_retired_key_opens_what_it_sealed_and_history_stays(
    tmp_path: Path, catalog: Catalog
) -> None:
    async def scenario() -> None:
        plan = compiled(tmp_path, catalog)
        url = f"sqlite:///{tmp_path / 'accord.db'}"
        state = tmp_path / "state"
        async with ingest_stack(
            url, plan, catalog, [], state=state, sealing=ring(KEY_A), check_admission=False
        ) as s:  # nobody serves the queue yet: the job waits, sealed under the old key
            context = {"modelId": "m1", "storageConnectionRef": CANARY}
            run_id = await s.engine.start_run(plan.name, context, tenant="acme")
            await asyncio.sleep(0.3)
            before = [json.dumps(h, sort_keys=True) for h in await s.engine.store.history(run_id)]
        seen: list[str] = []
        rotated = ring(KEY_B, KEY_A)
        async with ingest_stack(
            url, plan, catalog, [extractor(catalog, seen)], state=state, sealing=rotated
        ) as s:
            await wait_terminal(s.engine.store, [run_id], 30)
            done = await s.engine.load(run_id)
            assert done is not None and done.status == "completed"
            after = [json.dumps(h, sort_keys=True) for h in await s.engine.store.history(run_id)]
            second = await s.engine.start_run(plan.name, context, tenant="acme")
            await wait_terminal(s.engine.store, [second], 30)
            fresh = await s.engine.load(second)
        assert seen[0] == CANARY  # opened with the retired key
        assert after[: len(before)] == before  # the history was not rewritten
        old = done.context["storageConnectionRef"]
        assert old.startswith(f"{PREFIX}{KEY_A[0]}:") and rotated.open(old) == CANARY
        assert fresh is not None
        new = fresh.context["storageConnectionRef"]
        assert new.startswith(f"{PREFIX}{KEY_B[0]}:") and rotated.open(new) == CANARY
        assert files_holding(tmp_path, CANARY.encode()) == []

    asyncio.run(scenario())


# -- Redis + BullMQ, with the append-only file ----------------------------------------------------


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    folder = tmp_path / "redis"
    folder.mkdir()
    # the AOF as plain commands (no RDB preamble, no compression), so a clear value would show
    server = PrivateRedis(folder, "--aof-use-rdb-preamble", "no", "--rdbcompression", "no")
    server.start()
    try:
        yield server
    finally:
        server.kill()


def redis_values(client: redis.Redis) -> dict[str, str]:
    """Every key's value, read by its type (job hashes, streams and sorted sets included)."""
    out: dict[str, str] = {}
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        value: Any
        if kind == "string":
            value = client.get(key)
        elif kind == "hash":
            value = client.hgetall(key)
        elif kind == "list":
            value = client.lrange(key, 0, -1)
        elif kind == "set":
            value = sorted(client.smembers(key))
        elif kind == "zset":
            value = client.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            value = client.xrange(key)
        else:
            value = kind
        out[str(key)] = json.dumps(value, default=str)
    return out


@pytest.mark.parametrize("sealed", [True, False], ids=["with-key", "without-key"])
def test_redis_and_bullmq_hold_the_canary_only_sealed(
    tmp_path: Path, catalog: Catalog, private_redis: PrivateRedis, sealed: bool
) -> None:
    prefix = f"s{uuid.uuid4().hex[:6]}"
    url = private_redis.url(prefix=prefix)
    transport = f"bullmq://127.0.0.1:{private_redis.port}/0?prefix={prefix}q&stalled_ms=300"
    keys = ring(KEY_A) if sealed else None
    ran = asyncio.run(one_run(tmp_path, catalog, keys, url=url, transport=transport))
    run_id, log, seen, during = ran.run_id, ran.log, ran.seen, ran.during
    assert seen and all(s == CANARY for s in seen)
    client = private_redis.client()
    values = redis_values(client)
    jobs = {k: v for k, v in values.items() if k.startswith(f"{prefix}q:") and '"data"' in v}
    assert jobs, sorted(values)  # the broker's job hashes were read
    aof = files_holding(private_redis.directory, CANARY.encode())
    in_keys = sorted(k for k, v in values.items() if CANARY in v)
    if not sealed:  # the greps can find it: the same run without a key leaves it in clear
        assert in_keys and aof, (in_keys, aof)
        return
    assert in_keys == [] and aof == [], (in_keys, aof)
    assert any(PREFIX in v for v in jobs.values())  # the request travelled sealed
    assert files_holding(tmp_path / "state", CANARY.encode()) == [] and during == []
    assert CANARY not in log, [line for line in log.splitlines() if CANARY in line]
    leaking = sorted(name for name, out in views(url, run_id).items() if CANARY in out)
    assert leaking == [], f"the canary is shown by: {leaking}"


# -- configuration: the environment names the keys ----------------------------------------------


def b64(key: bytes) -> str:
    return base64.b64encode(key).decode()


def test_the_environment_configures_the_current_and_retired_keys() -> None:
    env = {
        SEALING_KEY_ENV: f"{KEY_B[0]}:{b64(KEY_B[1])}",
        SEALING_KEYS_ENV: f"{KEY_A[0]}:{b64(KEY_A[1])}",
    }
    keys = sealing_from_env(env)
    assert (
        keys is not None and keys.current == KEY_B[0] and keys.kids == sorted((KEY_A[0], KEY_B[0]))
    )
    assert sealing_from_env({}) is None


def engine_run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    url = f"sqlite:///{tmp_path / 'w.db'}"
    args = ["engine", "run", "--store", url, "--transport", url, "--workflow", "nope"]
    args += ["--state", str(tmp_path / "state")]
    child_env = {
        k: v for k, v in os.environ.items() if k not in (SEALING_KEY_ENV, SEALING_KEYS_ENV)
    }
    return subprocess.run(
        [sys.executable, "-c", "from accord.cli import main; main()", *args],
        capture_output=True, text=True, cwd=ROOT, env=child_env | env, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("value", "named"),
    [("configured", "<key id>:<base64"), (f"k1:{b64(b'short')}", "'k1' is 5 bytes")],
)
def test_a_bad_key_stops_the_engine_with_one_line(tmp_path: Path, value: str, named: str) -> None:
    done = engine_run(tmp_path, **{SEALING_KEY_ENV: value})
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and named in errors[0] and SEALING_KEY_ENV in errors[0], done.stderr
    assert "Traceback" not in done.stderr


def test_a_bad_key_stops_a_worker_with_one_line(tmp_path: Path) -> None:
    env = {SEALING_KEY_ENV: "k1:" + b64(KEY_A[1]), SEALING_KEYS_ENV: "old"}
    args = [
        "worker",
        "run",
        "accord_worker_thumbnail_render.handler:worker",
        "--transport",
        "memory://",
        "--state",
        str(tmp_path / "st"),
    ]
    child_env = {
        k: v for k, v in os.environ.items() if k not in (SEALING_KEY_ENV, SEALING_KEYS_ENV)
    }
    done = subprocess.run(
        [sys.executable, "-c", "from accord.cli import main; main()", *args],
        capture_output=True, text=True, cwd=ROOT, env=child_env | env, timeout=60, check=False,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr
    assert "retired sealing key" in done.stderr


def test_without_a_key_engine_run_warns_at_start_up(tmp_path: Path) -> None:
    done = engine_run(tmp_path)
    assert done.stderr.count("sensitive values are stored in clear at rest") == 1, done.stderr
    keyed = engine_run(tmp_path, **{SEALING_KEY_ENV: f"{KEY_A[0]}:{b64(KEY_A[1])}"})
    assert "stored in clear" not in keyed.stderr, keyed.stderr
