"""The worker runtime's rules, each over a real in-memory queue and the real contract catalog."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from accord.canonical import canonical_json
from accord.contracts.catalog import Catalog
from accord.engine.runtime.outbox import control_queue
from accord.worker import (
    AcceptanceLog,
    Context,
    RetryableError,
    Runtime,
    TerminalError,
    Worker,
)
from tests.unit.worker.conftest import JobMaker, Recorder

CAP = "thumbnail.render@3"
DIGEST = "sha256:" + "ab" * 32


def thumbnail(model_id: str = "m1") -> dict[str, Any]:
    preview = {"previewType": "gallery", "objectKey": f"thumbs/{model_id}.png", "width": 64,
               "height": 64, "contentType": "image/png", "sizeBytes": 10,
               "digest": DIGEST}  # fmt: skip
    return {"modelId": model_id, "previews": [preview]}


@asynccontextmanager
async def serving(runtime: Runtime) -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(runtime.run(stop))
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def send(transport: Recorder, envelope: dict[str, Any], queue: str = "rendering") -> None:
    await transport.publish(queue, envelope["messageId"], canonical_json(envelope))


def worker_with(fn: Callable[..., Any]) -> Worker:
    w = Worker("thumbnailer")
    w.bind(CAP, fn)
    return w


async def test_acceptance_is_published_before_the_handler_runs(
    transport: Recorder, catalog: Catalog, job: JobMaker
) -> None:
    def handler(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        transport.mark("handler-started")
        return thumbnail()

    async with serving(Runtime(worker_with(handler), transport, catalog=catalog)):
        await send(transport, job())
        await transport.wait_for("succeeded")
    assert transport.kinds() == ["accepted", "handler-started", "succeeded"]
    done = transport.of("succeeded")[0]
    assert (done["runId"], done["stage"], done["attempt"], done["fence"]) == (
        "run_1", "render-thumbnail", 1, "f1" * 16,
    )  # fmt: skip
    assert done["payload"]["views"] == []  # the result contract's default, applied when missing


async def test_defaults_apply_only_to_missing_fields_and_the_key_is_passed(
    transport: Recorder, catalog: Catalog, job: JobMaker
) -> None:
    seen: list[tuple[dict[str, Any], str]] = []

    async def handler(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        seen.append((payload, ctx.idempotency_key))
        return thumbnail()

    async with serving(Runtime(worker_with(handler), transport, catalog=catalog)):
        await send(transport, job({"modelId": "m1", "maxEdge": 1024}))
        await transport.wait_for("succeeded")
    payload, key = seen[0]
    assert payload["maxEdge"] == 1024 and payload["previewType"] == "gallery"
    assert payload["generate360Views"] is True
    assert key == "idem_run_1_render-thumbnail"


async def test_redelivery_after_acceptance_never_runs_the_handler_twice(
    catalog: Catalog, job: JobMaker, tmp_path: Path
) -> None:
    transport = Recorder(visibility_ms=60)  # the lease lapses while the handler still runs
    runs: list[int] = []

    async def handler(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        runs.append(ctx.attempt)
        await asyncio.sleep(0.4)
        return thumbnail()

    log = AcceptanceLog(tmp_path / "acceptance.db")
    runtime = Runtime(worker_with(handler), transport, catalog=catalog, acceptance=log)
    async with serving(runtime):
        await send(transport, job())
        await transport.wait_for("succeeded")
    assert runs == [1]
    assert runtime.stats["reannounced"] >= 1  # the redelivery was answered, not re-run
    # a restarted worker process with the same record answers a late copy from the record
    again = Runtime(worker_with(handler), transport, catalog=catalog, acceptance=log)
    await again.serve(_delivery(job()), again.queues["rendering"])
    await asyncio.sleep(0.05)
    assert runs == [1] and again.stats["handler_runs"] == 0
    await transport.close()


def _delivery(envelope: dict[str, Any]) -> Any:
    from accord.engine.ports import Delivery

    return Delivery("rendering", envelope["messageId"], canonical_json(envelope), 2, "r-copy")


async def test_heartbeats_flow_while_the_handler_runs(
    transport: Recorder, catalog: Catalog, job: JobMaker
) -> None:
    def handler(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        time.sleep(0.3)  # a sync handler: the loop stays free to heartbeat
        return thumbnail()

    runtime = Runtime(worker_with(handler), transport, catalog=catalog, heartbeat_ms=40)
    async with serving(runtime):
        await send(transport, job())
        await transport.wait_for("succeeded")
    kinds = transport.kinds()
    assert kinds.count("heartbeat") >= 3
    assert kinds.index("accepted") < kinds.index("heartbeat") < kinds.index("succeeded")
    assert len({d["messageId"] for d in transport.of("heartbeat")}) == kinds.count("heartbeat")


async def test_progress_is_reported_in_order_before_the_result(
    transport: Recorder, catalog: Catalog, job: JobMaker
) -> None:
    def handler(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        ctx.progress(10, "loading")
        ctx.progress(60, "rendering")
        ctx.progress(250)  # clamped
        return thumbnail()

    async with serving(Runtime(worker_with(handler), transport, catalog=catalog)):
        await send(transport, job())
        await transport.wait_for("succeeded")
    progress = [
        (d["payload"]["percent"], d["payload"]["message"]) for d in transport.of("progress")
    ]
    assert progress == [(10.0, "loading"), (60.0, "rendering"), (100.0, "")]
    assert transport.kinds()[-1] == "succeeded"


async def test_cancellation_request_reaches_the_running_attempt(
    transport: Recorder, catalog: Catalog, job: JobMaker
) -> None:
    started = asyncio.Event()

    async def handler(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        started.set()
        for _ in range(400):
            ctx.raise_if_cancelled()
            await asyncio.sleep(0.01)
        return thumbnail()

    async with serving(Runtime(worker_with(handler), transport, catalog=catalog)):
        await send(transport, job(fence="fe" * 16))
        await started.wait()
        request = {"kind": "request-cancellation", "job_id": "j", "queue": "rendering",
                   "stage": "render-thumbnail", "attempt": 1, "fence": "fe" * 16}  # fmt: skip
        await transport.publish(control_queue("rendering"), "c1", json.dumps(request).encode())
        await transport.wait_for("failed")
    failed = transport.of("failed")[0]["payload"]
    assert failed["code"] == "cancelled" and failed["retryable"] is False
    assert not transport.of("succeeded")


async def test_errors_are_classified(transport: Recorder, catalog: Catalog, job: JobMaker) -> None:
    def handler(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        if ctx.run_id == "run_r":
            raise RetryableError("storage busy", "storage-unavailable")
        raise TerminalError("not a mesh", "unsupported-format")

    async with serving(Runtime(worker_with(handler), transport, catalog=catalog)):
        await send(transport, job(run_id="run_r"))
        await send(transport, job(run_id="run_t"))
        await transport.wait_for("failed", 2)
    by_run = {d["runId"]: d["payload"] for d in transport.of("failed")}
    assert by_run["run_r"]["code"] == "storage-unavailable" and by_run["run_r"]["retryable"]
    assert by_run["run_t"]["code"] == "unsupported-format" and not by_run["run_t"]["retryable"]


async def test_unknown_exceptions_are_retryable_up_to_a_bound(
    transport: Recorder, catalog: Catalog, job: JobMaker
) -> None:
    def handler(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        raise ZeroDivisionError("bug")

    runtime = Runtime(worker_with(handler), transport, catalog=catalog, max_crashes=3)
    async with serving(runtime):
        for attempt in (1, 2, 3):
            await send(transport, job(attempt=attempt, fence=f"{attempt:032x}"))
            await transport.wait_for("failed", attempt)
    verdicts = [(d["attempt"], d["payload"]["retryable"]) for d in transport.of("failed")]
    assert verdicts == [(1, True), (2, True), (3, False)]
    assert all(d["payload"]["code"] == "handler-crashed" for d in transport.of("failed"))


async def test_a_result_breaking_its_contract_is_a_terminal_failure(
    transport: Recorder, catalog: Catalog, job: JobMaker
) -> None:
    async with serving(Runtime(worker_with(lambda p, c: {"modelId": "m1"}), transport,
                               catalog=catalog)):  # fmt: skip
        await send(transport, job())
        await transport.wait_for("failed")
    failed = transport.of("failed")[0]["payload"]
    assert failed["code"] == "invalid-result" and not failed["retryable"]
    assert "previews" in failed["message"]
    assert not transport.of("succeeded")


async def test_invalid_request_fails_terminally_without_running_the_handler(
    transport: Recorder, catalog: Catalog, job: JobMaker
) -> None:
    calls: list[str] = []

    def handler(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        calls.append("ran")
        return thumbnail()

    w = worker_with(handler)
    async with serving(Runtime(w, transport, catalog=catalog)):
        await send(transport, job({"modelId": "m1", "previewType": "poster"}))
        await transport.wait_for("failed")
    failed = transport.of("failed")[0]["payload"]
    assert failed["code"] == "invalid-request" and "previewType" in failed["message"]
    assert calls == []


async def test_a_job_naming_another_request_contract_is_refused(
    transport: Recorder, catalog: Catalog, job: JobMaker
) -> None:
    """The request contract is the one the capability takes, not whatever the job names: a job
    for another contract version is answered ``invalid-request`` before the handler runs."""
    calls: list[str] = []

    def handler(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        calls.append("ran")
        return thumbnail()

    async with serving(Runtime(worker_with(handler), transport, catalog=catalog)):
        await send(transport, job() | {"contractVersion": 1})
        await transport.wait_for("failed")
    failed = transport.of("failed")[0]["payload"]
    assert (failed["code"], failed["retryable"]) == ("invalid-request", False)
    assert failed["message"] == (
        "the job names thumbnail-generation-request@1; "
        "this worker takes thumbnail-generation-request@2"
    )
    assert calls == []


async def test_poison_is_quarantined_and_never_answered(
    transport: Recorder, catalog: Catalog
) -> None:
    runtime = Runtime(worker_with(lambda p, c: thumbnail()), transport, catalog=catalog)
    async with serving(runtime):
        await transport.publish("rendering", "bad-1", b"{not json")
        await transport.publish("rendering", "bad-2", b'{"payload": {}}')
        async with asyncio.timeout(5):
            while runtime.stats["quarantined"] < 2:
                await asyncio.sleep(0.01)
    assert transport.log == []
    reasons = []
    async for delivery in transport.consume("rendering.quarantine", 2):
        reasons.append(json.loads(delivery.body)["reason"])
        await transport.ack(delivery)
        if len(reasons) == 2:
            break
    assert any("not JSON" in r for r in reasons) and any("run and stage" in r for r in reasons)


async def test_shutdown_finishes_in_flight_work_and_stops_consuming(
    transport: Recorder, catalog: Catalog, job: JobMaker
) -> None:
    started = asyncio.Event()

    async def handler(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        started.set()
        await asyncio.sleep(0.2)
        return thumbnail()

    runtime = Runtime(worker_with(handler), transport, catalog=catalog)
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(runtime.run(stop))
    await send(transport, job(run_id="run_a"))
    await started.wait()
    stop.set()
    await asyncio.wait_for(task, 5)
    assert [d["runId"] for d in transport.of("succeeded")] == ["run_a"]  # finished, not dropped
    await send(transport, job(run_id="run_b"))
    await asyncio.sleep(0.1)
    assert runtime.stats["handler_runs"] == 1  # nothing consumed after shutdown


async def test_capabilities_are_announced_with_a_ttl(transport: Recorder, catalog: Catalog) -> None:
    seen: list[tuple[str, list[str], int]] = []

    async def announce(worker_id: str, caps: Any, ttl_ms: int) -> None:
        seen.append((worker_id, list(caps), ttl_ms))

    runtime = Runtime(worker_with(lambda p, c: thumbnail()), transport, catalog=catalog,
                      announce=announce, announce_ttl_ms=90, worker_id="w-1")  # fmt: skip
    async with serving(runtime):
        await asyncio.sleep(0.2)
    assert len(seen) >= 3  # renewed at a third of the TTL
    assert seen[0] == ("w-1", [CAP], 90)


async def test_a_job_is_accepted_only_when_a_task_slot_is_free(
    transport: Recorder, catalog: Catalog, job: JobMaker
) -> None:
    release = asyncio.Event()

    async def handler(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        transport.mark(f"start {ctx.run_id}")
        if ctx.run_id == "run_1":
            await release.wait()
        transport.mark(f"end {ctx.run_id}")
        return thumbnail()

    runtime = Runtime(worker_with(handler), transport, catalog=catalog, slots=1)
    async with serving(runtime):
        await send(transport, job(run_id="run_1"))
        await send(transport, job(run_id="run_2"))
        await transport.wait_for("start run_1")
        await asyncio.sleep(0.1)  # run_2 is held by the worker, not accepted: no slot is free
        assert [d["runId"] for d in transport.of("accepted")] == ["run_1"]
        release.set()
        await transport.wait_for("succeeded", 2)
    kinds = transport.kinds()
    assert kinds.index("end run_1") < kinds.index("start run_2")
    assert [d["runId"] for d in transport.of("accepted")] == ["run_1", "run_2"]


class SlowAnswers(Recorder):
    """Holds back the confirm of run_1's final outcome until released."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def publish(self, queue: str, message_id: str, body: bytes, delay_ms: int = 0) -> None:
        if message_id.startswith("msg_run_1_") and message_id.endswith(":succeeded"):
            self.mark("answer run_1 sent")
            await self.release.wait()
        await super().publish(queue, message_id, body, delay_ms)


async def test_the_next_job_takes_the_slot_while_an_answer_awaits_its_confirm(
    catalog: Catalog, job: JobMaker
) -> None:
    transport = SlowAnswers()

    async def handler(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        transport.mark(f"start {ctx.run_id}")
        return thumbnail()

    def accepted_here() -> list[str]:
        rows = runtime.acceptance._db.execute("SELECT run_id FROM acceptance ORDER BY at")
        return [row[0] for row in rows]

    runtime = Runtime(worker_with(handler), transport, catalog=catalog, slots=1)
    try:
        async with serving(runtime):
            await send(transport, job(run_id="run_1"))
            await transport.wait_for("answer run_1 sent")
            await send(transport, job(run_id="run_2"))
            async with asyncio.timeout(5):  # the slot came back before run_1's confirm
                while accepted_here() != ["run_1", "run_2"]:
                    await asyncio.sleep(0.005)
            # run_1 is acknowledged only once its answer is confirmed
            assert list(transport._ready["rendering"]) == [
                job(run_id="run_1")["messageId"],
                job(run_id="run_2")["messageId"],
            ]
            transport.release.set()
            await transport.wait_for("succeeded", 2)
            async with asyncio.timeout(5):
                while transport._ready["rendering"]:
                    await asyncio.sleep(0.005)
        assert transport.kinds().index("answer run_1 sent") < transport.kinds().index("start run_2")
    finally:
        await transport.close()


def _versioned_catalog(tmp_path: Path) -> Catalog:
    """The real contracts plus ``tests.ping@1`` and ``@2``: two versions of one capability on one
    queue, whose requests differ (``ping-request@1`` takes ``word``, ``@2`` also ``count``)."""
    import shutil

    from accord.contracts.sources import load_catalog

    folder = tmp_path / "contracts"
    shutil.copytree(Path(__file__).resolve().parents[3] / "schemas" / "contracts", folder)
    for version, extra in ((1, ""), (2, "\n  count: {type: integer, required: true}")):
        (folder / f"ping-request.v{version}.yaml").write_text(
            f"kind: message\nname: ping-request\nwireVersion: {version}\nowner: tests\n"
            "description: A ping.\npayload:\n  word: {type: string, required: true}"
            f"{extra}\noutcomes: [retryable-error, terminal-error]\n"
        )
        (folder / f"tests.ping.v{version}.yaml").write_text(
            f"kind: worker\nname: tests.ping\nversion: {version}\nowner: tests\n"
            "description: Pings.\n"
            f"request: ping-request@{version}\nresult: ping-request@1\nqueue: ping\n"
            "errors: []\nlimits: {timeMs: 1000}\nidempotency: natural-key\n"
        )
    return load_catalog(folder)


async def test_two_versions_of_a_capability_share_a_queue_each_job_to_its_own(
    transport: Recorder, job: JobMaker, tmp_path: Path
) -> None:
    catalog = _versioned_catalog(tmp_path)
    served: list[tuple[str, dict[str, Any]]] = []

    def v1(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        served.append(("v1", payload))
        return {"word": payload["word"]}

    def v2(payload: dict[str, Any], ctx: Context) -> dict[str, Any]:
        served.append(("v2", payload))
        return {"word": payload["word"] * payload["count"]}

    w = Worker("pinger")
    w.bind("tests.ping@1", v1)
    w.bind("tests.ping@2", v2)
    runtime = Runtime(w, transport, catalog=catalog)
    assert list(runtime.queues) == ["ping"]
    jobs = []
    for n, (version, payload) in enumerate(
        [(1, {"word": "a"}), (2, {"word": "b", "count": 2}), (3, {"word": "c"})]
    ):
        doc = job(payload, run_id=f"run_{n}")
        doc |= {"messageType": "ping-request", "contractVersion": version}
        jobs.append(doc)
    async with serving(runtime):
        for doc in jobs:
            await send(transport, doc, queue="ping")
        await transport.wait_for("succeeded", 2)
        await transport.wait_for("failed", 1)
    assert sorted(served, key=lambda s: s[0]) == [
        ("v1", {"word": "a"}),
        ("v2", {"word": "b", "count": 2}),
    ]
    (refused,) = transport.of("failed")
    assert refused["payload"]["code"] == "invalid-request"
    assert "takes ping-request@1 or ping-request@2" in refused["payload"]["message"]


def test_two_capabilities_a_job_could_not_tell_apart_may_not_share_a_queue(
    transport: Recorder, catalog: Catalog
) -> None:
    w = Worker("confused")
    w.bind(CAP, lambda p, c: p)
    w.bind("other.render@1", lambda p, c: p, queue="rendering")  # no contract: cannot tell
    try:
        Runtime(w, transport, catalog=catalog)
    except ValueError as exc:
        assert "thumbnail.render@3 and other.render@1 both take queue 'rendering'" in str(exc)
    else:
        raise AssertionError("two bindings a job cannot choose between were accepted")
