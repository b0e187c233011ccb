"""The HTTP control plane end to end on a real socket: every endpoint, idempotent start, tenant
isolation, SSE resume, limits and problem documents.

Each test serves the API with uvicorn on a loopback port the kernel picks, over an engine on a
SQLite file in the test's folder, and talks to it with httpx; the workers are real transport
consumers in the same process.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.integration.test_api_support import ROOT, Api, serving, wait_status

from accord.adapters.ingress.limits import ApiLimits
from accord.engine.runtime.requests import request_run_id

PROBLEM = "application/problem+json"
GOOD = {"workflow": "api-flow", "context": {"modelId": "m1"}}
MODEL_INGEST = (ROOT / "workflows" / "model-ingest.yaml").read_text(encoding="utf-8")


def problem(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    doc: dict[str, Any] = response.json()
    assert doc["status"] == status and doc["type"].endswith(doc["code"]), doc
    assert {"type", "title", "status", "detail", "code"} <= set(doc), doc
    if code is not None:
        assert doc["code"] == code, doc
    return doc


async def start(
    api: Api,
    body: dict[str, Any] | None = None,
    key: str | None = None,
    role: str = "operator",
    tenant: str = "acme",
) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key else {}
    async with api.as_(role, tenant) as client:
        return await client.post("/v1/runs", json=body or GOOD, headers=headers)


async def test_a_run_started_through_the_api_completes_and_is_read_back(tmp_path: Path) -> None:
    async with serving(tmp_path) as api:
        async with api.client() as anon:
            assert (await anon.get("/healthz")).json()["status"] == "ok"
            spec = (await anon.get("/openapi.json")).json()
            assert spec["openapi"].startswith("3.1") and "/v1/runs" in spec["paths"]
        started = await start(api, key="order-1")
        assert started.status_code == 201, started.text
        doc = started.json()
        assert doc["run_id"] == request_run_id("acme", "order-1") and doc["tenant"] == "acme"
        assert started.headers["location"] == f"/v1/runs/{doc['run_id']}"
        assert started.headers["x-request-id"]
        done = await wait_status(api, doc["run_id"])
        assert done["status"] == "completed" and done["stages"]["work"]["status"] == "completed"
        assert done["context"] == {"modelId": "***"}  # the API shows no context values
        async with api.as_("viewer") as client:
            history = (await client.get(f"/v1/runs/{doc['run_id']}/history")).json()
            seqs = [e["seq"] for e in history["entries"]]
            assert seqs == sorted(seqs) and len(seqs) >= 3 and history["next_after"] is None
            kinds = [e["event"]["kind"] for e in history["entries"]]
            assert kinds[0] == "run-started" and "stage-succeeded" in kinds
            page = (
                await client.get(f"/v1/runs/{doc['run_id']}/history", params={"limit": 2})
            ).json()
            assert [e["seq"] for e in page["entries"]] == seqs[:2]
            rest = (
                await client.get(
                    f"/v1/runs/{doc['run_id']}/history", params={"after": page["next_after"]}
                )
            ).json()
            assert [e["seq"] for e in rest["entries"]] == seqs[2:]
            told = (await client.get(f"/v1/runs/{doc['run_id']}/explanation")).json()
            assert told["status"] == "completed" and told["explanation"]
            assert all(isinstance(line, str) for line in told["explanation"])


async def test_start_is_idempotent_on_the_key_and_refuses_another_body(tmp_path: Path) -> None:
    async with serving(tmp_path) as api:
        first = await start(api, key="k-1")
        again = await start(api, key="k-1")
        assert first.status_code == 201 and again.status_code == 200, again.text
        assert again.json()["run_id"] == first.json()["run_id"]
        assert again.json()["state"] == "existing"
        other = await start(api, {"workflow": "api-flow", "context": {"modelId": "m2"}}, "k-1")
        problem(other, 409, "idempotency-key-reused")
        # the same key in another tenant is another run
        elsewhere = await start(api, key="k-1", tenant="globex")
        assert elsewhere.status_code == 201
        assert elsewhere.json()["run_id"] != first.json()["run_id"]
        # ten copies at once: one run, one 201
        answers = await asyncio.gather(*(start(api, key="k-burst") for _ in range(10)))
        assert sorted(a.status_code for a in answers).count(201) == 1, [a.text for a in answers]
        assert len({a.json()["run_id"] for a in answers}) == 1
        runs = await api.engine.store.list_runs(100, tenant="acme")
        assert len(runs) == 2
        # without a key every start is a new run
        a, b = await start(api), await start(api)
        assert a.json()["run_id"] != b.json()["run_id"]


async def test_the_runs_tenant_is_the_principals_never_the_payloads(tmp_path: Path) -> None:
    async with serving(tmp_path) as api:
        body = {"workflow": "api-flow", "context": {"modelId": "m1", "tenant": "globex"}}
        refused = await start(api, body)
        problem(refused, 422)  # the context contract has no tenant field
        problem(await start(api, {**GOOD, "tenant": "globex"}), 403, "tenant-forbidden")
        problem(await start(api, tenant="both"), 422, "tenant-required")
        named = await start(api, {**GOOD, "tenant": "globex"}, tenant="both")
        assert named.status_code == 201 and named.json()["tenant"] == "globex"
        run_id = named.json()["run_id"]
        async with api.as_("viewer", "acme") as acme, api.as_("viewer", "globex") as globex:
            problem(await acme.get(f"/v1/runs/{run_id}"), 404, "run-not-found")
            assert (await globex.get(f"/v1/runs/{run_id}")).status_code == 200
            problem(await acme.get("/v1/runs", params={"tenant": "globex"}), 403)


async def test_listing_filters_and_pages_with_a_cursor(tmp_path: Path) -> None:
    async with serving(tmp_path) as api:
        ids = []
        for i in range(5):
            got = await start(api, {"workflow": "api-flow", "context": {"modelId": f"m{i}"}})
            ids.append(got.json()["run_id"])
        idle = (await start(api, {"workflow": "api-idle", "context": {"modelId": "x"}})).json()
        for run_id in ids:
            await wait_status(api, run_id)
        async with api.as_("viewer") as client:
            seen: list[str] = []
            cursor = None
            for _ in range(10):
                params: dict[str, Any] = {"limit": 2, "workflow": "api-flow"}
                if cursor:
                    params["cursor"] = cursor
                page = (await client.get("/v1/runs", params=params)).json()
                seen += [r["run_id"] for r in page["runs"]]
                cursor = page["next_cursor"]
                if cursor is None:
                    break
            assert sorted(seen) == sorted(ids) and len(seen) == 5
            running = (await client.get("/v1/runs", params={"status": "running"})).json()
            assert [r["run_id"] for r in running["runs"]] == [idle["run_id"]]
            queued = (
                await client.get("/v1/runs", params={"stage": "work", "stage_status": "queued"})
            ).json()
            assert [r["run_id"] for r in queued["runs"]] == [idle["run_id"]]
            digest = idle["plan_digest"]
            by_digest = (await client.get("/v1/runs", params={"digest": digest})).json()
            assert [r["run_id"] for r in by_digest["runs"]] == [idle["run_id"]]
            future = (await client.get("/v1/runs", params={"started_after": 2**52})).json()
            assert future["runs"] == []
            past = (await client.get("/v1/runs", params={"started_before": 1})).json()
            assert past["runs"] == []
            everything = (await client.get("/v1/runs", params={"limit": 100})).json()
            assert len(everything["runs"]) == 6
            problem(await client.get("/v1/runs", params={"limit": 501}), 422, "page-too-large")
            problem(await client.get("/v1/runs", params={"cursor": "garbage"}), 422)
        async with api.as_("viewer", "globex") as other:
            assert (await other.get("/v1/runs")).json()["runs"] == []


async def test_cancel_and_redrive_are_recorded_with_who_asked(tmp_path: Path) -> None:
    async with serving(tmp_path) as api:
        idle = (await start(api, {"workflow": "api-idle", "context": {"modelId": "x"}})).json()
        flaky = await start(api, {"workflow": "api-fallback", "context": {"modelId": "y"}})
        flaky_id = flaky.json()["run_id"]
        operator_id = "key:" + api.key("operator").split("_")[1]
        async with api.as_("viewer") as viewer:
            problem(await viewer.post(f"/v1/runs/{idle['run_id']}/cancel"), 403, "forbidden")
        async with api.as_("operator", "globex") as other:
            problem(await other.post(f"/v1/runs/{idle['run_id']}/cancel"), 404)
        async with api.as_("operator") as client:
            done = await client.post(f"/v1/runs/{idle['run_id']}/cancel", json={"reason": "test"})
            assert done.status_code == 200, done.text
            ended = await wait_status(api, idle["run_id"])
            assert ended["status"] == "cancelled"
            history = (await client.get(f"/v1/runs/{idle['run_id']}/history")).json()["entries"]
            asked = [e for e in history if e["event"]["kind"] == "cancel-requested"]
            assert asked and asked[0]["event"]["by"] == operator_id
            assert asked[0]["event"]["reason"] == "test"
            # the flaky stage failed over to notify: the run is open, the stage may be re-driven
            async with asyncio.timeout(20):
                while (await client.get(f"/v1/runs/{flaky_id}")).json()["stages"]["work"][
                    "status"
                ] != "failed":
                    await asyncio.sleep(0.05)
            problem(await client.post(f"/v1/runs/{flaky_id}/stages/nope/redrive"), 404)
            again = await client.post(f"/v1/runs/{flaky_id}/stages/work/redrive")
            assert again.status_code == 200, again.text
            assert (await wait_status(api, flaky_id))["status"] == "completed"
            history = (await client.get(f"/v1/runs/{flaky_id}/history")).json()["entries"]
            redrives = [e for e in history if e["event"]["kind"] == "redrive-requested"]
            assert redrives and redrives[0]["event"]["by"] == operator_id
            # a run that has ended refuses both, as its rules say
            problem(await client.post(f"/v1/runs/{flaky_id}/stages/work/redrive"), 409)
        async with api.as_("admin") as admin:
            audit = (await admin.get("/v1/audit")).json()["records"]
            actions = [(r["action"], r["target"]) for r in audit]
            assert ("run.cancel", idle["run_id"]) in actions
            assert ("run.redrive", f"{flaky_id}/work") in actions
            assert all(r["principal"] and r["request_id"] and r["at_ms"] for r in audit)


async def test_workflows_are_compiled_admitted_activated_and_rolled_back(tmp_path: Path) -> None:
    async with serving(tmp_path) as api:
        body = {"source": MODEL_INGEST, "filename": "model-ingest.yaml"}
        async with api.as_("operator") as operator:
            problem(await operator.post("/v1/workflows", json=body), 403)
        async with api.as_("author") as author:
            refused = await author.post("/v1/workflows", json=body)  # no worker is live
            doc = problem(refused, 422, "workflow-not-admitted")
            assert doc["diagnostics"] and doc["diagnostics"][0]["code"].startswith("admission")
            made = await author.post("/v1/workflows", json={**body, "admit": False})
            assert made.status_code == 201, made.text
            first = made.json()
            assert first["workflow"] == "model-ingest" and first["changed"] is True
            same = await author.post("/v1/workflows", json={**body, "admit": False})
            assert same.status_code == 200 and same.json()["changed"] is False
            broken = MODEL_INGEST.replace("on_success:", "on_sucess:", 1)
            bad = await author.post("/v1/workflows", json={"source": broken, "filename": "mi.yaml"})
            doc = problem(bad, 422, "workflow-refused")
            found = doc["diagnostics"][0]
            assert found["file"] == "mi.yaml" and isinstance(found["line"], int), found
            changed = MODEL_INGEST.replace("version:", "version: 9.9.9\n# was:", 1)
            second = (
                await author.post("/v1/workflows", json={"source": changed, "admit": False})
            ).json()
            assert second["digest"] != first["digest"]
            versions = (await author.get("/v1/workflows/model-ingest/versions")).json()
            assert [v["digest"] for v in versions["versions"]] == [
                first["digest"],
                second["digest"],
            ]
            back = await author.post("/v1/workflows/model-ingest/rollback")
            assert back.status_code == 200 and back.json()["digest"] == first["digest"]
            active = (await author.get("/v1/workflows/model-ingest")).json()
            assert active["digest"] == first["digest"] and active["plan"]["name"] == "model-ingest"
            listed = (await author.get("/v1/workflows")).json()["workflows"]
            assert {"workflow": "model-ingest", "active": first["digest"]} in listed
            problem(await author.get("/v1/workflows/nope"), 404, "workflow-not-found")
            problem(await author.post("/v1/workflows/nope/rollback"), 404)
            problem(
                await author.post(
                    "/v1/workflows/model-ingest/rollback", json={"digest": "sha256:" + "0" * 64}
                ),
                409,
            )
        async with api.as_("admin") as admin:
            audit = (await admin.get("/v1/audit", params={"action": "workflow.rollback"})).json()
            assert [r["target"] for r in audit["records"]] == ["model-ingest"]


async def test_contracts_versions_compatibility_and_capabilities(tmp_path: Path) -> None:
    async with serving(tmp_path) as api, api.as_("viewer") as client:
        listed = (await client.get("/v1/contracts")).json()["contracts"]
        names = {(c["name"], c["version"]) for c in listed}
        assert ("thumbnail-generation-request", 2) in names
        versions = (await client.get("/v1/contracts/thumbnail-generation-request/versions")).json()
        assert [v["version"] for v in versions["versions"]][:2] == [1, 2]
        one = (await client.get("/v1/contracts/thumbnail-generation-request/versions/1")).json()
        assert one["contract"]["name"] == "thumbnail-generation-request" and one["digest"]
        report = await client.get(
            "/v1/contracts/thumbnail-generation-request/compatibility", params={"from": 1, "to": 2}
        )
        assert report.status_code == 200, report.text
        assert report.json()["report"]["changes"] and "ok" in report.json()
        problem(await client.get("/v1/contracts/nope/versions"), 404, "contract-not-found")
        problem(
            await client.get(
                "/v1/contracts/thumbnail-generation-request/compatibility",
                params={"mode": "sideways"},
            ),
            422,
        )
        await api.engine.announce("w-1", ["test.work@1"], 30_000)
        live = (await client.get("/v1/capabilities")).json()
        assert "test.work@1" in live["workers"]


async def test_keys_are_made_listed_and_revoked_by_admins_of_their_tenants(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as api:
        async with api.as_("admin") as admin:
            made = await admin.post("/v1/keys", json={"role": "viewer", "tenants": ["acme"]})
            assert made.status_code == 201, made.text
            key = made.json()
            assert key["key"].startswith("acc_") and key["role"] == "viewer"
            problem(
                await admin.post("/v1/keys", json={"role": "viewer", "tenants": ["globex"]}),
                403,
                "tenant-forbidden",
            )
            problem(await admin.post("/v1/keys", json={"role": "root", "tenants": ["acme"]}), 422)
            async with api.client(key["key"]) as fresh:
                assert (await fresh.get("/v1/runs")).status_code == 200
                listed = (await admin.get("/v1/keys")).json()["keys"]
                assert key["key_id"] in {k["key_id"] for k in listed}
                assert all("key" not in k and set(k["tenants"]) <= {"acme"} for k in listed)
                gone = await admin.delete(f"/v1/keys/{key['key_id']}")
                assert gone.status_code == 200
                problem(await fresh.get("/v1/runs"), 401, "key-invalid")
                problem(await admin.delete(f"/v1/keys/{key['key_id']}"), 409)
            audit = (await admin.get("/v1/audit")).json()["records"]
            assert ("key.create", key["key_id"]) in {(r["action"], r["target"]) for r in audit}
            assert ("key.revoke", key["key_id"]) in {(r["action"], r["target"]) for r in audit}
        async with api.as_("admin", "globex") as other:
            problem(await other.delete(f"/v1/keys/{key['key_id']}"), 404)
            theirs = (await other.get("/v1/audit")).json()["records"]
            assert all(r["tenant"] in ("globex", "*") for r in theirs)
        async with api.as_("operator") as operator:
            problem(await operator.get("/v1/audit"), 403)
            problem(await operator.get("/v1/keys"), 403)


async def test_bad_input_is_a_problem_document_never_a_500(tmp_path: Path) -> None:
    async with serving(tmp_path) as api:
        async with api.client() as anon:
            problem(await anon.get("/v1/runs"), 401, "unauthenticated")
            problem(await anon.get("/v1/runs", headers={"Authorization": "Bearer nope"}), 401)
            problem(await anon.get("/v1/runs", headers={"Authorization": "Bearer acc_x_y"}), 401)
            problem(await anon.get("/v1/nothing-here"), 404, "not-found")
            problem(await anon.delete("/v1/runs"), 405)
        async with api.as_("operator") as client:
            raw = {"content-type": "application/json"}
            doc = problem(await client.post("/v1/runs", content=b"{not json", headers=raw), 422)
            assert doc["errors"] and doc["errors"][0]["where"].startswith("body")
            doc = problem(await client.post("/v1/runs", json={"context": {}}), 422)
            assert any(e["where"] == "body.workflow" for e in doc["errors"]), doc
            problem(await client.post("/v1/runs", json=[1, 2]), 422)
            problem(await client.post("/v1/runs", json={**GOOD, "extra": 1}), 422)
            doc = problem(
                await client.post(
                    "/v1/runs", json={"workflow": "api-flow", "context": {"modelId": 7}}
                ),
                422,
            )
            assert doc["violations"][0]["path"] == "modelId", doc
            problem(
                await client.post("/v1/runs", json={"workflow": "nope"}), 422, "workflow-not-active"
            )
            problem(
                await client.post(
                    "/v1/runs",
                    content=b'{"workflow": "api-flow", "context": {"x": NaN}}',
                    headers=raw,
                ),
                422,
            )
            bad_key = await client.post("/v1/runs", json=GOOD, headers={"Idempotency-Key": "a b"})
            problem(bad_key, 422)
            problem(await client.get("/v1/runs/not a run id"), 422)
            problem(await client.get("/v1/runs/run_000/history", params={"after": "x"}), 422)
            problem(await client.get("/v1/runs/run_000"), 404, "run-not-found")
            problem(await client.get("/v1/runs/run_000/events"), 404)
            problem(
                await client.get("/v1/runs/run_000/events", headers={"Last-Event-ID": "abc"}), 422
            )


async def test_limits_body_size_rate_and_page_size(tmp_path: Path) -> None:
    limits = ApiLimits(max_body_bytes=2_048, rate_per_s=1.0, burst=3, page_max=10, history_max=5)
    async with serving(tmp_path, limits=limits) as api, api.as_("operator") as client:
        big = {"workflow": "api-flow", "context": {"modelId": "m", "pad": "x" * 4_096}}
        problem(await client.post("/v1/runs", json=big), 413, "body-too-large")

        async def chunks() -> Any:
            for _ in range(8):
                yield b" " * 512

        streamed = await client.post(
            "/v1/runs", content=chunks(), headers={"content-type": "application/json"}
        )
        problem(streamed, 413, "body-too-large")
        answers = [await client.get("/v1/runs", params={"limit": 5}) for _ in range(6)]
        limited = [a for a in answers if a.status_code == 429]
        assert limited, [a.status_code for a in answers]
        doc = problem(limited[0], 429, "rate-limited")
        assert int(limited[0].headers["retry-after"]) >= 1 and doc["retry_after"] >= 1
        # another principal has its own bucket
        async with api.as_("viewer") as other:
            assert (await other.get("/v1/runs")).status_code == 200
            problem(await other.get("/v1/runs", params={"limit": 11}), 422, "page-too-large")
            problem(await other.get("/v1/runs/run_000/history", params={"limit": 6}), 422)


async def _events(
    client: httpx.AsyncClient, run_id: str, last: int | None, count: int | None = None
) -> list[tuple[str, str, dict[str, Any]]]:
    """``(id, event, data)`` of the stream's events: ``count`` of them, or up to its end."""
    headers = {"Last-Event-ID": str(last)} if last is not None else {}
    out: list[tuple[str, str, dict[str, Any]]] = []
    async with client.stream("GET", f"/v1/runs/{run_id}/events", headers=headers) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        fields: dict[str, str] = {}
        async for line in stream.aiter_lines():
            if line:
                name, _, value = line.partition(":")
                fields[name] = value.strip()
                continue
            if "data" in fields:
                out.append(
                    (fields.get("id", ""), fields.get("event", ""), json.loads(fields["data"]))
                )
                if count is not None and len(out) == count:
                    break
            fields = {}
    return out


async def test_events_stream_history_live_and_resume_with_last_event_id(tmp_path: Path) -> None:
    async with serving(tmp_path) as api:
        run_id = (
            await start(api, {"workflow": "api-fallback", "context": {"modelId": "s"}})
        ).json()["run_id"]
        async with api.as_("viewer") as client:
            first = await _events(client, run_id, None, count=2)
            assert [e[1] for e in first] == ["history", "history"]
            assert first[0][2]["event"]["kind"] == "run-started"
            last = int(first[-1][0])
            async with api.as_("operator") as operator:  # the stream follows what happens next
                async with asyncio.timeout(20):
                    while (await operator.get(f"/v1/runs/{run_id}")).json()["stages"]["work"][
                        "status"
                    ] != "failed":
                        await asyncio.sleep(0.05)
                await operator.post(f"/v1/runs/{run_id}/stages/work/redrive")
            rest = await _events(client, run_id, last)
            ids = [int(e[0]) for e in rest if e[1] == "history"]
            assert ids and ids[0] == last + 1 and ids == sorted(ids)
            assert rest[-1][1] == "end" and rest[-1][2]["status"] == "completed"
            whole = [
                int(e["seq"])
                for e in (await client.get(f"/v1/runs/{run_id}/history")).json()["entries"]
            ]
            assert [int(e[0]) for e in first] + ids == whole
            # an ended run: the stream sends what is after the id, then ends
            tail = await _events(client, run_id, whole[-2])
            assert [int(e[0]) for e in tail if e[1] == "history"] == [whole[-1]]
        async with api.as_("viewer", "globex") as other:
            problem(await other.get(f"/v1/runs/{run_id}/events"), 404)


@pytest.mark.parametrize("starts", ["queue"])
async def test_without_the_engine_a_start_is_a_run_request_on_the_queue(
    tmp_path: Path, starts: str
) -> None:
    async with serving(tmp_path, starts=starts, worker=False) as api:
        got = await start(api, key="queued-1")
        assert got.status_code == 202 and got.json()["state"] == "queued", got.text
        again = await start(api, key="queued-1")
        assert again.json()["run_id"] == got.json()["run_id"]
        stream = api.engine.transport.consume("accord.runs", 4)
        async with asyncio.timeout(10):
            delivery = await anext(aiter(stream))
        request = json.loads(delivery.body)
        assert request["tenant"] == "acme" and request["idempotencyKey"] == "queued-1"
        assert request["requester"].startswith("key:")
