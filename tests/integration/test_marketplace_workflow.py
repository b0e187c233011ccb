"""workflows/marketplace-publish.yaml end to end: the demo's models go through model-ingest with
the real reference workers, then each is prepared and published by the Etsy connector to the Etsy
test double over real sockets, and recorded in the catalogue. Each listing is approved by an
operator at the workflow's gate (``accord runs approve``, its own process) before anything
reaches Etsy. Every job of the marketplace queue is delivered twice and the first create's
answer is lost after the write: each model is still listed exactly once, and every run records
the policy revision its listing was checked against. A rejected listing ends its run with
nothing sent to Etsy.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from accord_worker_marketplace_etsy.handler import PUBLISH, publish
from accord_worker_marketplace_etsy.handler import worker as etsy_worker
from tests.etsy_double.app import EtsyDouble, serve
from tests.etsy_double.flow import GATE, decide_when_waiting, place_models, publish_context
from tests.etsy_double.support import CONTRACTS, ROOT, config, refresh

from accord.cli._demo_run import reference_workers
from accord.cli.workflow import compile_file
from accord.contracts.sources import load_catalog
from accord.engine.machine.state import RunState
from accord.worker.fleet import ingest_stack, wait_terminal
from accord.worker.sdk import Worker
from accord.worker.storage import StorageMap

pytestmark = pytest.mark.slow
TENANT = "demo"
GRACE_MS = 300  # what the engine leaves to the process that committed an entry, as in the e2e


@pytest.fixture
def double() -> Iterator[tuple[EtsyDouble, str]]:
    d = EtsyDouble()
    with serve(d) as url:
        yield d, url


async def test_the_demo_models_are_listed_once_each_under_duplicates_and_a_lost_answer(
    tmp_path: Path, double: tuple[EtsyDouble, str]
) -> None:
    etsy, url = double
    etsy.slow_after_write(2.5, times=1)  # the first create's answer comes after the client quit
    policies = tmp_path / "policies"
    applied = refresh(policies, tmp_path)
    catalog = load_catalog(CONTRACTS)
    ingest = compile_file(ROOT / "workflows" / "model-ingest.yaml", catalog).unwrap()
    market = compile_file(ROOT / "workflows" / "marketplace-publish.yaml", catalog).unwrap()
    state, objects = tmp_path / "state", tmp_path / "state" / "objects"
    models = place_models(objects, TENANT)
    services: dict[str, Any] = {
        "storage": StorageMap.local(objects),
        "etsy": config(url, policies, read_timeout_s=1.0),
        "catalog": catalog,
    }
    second = Worker("marketplace-etsy-second")  # another connector, its own acceptance record
    second.bind(PUBLISH, publish)
    workers = [*reference_workers(ROOT), etsy_worker, second]
    db = f"sqlite:///{state / 'accord.db'}"
    queue = f"sqlite:///{state / 'queue.db'}"  # not the joint path: every job goes by publish
    async with ingest_stack(
        db, ingest, catalog, workers, state=state, services=services, transport=queue
    ) as stack:
        engine = stack.engine
        ingested = {m: await engine.start_run(ingest.name, {"modelId": m}, tenant=TENANT)
                    for m in models}  # fmt: skip
        await wait_terminal(engine, list(ingested.values()), timeout_s=100)
        contexts = {}
        for model_id, run_id in ingested.items():
            run = await engine.load(run_id)
            assert run is not None and run.status == "completed", (model_id, run and run.error)
            contexts[model_id] = publish_context(run, run_id)

        send = engine.transport.publish
        duplicated: list[str] = []

        async def twice(q: str, message_id: str, body: bytes, delay_ms: int = 0) -> None:
            await send(q, message_id, body, delay_ms)
            if q == "marketplace-etsy":
                duplicated.append(message_id)
                await send(q, f"{message_id}.again", body, delay_ms)

        engine.transport.publish = twice  # type: ignore[method-assign,assignment]
        # an approval is committed by another process, the CLI: the engine hands its publish job
        # over once it is grace_ms old (``accord engine run --grace-ms``)
        engine.dispatcher.grace_ms = GRACE_MS
        assert await engine.admit(market) == []
        await engine.register_plan(market)
        runs = {m: await engine.start_run(market.name, ctx, tenant=TENANT)
                for m, ctx in contexts.items()}  # fmt: skip
        await decide_when_waiting(db, list(runs.values()))
        await wait_terminal(engine, list(runs.values()), timeout_s=60)
        finished: dict[str, RunState] = {}
        for model_id, run_id in runs.items():
            run = await engine.load(run_id)
            assert run is not None
            finished[model_id] = run
        rows = stack.platform.catalogue.rows(TENANT)

    for model_id, run in finished.items():
        assert run.status == "completed", (model_id, run.error)
        (decision,) = dict(run.stages[GATE].result or {})["decisions"]
        assert decision["decision"] == "approve" and decision["by"].startswith("cli:")
        result = dict(run.stages["publish-listing"].result or {})
        assert (
            result["policy"] == applied["version"] and result["policyDigest"] == applied["digest"]
        )
    assert len(duplicated) >= len(models), "every publish job went out twice"
    listed = [x for x in etsy.listings.values()]
    assert len(listed) == len(models), "one listing per model, whatever was repeated"
    ext_ids = {str(finished[m].stages["publish-listing"].result["externalId"]) for m in models}  # type: ignore[index]
    assert all(len([x for x in listed if e in x["tags"]]) == 1 for e in ext_ids)
    assert etsy.received.count("createListing") == len(models), "no create was ever repeated"
    for model_id, run in finished.items():  # the gallery thumbnails, each uploaded once
        listing_id = int(run.stages["publish-listing"].result["listingId"])  # type: ignore[index]
        want = len(contexts[model_id]["previewKeys"])
        assert want >= 1, f"model-ingest rendered no gallery image of {model_id}"
        assert [i["rank"] for i in etsy.images.get(listing_id, [])] == list(range(1, want + 1))
    assert etsy.received.count("uploadListingImage") == sum(
        len(c["previewKeys"]) for c in contexts.values()
    ), "an image was uploaded twice under the duplicated jobs"
    assert any(finished[m].stages["publish-listing"].result["reconciled"] for m in models)  # type: ignore[index]
    assert {r["modelId"] for r in rows} == set(models)


async def test_a_rejected_listing_ends_the_run_with_nothing_sent_to_etsy(
    tmp_path: Path, double: tuple[EtsyDouble, str]
) -> None:
    etsy, url = double
    policies = tmp_path / "policies"
    refresh(policies, tmp_path)
    catalog = load_catalog(CONTRACTS)
    market = compile_file(ROOT / "workflows" / "marketplace-publish.yaml", catalog).unwrap()
    state = tmp_path / "state"
    state.mkdir()
    services = {"etsy": config(url, policies), "catalog": catalog}
    db = f"sqlite:///{state / 'accord.db'}"
    context = {
        "modelId": "cube", "ingestRunId": "ingest-1", "format": "stl",
        "descriptors": ["principal extents 20 × 20 × 20"],
        "tags": [{"label": "convex", "confidence": 0.9}], "previewKeys": [],
    }  # fmt: skip
    async with ingest_stack(db, market, catalog, [etsy_worker], state=state,
                            services=services) as stack:  # fmt: skip
        stack.engine.dispatcher.grace_ms = GRACE_MS
        run_id = await stack.engine.start_run(market.name, context, tenant=TENANT)
        (printed,) = await decide_when_waiting(db, [run_id], "reject")
        await wait_terminal(stack.engine, [run_id], timeout_s=20)
        run = await stack.engine.load(run_id)
        rows = stack.platform.catalogue.rows(TENANT)
    assert printed["intent"] == "failed"
    assert run is not None and run.status == "failed", run
    gate = run.stages[GATE]
    assert gate.status == "failed" and gate.error["code"] == "approval-rejected", gate
    assert run.stages["prepare-listing"].status == "completed"
    assert run.stages["publish-listing"].attempt == 0, "the publish job was never dispatched"
    assert etsy.received == [] and etsy.listings == {}, "nothing reached Etsy"
    assert rows == []
