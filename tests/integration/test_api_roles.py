"""Every role against every action, from the runs' own tenant and from another one.

The table says what each principal (role × tenant) gets for each action on tenant ``acme``'s
runs and on the platform's workflows, keys and audit log: the role decides first (403), then the
tenant (another tenant's run is not found, 404; acting for another tenant is forbidden, 403).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
from tests.integration.test_api_support import ROLES, TENANTS, Api, plan, serving, wait_status

GOOD = {"workflow": "api-flow", "context": {"modelId": "m1"}}
IDLE = {"workflow": "api-idle", "context": {"modelId": "m1"}}

# action: (the least role, status for tenant acme, status for tenant globex)
TABLE: dict[str, tuple[str, int, int]] = {
    "list runs": ("viewer", 200, 403),
    "read run": ("viewer", 200, 404),
    "read history": ("viewer", 200, 404),
    "explain run": ("viewer", 200, 404),
    "follow events": ("viewer", 200, 404),
    "capabilities": ("viewer", 200, 200),
    "contracts": ("viewer", 200, 200),
    "start run": ("operator", 201, 403),
    "cancel run": ("operator", 200, 404),
    "redrive stage": ("operator", 409, 404),  # the run has ended: its rules refuse
    "activate workflow": ("author", 200, 200),  # workflows belong to no tenant
    "roll back workflow": ("author", 200, 200),
    "list keys": ("admin", 200, 200),
    "create key": ("admin", 201, 403),
    "read audit": ("admin", 200, 200),
}
Action = Callable[[httpx.AsyncClient, Api], Awaitable[httpx.Response]]


async def _operator_start(api: Api, body: dict[str, object]) -> str:
    async with api.as_("operator") as client:
        got = await client.post("/v1/runs", json=body)
        assert got.status_code == 201, got.text
        run_id: str = got.json()["run_id"]
        return run_id


def actions(done: str) -> dict[str, Action]:
    async def cancel(c: httpx.AsyncClient, api: Api) -> httpx.Response:
        return await c.post(f"/v1/runs/{await _operator_start(api, IDLE)}/cancel")

    async def events(c: httpx.AsyncClient, api: Api) -> httpx.Response:
        async with c.stream("GET", f"/v1/runs/{done}/events") as stream:
            await stream.aread()
            return stream

    source = (Path(__file__).resolve().parents[2] / "workflows" / "model-ingest.yaml").read_text()
    return {
        "list runs": lambda c, api: c.get("/v1/runs", params={"tenant": "acme"}),
        "read run": lambda c, api: c.get(f"/v1/runs/{done}"),
        "read history": lambda c, api: c.get(f"/v1/runs/{done}/history"),
        "explain run": lambda c, api: c.get(f"/v1/runs/{done}/explanation"),
        "follow events": events,
        "capabilities": lambda c, api: c.get("/v1/capabilities"),
        "contracts": lambda c, api: c.get("/v1/contracts"),
        "start run": lambda c, api: c.post("/v1/runs", json={**GOOD, "tenant": "acme"}),
        "cancel run": cancel,
        "redrive stage": lambda c, api: c.post(f"/v1/runs/{done}/stages/work/redrive"),
        "activate workflow": lambda c, api: c.post(
            "/v1/workflows", json={"source": source, "admit": False}
        ),
        "roll back workflow": lambda c, api: c.post("/v1/workflows/api-flow/rollback"),
        "list keys": lambda c, api: c.get("/v1/keys"),
        "create key": lambda c, api: c.post(
            "/v1/keys", json={"role": "viewer", "tenants": ["acme"]}
        ),
        "read audit": lambda c, api: c.get("/v1/audit"),
    }


def expected(action: str, role: str, tenant: str) -> int:
    least, own, other = TABLE[action]
    if ROLES.index(role) < ROLES.index(least):
        return 403
    return own if tenant == "acme" else other


async def test_principal_by_action_by_tenant_gets_exactly_the_table(tmp_path: Path) -> None:
    async with serving(tmp_path) as api:
        await api.engine.register_plan(plan(version="1.0.1"))  # a second version to roll to
        done = await _operator_start(api, GOOD)
        await wait_status(api, done)
        source = Path(__file__).resolve().parents[2] / "workflows" / "model-ingest.yaml"
        async with api.as_("author") as author:  # first activation: later ones answer 200
            first = await author.post(
                "/v1/workflows", json={"source": source.read_text(), "admit": False}
            )
            assert first.status_code == 201, first.text
        table = actions(done)
        wrong = []
        for role in ROLES:
            for tenant in TENANTS:
                async with api.as_(role, tenant) as client:
                    for action, call in table.items():
                        got = await call(client, api)
                        want = expected(action, role, tenant)
                        if got.status_code != want:
                            wrong.append(f"{role}@{tenant} {action}: {got.status_code} != {want}")
                        if got.status_code >= 400:
                            assert got.headers["content-type"].startswith(
                                "application/problem+json"
                            ), (role, tenant, action)
        assert not wrong, "\n".join(wrong)
        assert set(table) == set(TABLE)
