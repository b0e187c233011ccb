"""The search projection, one suite over every adapter: SQLite with FTS5 and PostgreSQL.

Runs are real: an engine (the testing harness, on a SQLite store) drives model-ingest-shaped runs
to completed, failed and still running, and the projector indexes the telemetry events their
commits wrote to the outbox — in order, reversed, shuffled and duplicated. Whatever the order,
the projection must end equal to documents built from the store, equal to a rebuild, and
searchable the same way on both adapters.
"""

from __future__ import annotations

import dataclasses
import random
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from accord.adapters import open_store
from accord.adapters.projection import open_projection
from accord.engine.ports import Document, JsonValue, Projection, SearchQuery
from accord.engine.runtime.projector import (
    Projector,
    documents_for,
    parse_query,
    rebuild,
    verify,
)
from accord.errors import StoreError
from accord.testing.clock import FakeClock
from accord.testing.harness import EngineHarness
from accord.testing.plans import model_ingest_shape
from tests.services import ensure_postgres

Opener = Callable[..., Projection]


def _sqlite(tmp: Path) -> Callable[..., Projection]:
    path = tmp / f"p-{uuid.uuid4().hex[:6]}.projection.db"
    return lambda **opts: open_projection(f"sqlite:///{path}" + _query(opts))


def _postgres(_tmp: Path) -> Callable[..., Projection]:
    dsn = ensure_postgres()
    schema = f"p_{uuid.uuid4().hex[:12]}"
    _SCHEMAS.append((dsn, schema))
    return lambda **opts: open_projection(f"{dsn}?schema={schema}" + _query(opts, "&"))


def _query(opts: dict[str, Any], sep: str = "?") -> str:
    return (sep + "&".join(f"{k}={v}" for k, v in opts.items())) if opts else ""


_SCHEMAS: list[tuple[str, str]] = []
ADAPTERS = {"sqlite": _sqlite, "postgres": _postgres}


@pytest.fixture(params=sorted(ADAPTERS))
async def opener(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    """Opens handles on one backing index per test (one SQLite file, one PostgreSQL schema)."""
    factory = ADAPTERS[request.param](tmp_path)
    handles: list[Projection] = []

    def open_(**opts: Any) -> Projection:
        handle = factory(**opts)
        handles.append(handle)
        return handle

    yield open_
    for handle in handles:
        await handle.close()
    while _SCHEMAS:
        dsn, schema = _SCHEMAS.pop()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[EngineHarness]:
    clock = FakeClock()
    store = open_store(f"sqlite:///{tmp_path}/runs.db?synchronous=NORMAL", clock=clock)
    sink = _Discard()
    async with EngineHarness(clock=clock, store=store, sink=sink) as h:
        yield h


class _Discard:
    """A sink that takes nothing: the events stay in the outbox for the test to replay."""

    async def emit(self, events: Any) -> None:
        raise StoreError("not taken", retryable=True)


async def _scenario(h: EngineHarness) -> dict[str, str]:
    """Three runs: completed (with a late duplicate report), failed in publish, running."""
    plan = model_ingest_shape(name="model-ingest")
    await h.register(plan)
    done = await h.start_run("model-ingest", {"modelId": "m1"}, tenant="acme")
    failed = await h.start_run("model-ingest", {"modelId": "m2"}, tenant="acme")
    running = await h.start_run("model-ingest", {"modelId": "m3"}, tenant="globex")
    for run in (done, failed):
        for stage in ("render", "analyse", "metadata"):
            await h.accept(run, stage)
            await h.succeed(run, stage, {"ok": True})
        await h.accept(run, "publish")
    await h.succeed(done, "publish", {"ok": True})
    await h.succeed(done, "render", {"ok": True})  # again, after the end: refused, counted
    await h.fail(failed, "publish", code="listing-refused")
    await h.accept(running, "render")
    await h.settle()
    return {"done": done, "failed": failed, "running": running}


async def _events(h: EngineHarness) -> list[dict[str, JsonValue]]:
    return [dict(e.payload) for e in await h.outbox() if e.topic == "telemetry"]


def _projector(h: EngineHarness, projection: Projection, **kw: Any) -> Projector:
    return Projector(h.store, projection, h.clock, backoff_ms=0, **kw)


async def _expected(h: EngineHarness, p: Projector, run_id: str) -> list[Document]:
    stored = await h.store.load(run_id)
    assert stored is not None
    return sorted(
        documents_for(stored, await h.store.history(run_id), await p.plan_version(stored)),
        key=lambda d: d.doc_id,
    )


async def test_a_newer_document_is_never_replaced_by_an_older_or_equal_one(
    opener: Opener,
) -> None:
    p = opener()
    new = Document("r1", "run", "r1", "t", 5, {"kind": "run", "status": "failed", "seq": 5})
    old = Document("r1", "run", "r1", "t", 3, {"kind": "run", "status": "running", "seq": 3})
    assert [o.status for o in await p.upsert([new], 1)] == ["indexed"]
    assert [o.status for o in await p.upsert([old, new], 2)] == ["unchanged", "unchanged"]
    got = await p.get("r1")
    assert got is not None and got.seq == 5 and got.body["status"] == "failed"
    newer = Document("r1", "run", "r1", "t", 6, {"kind": "run", "status": "completed", "seq": 6})
    assert [o.status for o in await p.upsert([newer, old], 3)] == ["indexed", "unchanged"]
    got = await opener().get("r1")  # another handle on the same index sees it
    assert got is not None and got.body["status"] == "completed"


@pytest.mark.parametrize("order", ["in-order", "reversed", "shuffled-and-duplicated"])
async def test_events_in_any_order_give_the_documents_of_the_store(
    opener: Opener, harness: EngineHarness, order: str
) -> None:
    runs = await _scenario(harness)
    events = await _events(harness)
    assert len(events) > 10
    if order == "reversed":
        events.reverse()
    elif order == "shuffled-and-duplicated":
        events = events + events[: len(events) // 2]
        random.Random(7).shuffle(events)
    projector = _projector(harness, opener(), batch=7)
    for start in range(0, len(events), 5):  # several deliveries, as the dispatcher batches
        await projector.emit(events[start : start + 5])
    for run_id in runs.values():
        got = sorted(await projector.projection.documents(run_id), key=lambda d: d.doc_id)
        assert got == await _expected(harness, projector, run_id)
    checked, divergences = await verify(harness.store, projector)
    assert (checked, divergences) == (3, [])
    assert projector.stats.events == len(events)
    assert projector.stats.failed == 0
    if order == "shuffled-and-duplicated":
        assert projector.stats.unchanged > 0  # the duplicates were refused by the guard


async def test_a_stale_batch_arriving_late_does_not_regress_the_run(
    opener: Opener, harness: EngineHarness
) -> None:
    plan = model_ingest_shape(name="model-ingest")
    await harness.register(plan)
    run = await harness.start_run("model-ingest", {"modelId": "m1"}, tenant="acme")
    stored = await harness.store.load(run)
    assert stored is not None
    early = documents_for(stored, await harness.store.history(run), "1.0.0")
    await harness.accept(run, "render")
    await harness.succeed(run, "render", {"ok": True})
    projector = _projector(harness, opener())
    await projector.emit(await _events(harness))
    latest = await projector.projection.get(run)
    assert latest is not None and latest.seq > early[0].seq
    outcomes = await projector.projection.upsert(early, harness.clock.now_ms())
    assert {o.status for o in outcomes} == {"unchanged"}
    again = await projector.projection.get(run)
    assert again == latest
    stages = again.body["stages"]
    assert isinstance(stages, dict)
    render = stages["render"]
    assert isinstance(render, dict) and render["status"] == "completed"


async def test_documents_carry_the_run_facts_and_no_payload(
    opener: Opener, harness: EngineHarness
) -> None:
    runs = await _scenario(harness)
    projector = _projector(harness, opener())
    await projector.emit(await _events(harness))
    done = await projector.projection.get(runs["done"])
    failed = await projector.projection.get(runs["failed"])
    assert done is not None and failed is not None
    assert done.body["status"] == "completed" and done.body["intent"] == "completed"
    assert done.body["version"] == "1.0.0"
    assert done.body["workflow_version"] == "model-ingest@1.0.0"
    assert done.body["tenant"] == "acme" and done.body["duration_ms"] is not None
    counts = done.body["counts"]
    assert isinstance(counts, dict) and counts["refused"] == 1
    assert failed.body["status"] == "failed"
    assert failed.body["failed_stages"] == ["publish"]
    assert failed.body["failure_classes"] == ["listing-refused"]
    for doc in await projector.projection.documents(runs["done"]):
        text = repr(doc.body)
        assert "modelId" not in text and "m1" not in text and "'ok'" not in text


async def test_search_filters_facets_and_tenant_scope(
    opener: Opener, harness: EngineHarness
) -> None:
    runs = await _scenario(harness)
    projector = _projector(harness, opener())
    await projector.emit(await _events(harness))
    p, now = projector.projection, harness.clock.now_ms()

    async def ids(text: str, tenants: tuple[str, ...] | None = None) -> list[str]:
        result = await p.search(parse_query(text, now, tenants=tenants))
        return sorted(str(r["run_id"]) for r in result.runs)

    q = "workflow:model-ingest status:failed stage:publish tenant:acme since:1h"
    assert await ids(q) == [runs["failed"]]
    assert await ids("workflow:model-ingest@1.0.0 status:completed") == [runs["done"]]
    assert await ids("stage:publish=completed") == [runs["done"]]
    assert await ids("stage:publish") == sorted([runs["done"], runs["failed"]])
    assert await ids("tenant:globex") == [runs["running"]]
    assert await ids("listing-refused") == [runs["failed"]]
    assert await ids("status:failed", tenants=("globex",)) == []
    assert await ids("tenant:acme", tenants=("globex",)) == []
    assert await ids("", tenants=("acme",)) == sorted([runs["done"], runs["failed"]])
    assert await ids("until:1h") == []
    result = await p.search(parse_query("workflow:model-ingest", now))
    assert result.total == 3
    assert result.facets["status"] == {"completed": 1, "failed": 1, "running": 1}
    assert result.facets["version"] == {"model-ingest@1.0.0": 3}
    assert result.indexed_through_ms > 0 and result.projected_at_ms == now
    limited = await p.search(parse_query("", now, limit=1))
    assert len(limited.runs) == 1 and limited.total == 3
    assert result.facets["failed_stage"] == {"publish": 1}
    assert result.facets["failure_class"] == {"listing-refused": 1}
    assert result.facets["tenant"] == {"acme": 2, "globex": 1}
    assert (await p.search(parse_query("", now, tenants=()))).facets["tenant"] == {}


async def test_search_pages_by_keyset_stably_while_runs_are_updated(
    opener: Opener, harness: EngineHarness
) -> None:
    runs = await _scenario(harness)
    projector = _projector(harness, opener())
    await projector.emit(await _events(harness))
    p, now = projector.projection, harness.clock.now_ms()
    every = [str(r["run_id"]) for r in (await p.search(parse_query("", now))).runs]
    assert sorted(every) == sorted(runs.values())

    def after(run: dict[str, JsonValue]) -> tuple[int, str]:
        at = run["updated_at_ms"]
        assert isinstance(at, int)
        return at, str(run["run_id"])

    first = await p.search(dataclasses.replace(parse_query("", now), limit=1))
    assert [r["run_id"] for r in first.runs] == every[:1] and first.total == 3
    # the first page's run is updated meanwhile: it moves to the front, and the pages after
    # the cursor neither repeat it nor lose a run
    doc = await p.get(every[0])
    assert doc is not None
    newer = {**doc.body, "updated_at_ms": int(str(doc.body["updated_at_ms"])) + 60_000}
    outcome = await p.upsert([dataclasses.replace(doc, seq=doc.seq + 1, body=newer)], now)
    assert outcome[0].status == "indexed"
    seen: list[str] = []
    cursor = after(first.runs[-1])
    while True:
        page = await p.search(dataclasses.replace(parse_query("", now), limit=1, after=cursor))
        assert page.total == 3  # the count is of the whole match, not of what is left
        if not page.runs:
            break
        seen.extend(str(r["run_id"]) for r in page.runs)
        cursor = after(page.runs[-1])
    assert seen == every[1:]
    # a cursor combines with the filters and the tenant scope
    scoped = dataclasses.replace(parse_query("", now, tenants=("acme",)), after=cursor)
    assert (await p.search(scoped)).runs == []


async def test_items_the_index_refuses_go_to_the_failure_destination_and_are_redriven(
    opener: Opener, harness: EngineHarness
) -> None:
    runs = await _scenario(harness)
    events = await _events(harness)
    small = _projector(harness, opener(max_doc_bytes=600), retries=2)
    await small.emit(events)
    failures = await small.projection.failures()
    assert sorted({f.run_id for f in failures}) == sorted(runs.values())
    assert all(f.doc_id in runs.values() for f in failures)  # run documents are the big ones
    assert all("max_doc_bytes" in f.error and f.attempts == 3 for f in failures)
    assert small.stats.failed == len(failures) == 3
    assert await small.projection.get(runs["done"]) is None
    assert await small.projection.get(f"{runs['done']}/1") is not None  # small ones went in

    roomy = _projector(harness, opener())  # the limit raised: the same index, re-driven
    assert await roomy.redrive() == (3, 0)
    assert await roomy.projection.failures() == []
    assert (await verify(harness.store, roomy))[1] == []


async def test_a_rebuild_equals_the_live_projection(
    opener: Opener, harness: EngineHarness, tmp_path: Path
) -> None:
    runs = await _scenario(harness)
    live = _projector(harness, opener())
    events = await _events(harness)
    random.Random(3).shuffle(events)
    await live.emit(events)
    rebuilt = _projector(harness, open_projection(f"sqlite:///{tmp_path}/rebuilt.db"))
    try:
        assert await rebuild(harness.store, rebuilt) == 3
        for run_id in runs.values():
            assert await rebuilt.projection.documents(run_id) == (
                await live.projection.documents(run_id)
            )
        # rebuilding the live index in place changes nothing either
        before = {r: await live.projection.documents(r) for r in runs.values()}
        await rebuild(harness.store, live)
        assert {r: await live.projection.documents(r) for r in runs.values()} == before
    finally:
        await rebuilt.projection.close()


async def test_verify_reports_missing_stale_and_extra_documents(
    opener: Opener, harness: EngineHarness
) -> None:
    runs = await _scenario(harness)
    projector = _projector(harness, opener())
    await projector.emit(await _events(harness))
    stranger = Document("ghost", "run", "ghost", "acme", 1, {"kind": "run", "run_id": "ghost"})
    await projector.projection.upsert([stranger], 1)
    _, found = await verify(harness.store, projector)
    assert [(d.run_id, d.problem) for d in found] == [("ghost", "extra")]

    await harness.accept(runs["running"], "render", attempt=1)  # a new commit, not projected
    await harness.succeed(runs["running"], "render", {"ok": True})
    _, found = await verify(harness.store, projector)
    assert ("running", "stale") in {
        (k, d.problem) for d in found for k in runs if runs[k] == d.run_id
    }

    await projector.projection.reset()
    _, found = await verify(harness.store, projector, sample=2)
    assert [d.problem for d in found] == ["missing", "missing"]


async def test_a_closed_projection_refuses_clearly(opener: Opener) -> None:
    p = opener()
    await p.close()
    with pytest.raises(StoreError, match="closed"):
        await p.upsert([Document("r", "run", "r", "t", 1, {})], 1)


async def test_an_unreachable_index_keeps_the_events_for_the_sweep(
    harness: EngineHarness,
) -> None:
    """The whole index is down: the bulk request is retried with backoff, then ``emit`` raises
    a retryable error, so the dispatcher leaves the events in the outbox."""
    await _scenario(harness)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    down = open_projection(f"postgresql://postgres@127.0.0.1:{port}/test?connect_timeout_ms=1000")
    projector = _projector(harness, down, retries=2)
    try:
        with pytest.raises(StoreError) as caught:
            await projector.emit(await _events(harness))
        assert caught.value.retryable
        assert projector.stats.retries == 2 and projector.stats.indexed == 0
    finally:
        await down.close()


def test_the_query_language_names_what_it_refuses() -> None:
    with pytest.raises(ValueError, match="colour:red: unknown key 'colour'"):
        parse_query("colour:red", 0)
    with pytest.raises(ValueError, match="since:soon: expected a duration"):
        parse_query("since:soon", 0)
    with pytest.raises(ValueError, match="status given twice"):
        parse_query("status:failed status:completed", 0)
    q = parse_query(
        'workflow:model-ingest@2.3.0 stage:publish status:failed since:1h "a b"', 7_200_000
    )
    assert (q.workflow, q.version, q.stage, q.stage_status) == (
        "model-ingest",
        "2.3.0",
        "publish",
        "failed",
    )
    assert q.since_ms == 3_600_000 and q.text == "a b"
    assert parse_query("tenant:x", 0, tenants=("y",)).tenants == ()
    assert parse_query("", 0, tenants=("y",)).tenants == ("y",)
    assert isinstance(parse_query("", 0), SearchQuery)
