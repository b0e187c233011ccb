"""`accord quarantine` and `accord dead-letters`, the real binary over the embedded queue, BullMQ
on the real Redis and RabbitMQ: records a real worker runtime quarantined and jobs nacked past
their delivery limit are listed and shown with a sensitive canary masked in both forms,
redriven (delivered again, the record gone) and purged; bad ids and unreachable transports are
one-line errors (one JSON document with ``--json``)."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest
import redis

from accord.adapters import open_transport
from accord.contracts.sources import load_catalog
from accord.engine.ports import Delivery, QueueAdmin, Transport
from accord.engine.runtime.wire import quarantine_queue
from accord.worker import Context, Worker
from accord.worker.runtime import Runtime

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tests/integration is no package: reach tests.* from the root
    sys.path.insert(0, str(ROOT))
from tests.services import REDIS_DB, ensure_rabbitmq, ensure_redis  # noqa: E402

ACCORD = Path(sys.executable).parent / "accord"
CONTRACTS = ROOT / "schemas" / "contracts"
AMQP = "amqp://guest:guest@127.0.0.1:5672/"
OPTS = "visibility_ms=2000&max_deliveries=2"
CANARY = "CANARY-s3cr3t-7f1d"  # a storageConnectionRef: sensitive in every request contract
JOBS, DEAD = "qa.jobs", "qa.nacked"


@pytest.fixture(params=["embedded", "bullmq", "rabbitmq"])
async def url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    tag = uuid.uuid4().hex[:10]
    if request.param == "embedded":
        yield f"sqlite:///{tmp_path / 'q.db'}?{OPTS}&poll_ms=5"
    elif request.param == "bullmq":
        ensure_redis()
        yield f"bullmq://127.0.0.1:6379/{REDIS_DB}?prefix=qa-{tag}&{OPTS}&stalled_ms=500"
        client = redis.Redis(port=6379, db=REDIS_DB)
        keys = list(client.scan_iter(match=f"qa-{tag}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
    else:
        ensure_rabbitmq()
        yield f"{AMQP}?prefix=qa{tag}.&{OPTS}"
        connection = await aio_pika.connect(AMQP)
        async with connection:
            for base in (JOBS, DEAD, "accord.control." + JOBS, "accord.outcomes"):
                for name in (base, f"{base}.dead", f"{base}.quarantine", f"{base}.quarantine.dead"):
                    channel = await connection.channel()
                    await channel.queue_delete(f"qa{tag}.{name}")
                    await channel.close()


async def accord(*args: str, cwd: Path, code: int = 0) -> str:
    """Run the real binary (the event loop keeps serving the worker meanwhile); stdout."""
    process = await asyncio.create_subprocess_exec(
        str(ACCORD), *args, cwd=cwd, env={"ACCORD_CONTRACTS": str(CONTRACTS), "PATH": "/usr/bin"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 30)
    text, errors = out.decode(), err.decode()
    assert process.returncode == code, (args, text, errors)
    assert "Traceback" not in errors, errors
    assert CANARY not in text + errors, (args, text, errors)  # never, in any view
    if code:
        assert len(errors.strip().splitlines()) <= 1 or "--json" in args, errors
    return text


def envelope(message_id: str, payload: dict[str, Any], **identity: Any) -> bytes:
    doc = {
        "messageId": message_id,
        "messageType": "thumbnail-generation-request",
        "contractVersion": 2,
        **identity,
        "payload": payload,
    }
    return json.dumps(doc).encode()


async def until(check: Any, timeout_s: float = 15) -> Any:
    async with asyncio.timeout(timeout_s):
        while not (got := await check()):
            await asyncio.sleep(0.05)
    return got


async def take(transport: Transport, queue: str) -> Delivery:
    stream = transport.consume(queue)
    try:
        async with asyncio.timeout(15):
            return await anext(stream)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


async def test_operator_lists_shows_redrives_and_purges_what_was_refused(
    url: str, tmp_path: Path
) -> None:
    transport = open_transport(url)
    admin = transport
    assert isinstance(admin, QueueAdmin)
    catalog = load_catalog(CONTRACTS)
    worker = Worker("qa")

    async def handler(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        raise AssertionError("a poison job never reaches its handler")

    worker.bind("thumbnail.render@3", handler, queue=JOBS)
    runtime = Runtime(worker, transport, catalog=catalog, drain_s=1)
    stop = asyncio.Event()
    serving = asyncio.get_running_loop().create_task(runtime.run(stop))
    named = [] if "sqlite" in url or "bullmq" in url else ["--queue", JOBS, "--queue", DEAD]
    # the operator's URL need not repeat the fleet's delivery limit
    base = ["--transport", url.replace("&max_deliveries=2", ""), *named]
    try:
        # two poison jobs (no run, stage or fence): one carrying the canary, one harmless; and a
        # record as an older worker wrote it, unredacted (the view must mask it itself)
        await transport.publish(
            JOBS, "p-secret", envelope("p-secret", {"storageConnectionRef": CANARY})
        )
        await transport.publish(JOBS, "p-plain", envelope("p-plain", {"modelId": "m-1"}))
        legacy = {"queue": JOBS, "messageId": "p-old", "reason": "old worker",
                  "body": envelope("p-old", {"storageConnectionRef": CANARY}).decode()}  # fmt: skip
        await transport.publish(
            quarantine_queue(JOBS), "quarantine:p-old", json.dumps(legacy).encode()
        )
        # a job nacked past its delivery limit, the canary in its payload
        identity = {"runId": "r", "stage": "s", "attempt": 1, "fence": "0123456789abcdef"}
        payload = {"modelId": "m-2", "storageConnectionRef": CANARY}
        await transport.publish(DEAD, "d-1", envelope("d-1", payload, **identity))
        for _ in range(2):
            await transport.nack(await take(transport, DEAD))
        await until(lambda: asyncio.sleep(0, runtime.stats["quarantined"] >= 2))

        # -- quarantine ---------------------------------------------------------------------
        listed = json.loads(await accord("quarantine", "list", *base, "--json", cwd=tmp_path))
        records = {r["id"]: r for r in listed["records"]}
        assert set(records) == {"quarantine:p-secret", "quarantine:p-plain", "quarantine:p-old"}
        assert records["quarantine:p-plain"]["redrivable"] is True
        assert "run and stage" in records["quarantine:p-plain"]["reason"]
        assert records["quarantine:p-secret"]["redrivable"] is False  # masked when recorded
        text = await accord("quarantine", "list", *base, cwd=tmp_path)
        assert "quarantine:p-old" in text and "old worker" in text
        for form in ([], ["--json"]):
            shown = await accord(
                "quarantine", "show", "quarantine:p-old", *base, *form, cwd=tmp_path
            )
            assert "***" in shown and "storageConnectionRef" in shown
        refused = await accord(
            "quarantine", "redrive", "quarantine:p-secret", *base, cwd=tmp_path, code=1
        )
        assert refused == ""
        done = json.loads(
            await accord(
                "quarantine", "redrive", "quarantine:p-plain", *base, "--json", cwd=tmp_path
            )
        )
        (redriven,) = done["redriven"]
        assert redriven["queue"] == JOBS and redriven["published_as"].startswith("p-plain#redrive-")
        # delivered again: the running worker reads it, and quarantines it again, under its new id

        async def again() -> set[str]:
            ids = {w.message_id for w in await admin.waiting(quarantine_queue(JOBS))}
            return ids if f"quarantine:{redriven['published_as']}" in ids else set()

        assert "quarantine:p-plain" not in await until(again)
        kept = await accord("quarantine", "purge", "--all", *base, cwd=tmp_path, code=2)
        assert kept == ""
        purged = json.loads(
            await accord("quarantine", "purge", "--all", "--yes", *base, "--json", cwd=tmp_path)
        )
        assert len(purged["purged"]) == 3
        assert await admin.waiting(quarantine_queue(JOBS)) == []

        # -- dead letters -------------------------------------------------------------------
        dead = json.loads(await accord("dead-letters", "list", *base, "--json", cwd=tmp_path))
        (letter,) = [d for d in dead["dead_letters"] if d["queue"] == DEAD]
        assert (letter["id"], letter["delivery_count"]) == ("d-1", 2)
        assert "nacked" in letter["reason"]
        for form in ([], ["--json"]):
            shown = await accord("dead-letters", "show", "d-1", *base, *form, cwd=tmp_path)
            assert "***" in shown and "m-2" in shown  # the known field shows, the secret not
        back = json.loads(
            await accord("dead-letters", "redrive", "d-1", *base, "--json", cwd=tmp_path)
        )
        assert back["redriven"] == [{"id": "d-1", "queue": DEAD}]
        delivered = await take(transport, DEAD)
        assert (delivered.message_id, delivered.delivery_count) == ("d-1", 1)
        assert CANARY.encode() in delivered.body  # the original, not the view
        await transport.ack(delivered)
        assert await admin.dead_letter_records(DEAD) == []

        # -- bad ids ------------------------------------------------------------------------
        await accord("dead-letters", "show", "nope", *base, cwd=tmp_path, code=1)
        doc = json.loads(
            await accord("quarantine", "show", "nope", *base, "--json", cwd=tmp_path, code=1)
        )
        assert doc["ok"] is False and "no quarantine record 'nope'" in doc["error"]
    finally:
        stop.set()
        await serving
        await transport.close()


@pytest.mark.parametrize(
    "target",
    ["sqlite:///missing/q.db", "bullmq://127.0.0.1:1/0", "amqp://guest:pw-hidden@127.0.0.1:1/"],
)
async def test_an_unreachable_transport_is_one_line(target: str, tmp_path: Path) -> None:
    for command in ("quarantine", "dead-letters"):
        process = await asyncio.create_subprocess_exec(
            str(ACCORD), command, "list", "--transport", target, cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), 30)
        assert process.returncode == 2
        (line,) = err.decode().strip().splitlines()
        assert line.startswith("error: transport") and "pw-hidden" not in line
        assert out == b""
