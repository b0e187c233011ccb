"""Joint commits on one SQLite file: jobs published and outcomes acknowledged by the commit.

With the store and the embedded queue on one connection, a transition's job message is written by
the transition's own transaction (nothing in the outbox, nothing for the dispatcher), an outcome
is acknowledged by the commit of the event it carried, and leases (claims) skip their own fsync.
Each check reads the file through a separate connection, so it sees only what was committed.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from engine_shell_support import assert_drained, wait_terminal, worker_fleet

from accord.adapters import open_engine, open_transport
from accord.adapters._sqlite import Database
from accord.adapters.clock import SystemClock
from accord.adapters.transports.embedded import EmbeddedTransport
from accord.engine.runtime.intake import OUTCOMES_QUEUE
from accord.engine.runtime.orchestrator import EngineOptions
from accord.errors import StoreError
from accord.testing.plans import QUEUES, model_ingest_shape
from accord.testing.workers import outcome

PLAN = model_ingest_shape(name="joint-shape")


def _rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(sql).fetchall()


async def test_the_commit_itself_queues_the_job_and_the_outbox_stays_empty(tmp_path: Path) -> None:
    db = tmp_path / "joint.db"
    engine = open_engine(f"sqlite:///{db}", f"sqlite:///{db}", SystemClock())
    published = engine.dispatcher.published
    try:
        await engine.register_plan(PLAN)
        rid = await engine.start_run(PLAN.name, {"modelId": "m1"})
        queued = _rows(db, "SELECT queue, message_id, state FROM accord_queue")
        assert [(q, s) for q, _, s in queued] == [("render", 0)]
        run = await engine.load(rid)
        current = run.stages["render"].current if run else None
        assert current is not None and queued[0][1] == current.job_id
        assert _rows(db, "SELECT entry_id FROM accord_outbox") == []
        assert engine.dispatcher.published == published  # the dispatcher published nothing
    finally:
        await engine.stop()


async def test_outcomes_are_acknowledged_by_the_commit_of_their_event(tmp_path: Path) -> None:
    db = tmp_path / "ack.db"
    engine = open_engine(
        f"sqlite:///{db}", f"sqlite:///{db}", SystemClock(), options=EngineOptions(poll_ms=20)
    )
    transport = engine.transport
    assert isinstance(transport, EmbeddedTransport)
    writes: list[str] = []
    write = transport.db.write

    async def counted(fn: Any, what: str, kind: Any = "store", **options: Any) -> Any:
        writes.append(what)
        return await write(fn, what, kind, **options)

    transport.db.write = counted  # type: ignore[method-assign]
    try:
        await engine.register_plan(PLAN)
        await engine.start()
        async with worker_fleet(open_transport(f"sqlite:///{db}")):
            rid = await engine.start_run(PLAN.name, {"modelId": "m1"})
            await wait_terminal(engine.store, [rid])
        states = _rows(db, f"SELECT state FROM accord_queue WHERE queue = '{OUTCOMES_QUEUE}'")
        assert states and all(s == 1 for (s,) in states)  # every outcome settled
        assert "ack" not in writes and "publish" not in writes and "outbox_done" not in writes
        assert writes.count("commit") == engine.commits
        await assert_drained(engine, PLAN, [rid])
    finally:
        await engine.stop()


async def test_publish_and_ack_answers_and_settles_in_one_step(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    transport = open_transport(url)
    assert isinstance(transport, EmbeddedTransport)
    try:
        envelope = {"messageId": "job-1", "runId": "r", "stage": "render", "attempt": 1,
                    "fence": "f"}  # fmt: skip
        await transport.publish(QUEUES[0], "job-1", b"{}")
        stream = transport.consume(QUEUES[0])
        delivery = await anext(stream)
        await transport.publish_and_ack(OUTCOMES_QUEUE, *outcome(envelope, "succeeded"), delivery)
        answer = await anext(transport.consume(OUTCOMES_QUEUE))
        assert answer.message_id == "job-1:succeeded"
        job = _rows(tmp_path / "q.db", "SELECT state FROM accord_queue WHERE message_id='job-1'")
        assert job == [(1,)]
    finally:
        await transport.close()


async def test_leases_skip_their_fsync_and_a_failing_write_spares_its_group(
    tmp_path: Path,
) -> None:
    db = Database(str(tmp_path / "g.db"))
    try:
        db.ensure_schema("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY)")
        await db.write(
            lambda c: c.execute("INSERT INTO t VALUES ('lease')"), "claim", durable=False
        )
        assert db._sync_now == "NORMAL"
        await db.write(lambda c: c.execute("INSERT INTO t VALUES ('a')"), "commit")
        assert db._sync_now == "FULL"

        def bad(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO t VALUES ('half')")
            raise StoreError("refused half-way")

        # queued together, so the thread runs them as one group transaction
        results = await asyncio.gather(
            db.write(lambda c: c.execute("INSERT INTO t VALUES ('b')"), "commit"),
            db.write(bad, "commit"),
            db.write(lambda c: c.execute("INSERT INTO t VALUES ('c')"), "commit"),
            return_exceptions=True,
        )
        assert isinstance(results[1], StoreError)
        assert not isinstance(results[0], BaseException)
        assert not isinstance(results[2], BaseException)
        keys = await db.read(lambda c: [k for (k,) in c.execute("SELECT k FROM t")], "read")
        assert sorted(keys) == ["a", "b", "c", "lease"]  # 'half' rolled back alone
    finally:
        await db.close()


@pytest.mark.parametrize("synchronous", ["NORMAL", "OFF"])
async def test_weaker_settings_are_never_raised_for_leases(
    tmp_path: Path, synchronous: str
) -> None:
    db = Database(str(tmp_path / "w.db"), synchronous=synchronous)
    try:
        await db.write(lambda c: None, "claim", durable=False)
        await db.write(lambda c: None, "commit")
        assert db._sync_now == synchronous
    finally:
        await db.close()
