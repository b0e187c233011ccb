"""Approval gates through the control plane: real uvicorn on loopback, an engine on SQLite.

A run's first task is answered by a worker at once, then the run waits at its gate until a
decision arrives over HTTP (or the gate's durable timer fires). Refused decisions are recorded in
the run's history and the audit log.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.integration.test_api_support import QUEUE, Api, serving, wait_status

from accord.engine.machine.events import RunStarted
from accord.testing.plans import pin
from accord.workflow.plan import (
    ApprovalStage,
    Approvers,
    Binding,
    Plan,
    RetryPolicy,
    TaskStage,
    Timeouts,
)

FORM = "model-ingest-context@1"  # a real message contract stands in for a review form


def gated_plan(timeout_ms: int = 600_000, *, min_: int = 1, name: str = "api-gated") -> Plan:
    work = TaskStage(
        name="work",
        type="worker",
        capability=pin("test.work"),
        input={"modelId": Binding(source="context", path=("modelId",), raw="${context.modelId}")},
        on_success="review",
        on_failure="failed",
        retry=RetryPolicy(max_attempts=1),
        timeouts=Timeouts(queue_deadline_ms=600_000, execution_deadline_ms=600_000),
        queue=QUEUE,
    )
    gate = ApprovalStage(
        name="review",
        approvers=Approvers(role="operator", tenant_scoped=True, min=min_, exclude_requester=True),
        options=("approve", "reject"),
        on_approve="completed",
        on_reject="failed",
        timeout_ms=timeout_ms,
        on_timeout="failed",
        form=FORM,
    )
    return Plan.create(name=name, version="1.0.0", entry="work", stages=(work, gate))


async def _start(api: Api, plan: Plan, run_id: str, requested_by: str = "") -> None:
    await api.engine.register_plan(plan)
    await api.engine.deliver(
        RunStarted(
            run_id=run_id,
            tenant="acme",
            workflow=plan.name,
            plan_digest=plan.digest,
            context={"modelId": "m-1"},
            requested_by=requested_by,
        )
    )
    async with asyncio.timeout(20):
        while True:
            run = await api.engine.load(run_id)
            assert run is not None
            if run.stages["review"].status != "pending":
                return
            await asyncio.sleep(0.02)


def _key_id(api: Api, role: str, tenant: str = "acme") -> str:
    return "key:" + api.key(role, tenant).split("_")[1]


async def _history(api: Api, run_id: str) -> list[dict[str, Any]]:
    return [dict(h) for h in await api.engine.store.history(run_id)]


async def test_an_operator_approves_through_the_api_and_the_run_completes(tmp_path: Path) -> None:
    async with serving(tmp_path) as api:
        await _start(api, gated_plan(), "run-approve")
        report = await api.engine.reconcile()  # a waiting gate is not a stuck run
        assert not [x for x in report.divergences if x.run_id == "run-approve"]
        async with api.as_("operator") as client:
            listed = (await client.get("/v1/approvals")).json()["approvals"]
            assert [(g["run_id"], g["stage"]) for g in listed] == [("run-approve", "review")]
            assert listed[0]["form"] == FORM and listed[0]["needed"] == 1
            got = await client.post(
                "/v1/runs/run-approve/stages/review/approve",
                json={"comment": "fine", "form": {"modelId": "m-1"}},
            )
            assert got.status_code == 200, got.text
            assert got.json()["gate"]["decision"] == "approve"
            (decision,) = got.json()["gate"]["decisions"]
            assert decision["by"] == _key_id(api, "operator")
            assert decision["comment"] == "fine" and decision["form"] == {"modelId": "m-1"}
            assert (await client.get("/v1/approvals")).json()["approvals"] == []
        assert (await wait_status(api, "run-approve"))["status"] == "completed"
        async with api.as_("admin") as admin:
            audit = (await admin.get("/v1/audit")).json()["records"]
        (record,) = [r for r in audit if r["action"] == "approval.approve"]
        assert record["target"] == "run-approve/review" and record["principal"] == decision["by"]


async def test_a_rejection_through_the_api_fails_the_run(tmp_path: Path) -> None:
    async with serving(tmp_path) as api:
        await _start(api, gated_plan(), "run-reject")
        async with api.as_("operator") as client:
            got = await client.post(
                "/v1/runs/run-reject/stages/review/reject",
                json={"comment": "no", "form": {"modelId": "m-1"}},
            )
            assert got.status_code == 200, got.text
            again = await client.post(
                "/v1/runs/run-reject/stages/review/approve", json={"form": {"modelId": "m-1"}}
            )
            assert again.status_code == 409 and again.json()["reason"] in ("late", "duplicate")
        run = await wait_status(api, "run-reject")
        assert run["status"] == "failed"
        assert run["error"]["code"] == "approval-rejected"


async def test_a_gate_nobody_decides_times_out_on_its_durable_timer(tmp_path: Path) -> None:
    async with serving(tmp_path) as api:
        await _start(api, gated_plan(timeout_ms=300, name="api-gated-short"), "run-timeout")
        run = await wait_status(api, "run-timeout")
        assert run["status"] == "failed" and run["error"]["code"] == "approval-timeout"
        async with api.as_("operator") as client:
            late = await client.post(
                "/v1/runs/run-timeout/stages/review/approve", json={"form": {"modelId": "m-1"}}
            )
        assert late.status_code == 409 and late.json()["reason"] == "late"


async def test_refused_decisions_are_answered_and_recorded(tmp_path: Path) -> None:
    async with serving(tmp_path) as api:
        requester = _key_id(api, "admin")
        await _start(api, gated_plan(min_=2), "run-refuse", requested_by=requester)
        form = {"form": {"modelId": "m-1"}}
        path = "/v1/runs/run-refuse/stages/review/approve"
        async with api.as_("viewer") as viewer:
            role = await viewer.post(path, json=form)
            assert role.status_code == 403 and role.json()["reason"] == "forbidden"
            assert (await viewer.get("/v1/approvals")).json()["approvals"] == []
        async with api.as_("admin") as admin:
            own = await admin.post(path, json=form)
            assert own.status_code == 403 and "requested the run" in own.json()["detail"]
            assert (await admin.get("/v1/approvals")).json()["approvals"] == []
        async with api.as_("operator", "globex") as outsider:
            other = await outsider.post(path, json=form)
            assert other.status_code == 404  # another tenant's run is not said to exist
        async with api.as_("operator") as client:
            bad = await client.post(path, json={"form": {"modelId": 7}})
            assert bad.status_code == 422 and bad.json()["reason"] == "invalid"
            assert "modelId" in bad.json()["detail"]
            first = await client.post(path, json=form)
            assert first.status_code == 200 and first.json()["gate"]["status"] == "waiting"
            twice = await client.post(path, json=form)
            assert twice.status_code == 409 and twice.json()["reason"] == "duplicate"
            missing = await client.post("/v1/runs/run-refuse/stages/work/approve", json=form)
            assert missing.status_code == 404 and missing.json()["code"] == "gate-not-found"
            unknown = await client.post(
                "/v1/runs/run-refuse/stages/review/approve", json={"verdict": "yes"}
            )
            assert unknown.status_code == 422
        refused = [h for h in await _history(api, "run-refuse") if not h["accepted"]]
        reasons = [h["reason"] for h in refused if h["event"]["kind"] == "approval-decided"]
        assert reasons == ["forbidden", "forbidden", "forbidden", "invalid", "duplicate"]
        async with api.as_("operator", "both") as second:
            done = await second.post(path, json=form)
            assert done.status_code == 200 and done.json()["gate"]["status"] == "completed"
        assert (await wait_status(api, "run-refuse"))["status"] == "completed"


async def test_cancelling_a_run_cancels_its_waiting_gate(tmp_path: Path) -> None:
    async with serving(tmp_path) as api:
        await _start(api, gated_plan(), "run-cancel")
        async with api.as_("operator") as client:
            got = await client.post("/v1/runs/run-cancel/cancel", json={"reason": "stop"})
            assert got.status_code == 200, got.text
        run = await wait_status(api, "run-cancel")
        assert run["status"] == "cancelled"
        assert run["stages"]["review"]["status"] == "cancelled"


async def test_the_principal_that_starts_a_run_through_the_api_may_not_approve_it(
    tmp_path: Path,
) -> None:
    """``exclude_requester`` holds for runs started over HTTP: the run records its starter."""
    async with serving(tmp_path) as api:
        plan = gated_plan(name="api-gated-started")
        await api.engine.register_plan(plan)
        async with api.as_("operator") as client:
            got = await client.post(
                "/v1/runs",
                json={"workflow": plan.name, "context": {"modelId": "m-1"}},
                headers={"Idempotency-Key": "gated-by-api"},
            )
            assert got.status_code == 201, got.text
            run_id = got.json()["run_id"]
            run = await api.engine.load(run_id)
            assert run is not None and run.requested_by == _key_id(api, "operator")
            async with asyncio.timeout(20):
                while (run := await api.engine.load(run_id)) is not None and run.stages[
                    "review"
                ].status == "pending":
                    await asyncio.sleep(0.02)
            own = await client.post(
                f"/v1/runs/{run_id}/stages/review/approve", json={"form": {"modelId": "m-1"}}
            )
            assert own.status_code == 403 and "requested the run" in own.json()["detail"]
        async with api.as_("operator", "both") as other:
            done = await other.post(
                f"/v1/runs/{run_id}/stages/review/approve", json={"form": {"modelId": "m-1"}}
            )
            assert done.status_code == 200, done.text
        assert (await wait_status(api, run_id))["status"] == "completed"
