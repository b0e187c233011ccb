"""Migration and canaries through the control plane: real uvicorn on loopback, an engine on
SQLite. A run waiting at its approval gate moves to a new version over HTTP (author role) and
completes there once approved; a version without the gate is refused with each refusal, and the
refusal is in the run's history; canaries begin, report and abort over HTTP."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tests.integration.test_api_support import Api, serving, wait_status
from tests.integration.test_approvals_api import _start, gated_plan

from accord.workflow.activation import stored_document
from accord.workflow.plan import Plan


def _later(plan: Plan, version: str, **changes: object) -> Plan:
    return Plan.create(
        name=plan.name, version=version, entry=plan.entry, stages=plan.stages, **changes
    )


async def _store(api: Api, plan: Plan) -> None:
    await api.engine.store.put_plan(plan.digest, stored_document(plan))


async def test_a_waiting_run_migrates_over_http_and_completes_on_the_new_version(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as api:
        old = gated_plan(name="api-migrated")
        await _start(api, old, "run-move")
        new = _later(old, "1.1.0", deadline_ms=86_400_000)
        without_gate = Plan.create(
            name=old.name,
            version="2.0.0",
            entry="work",
            stages=(dataclasses.replace(old.stages[0], on_success="completed"),),
        )
        await _store(api, new)
        await _store(api, without_gate)
        async with api.as_("operator") as client:
            got = await client.post("/v1/runs/run-move/migrate", json={"to": new.digest})
            assert got.status_code == 403, got.text  # author role
        async with api.as_("author", "globex") as client:
            got = await client.post("/v1/runs/run-move/migrate", json={"to": new.digest})
            assert got.status_code == 404, got.text  # another tenant's run does not exist
        async with api.as_("author") as client:
            got = await client.post(
                "/v1/runs/run-move/migrate",
                json={"to": without_gate.digest, "reason": "drop review"},
            )
            assert got.status_code == 409, got.text
            (refusal,) = got.json()["refusals"]
            assert refusal["code"] == "migration-strands-attempt" and refusal["stage"] == "review"
            got = await client.post(
                "/v1/runs/run-move/migrate", json={"to": new.digest, "map": {"nope": "review"}}
            )
            assert got.status_code == 422 and got.json()["code"] == "migration-bad-map"
            got = await client.post("/v1/runs/run-move/migrate", json={"to": "sha256:" + "0" * 64})
            assert got.status_code == 422 and got.json()["code"] == "migration-unknown-plan"
            got = await client.post("/v1/runs/run-move/migrate", json={"to": "not-a-digest"})
            assert got.status_code == 422
            got = await client.post(
                "/v1/runs/run-move/migrate", json={"to": new.digest, "reason": "longer deadline"}
            )
            assert got.status_code == 200, got.text
            assert got.json()["map"]["to"]["version"] == "1.1.0"
        run = await api.engine.load("run-move")
        assert run is not None and run.plan_digest == new.digest
        history = await api.engine.store.history("run-move")
        kinds = [
            (h["event"]["kind"], h["accepted"])
            for h in history
            if h["event"]["kind"] == "run-migrated"
        ]
        assert kinds == [("run-migrated", False), ("run-migrated", True)]
        async with api.as_("operator") as client:
            got = await client.post(
                "/v1/runs/run-move/stages/review/approve", json={"form": {"modelId": "m-1"}}
            )
            assert got.status_code == 200, got.text
        assert (await wait_status(api, "run-move"))["status"] == "completed"
        async with api.as_("admin") as admin:
            audit = (await admin.get("/v1/audit")).json()["records"]
        moves = [r for r in audit if r["action"] == "run.migrate"]
        assert len(moves) == 2


async def test_canaries_begin_report_and_abort_over_http(tmp_path: Path) -> None:
    async with serving(tmp_path) as api:
        stable = gated_plan(name="api-canary")
        await api.engine.register_plan(stable)
        new = _later(stable, "1.1.0", deadline_ms=86_400_000)
        await _store(api, new)
        async with api.as_("author") as client:
            got = await client.get("/v1/workflows/api-canary/canary")
            assert got.status_code == 404 and got.json()["code"] == "canary-none"
            got = await client.post(
                "/v1/workflows/api-canary/canary", json={"digest": new.digest, "share": "0%"}
            )
            assert got.status_code == 422 and got.json()["code"] == "canary-bad-share"
            got = await client.post(
                "/v1/workflows/api-canary/canary",
                json={"digest": new.digest, "share": "10%", "min_runs": 3},
            )
            assert got.status_code == 201, got.text
            assert got.json()["canary"]["stable"] == stable.digest
            got = await client.post(
                "/v1/workflows/api-canary/canary", json={"digest": new.digest, "share": "10%"}
            )
            assert got.status_code == 409 and got.json()["code"] == "canary-running"
            got = await client.get("/v1/workflows/api-canary/canary")
            assert got.status_code == 200 and got.json()["verdict"]["decision"] == "wait"
            got = await client.post("/v1/workflows/api-canary/canary/promote", json={"auto": True})
            assert got.status_code == 200 and got.json()["decision"] == "wait"
            got = await client.post(
                "/v1/workflows/api-canary/canary/abort", json={"reason": "not now"}
            )
            assert got.status_code == 200 and got.json()["canary"]["state"] == "aborted"
            got = await client.post("/v1/workflows/api-canary/canary/abort")
            assert got.status_code == 404
        assert await api.engine.store.get_active("api-canary") == stable.digest
