"""Webhook triggers over a real uvicorn on loopback: signatures, contracts, dedupe, admission."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from tests.integration._triggers_kit import WEBHOOK, engines, plan, sqlite_opener

from accord.adapters.clock import SystemClock
from accord.adapters.ingress.app import create_app
from accord.adapters.ingress.control import ControlStore
from accord.adapters.ingress.limits import ApiLimits
from accord.adapters.ingress.triggers import REJECTED_STATUS, TriggerIntake, load_sources
from accord.adapters.ingress.webhooks import sign_headers
from accord.engine.runtime.orchestrator import Engine
from accord.workflow.plan import Plan

SECRET_OLD = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SECRET_NEW = "whsec_" + "c2VjcmV0LXR3by1mb3ItdGhlLXRlc3RzLW9r"
SOURCES = f"""
sources:
  storefront:
    keys: {{ sf-old: {SECRET_OLD}, sf-new: {SECRET_NEW} }}
    tenants: [default, acme]
    tolerance_s: 60
"""


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class Hook:
    url: str
    engine: Engine
    intake: TriggerIntake
    plan: Plan

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=30)


@contextlib.asynccontextmanager
async def serving(tmp: Path, p: Plan | None = None) -> AsyncIterator[Hook]:
    chosen = p or plan(WEBHOOK, name="hooked")
    (tmp / "sources.yaml").write_text(SOURCES, encoding="utf-8")
    async with engines(sqlite_opener(tmp), SystemClock(), chosen, count=1) as (engine,):
        control = ControlStore(tmp / "control.db")
        app = create_app(engine, control, limits=ApiLimits(rate_per_s=10_000, burst=10_000))
        intake = TriggerIntake(engine, load_sources(tmp / "sources.yaml"))
        app.state.triggers = intake
        server = _Server(uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off",
                                        log_level="warning", access_log=False))  # fmt: skip
        serve = asyncio.get_running_loop().create_task(server.serve())
        try:
            async with asyncio.timeout(10):
                while not server.started:
                    assert not serve.done(), "the server did not start"
                    await asyncio.sleep(0.01)
            port = server.servers[0].sockets[0].getsockname()[1]
            yield Hook(f"http://127.0.0.1:{port}", engine, intake, chosen)
        finally:
            server.should_exit = True
            await asyncio.wait_for(serve, 15)
            control.close()


def _body(model: str = "m-1", **extra: Any) -> bytes:
    return json.dumps({"modelId": model, **extra}).encode()


def _signed(
    body: bytes, key: str = "sf-new", secret: str = SECRET_NEW, **kw: Any
) -> dict[str, str]:
    headers = sign_headers(key, secret, kw.pop("wid", f"msg_{uuid.uuid4().hex}"), body, **kw)
    headers["content-type"] = "application/json"
    return headers


PATH = "/v1/triggers/hooked/upload-webhook"


async def test_a_signed_event_starts_one_run_with_its_bound_context(tmp_path: Path) -> None:
    async with serving(tmp_path) as hook, hook.client() as c:
        body = _body("m-7", objectKey="models/m-7.glb")
        got = await c.post(PATH, content=body, headers=_signed(body))
        assert got.status_code == 202, got.text
        doc = got.json()
        assert doc["existing"] is False and doc["tenant"] == "default"
        run = await hook.engine.load(doc["runId"])
        assert run is not None and run.workflow == "hooked"
        assert dict(run.context) == {"modelId": "m-7", "objectKey": "models/m-7.glb"}


async def test_both_keys_of_a_rotation_are_accepted(tmp_path: Path) -> None:
    async with serving(tmp_path) as hook, hook.client() as c:
        for i, (kid, secret) in enumerate((("sf-old", SECRET_OLD), ("sf-new", SECRET_NEW))):
            body = _body(f"rot-{i}")
            got = await c.post(PATH, content=body, headers=_signed(body, kid, secret))
            assert got.status_code == 202, got.text


async def test_every_signature_failure_is_refused_and_starts_nothing(tmp_path: Path) -> None:
    now = int(time.time())
    body = _body("sig-1")
    good = _signed(body)
    cases: dict[str, tuple[dict[str, str], int]] = {
        "missing-signature": ({"content-type": "application/json"}, 401),
        "missing-key-id": ({k: v for k, v in good.items() if k != "accord-key-id"}, 401),
        "unknown-key": ({**good, "accord-key-id": "sf-gone"}, 401),
        "timestamp-expired": (_signed(body, timestamp=now - 3600), 401),
        "timestamp-in-future": (_signed(body, timestamp=now + 3600), 401),
        "malformed-signature": ({**good, "webhook-timestamp": "12.5e3"}, 401),
        "bad-signature": (_signed(body, "sf-new", SECRET_OLD), 401),
    }
    async with serving(tmp_path) as hook, hook.client() as c:
        for code, (headers, status) in cases.items():
            got = await c.post(PATH, content=body, headers=headers)
            assert got.status_code == status, (code, got.text)
            assert got.json()["code"] == code, (code, got.text)
        assert await hook.engine.store.list_runs(10, workflow="hooked") == []
        # the good delivery once, then again: the second is a replay
        first = await c.post(PATH, content=body, headers=good)
        assert first.status_code == 202, first.text
        again = await c.post(PATH, content=body, headers=good)
        assert again.status_code == 409 and again.json()["code"] == "replayed"
        # a tampered body under a valid signature
        other = _body("sig-2")
        tampered = await c.post(PATH, content=other, headers=_signed(body))
        assert tampered.status_code == 401 and tampered.json()["code"] == "bad-signature"


async def test_unknown_source_is_401(tmp_path: Path) -> None:
    p = plan(WEBHOOK.replace("source: storefront", "source: backoffice"), name="hooked")
    async with serving(tmp_path, p) as hook, hook.client() as c:
        body = _body()
        got = await c.post(PATH, content=body, headers=_signed(body))
        assert got.status_code == 401 and got.json()["code"] == "unknown-source"


async def test_unknown_workflow_or_trigger_is_404(tmp_path: Path) -> None:
    async with serving(tmp_path) as hook, hook.client() as c:
        body = _body()
        for path in ("/v1/triggers/nope/upload-webhook", "/v1/triggers/hooked/nope"):
            got = await c.post(path, content=body, headers=_signed(body))
            assert got.status_code == 404, got.text


async def test_a_body_breaking_the_event_contract_is_422_recorded_and_never_started(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as hook, hook.client() as c:
        bad = json.dumps({"modelId": "has spaces!", "colour": "red"}).encode()
        got = await c.post(PATH, content=bad, headers=_signed(bad))
        assert got.status_code == 422, got.text
        doc = got.json()
        assert doc["code"] == "event-invalid"
        paths = {v["path"] for v in doc["violations"]}
        assert "modelId" in paths and "colour" in paths
        junk = b"{not json"
        got = await c.post(PATH, content=junk, headers=_signed(junk))
        assert got.status_code == 422 and got.json()["code"] == "event-invalid"
        assert await hook.engine.store.list_runs(10, workflow="hooked", status="running") == []
        records = await hook.intake.rejected("hooked")
        assert len(records) == 2
        assert {r["kind"] for r in records} == {REJECTED_STATUS}
        assert any("has spaces!" in str(r["body"]) for r in records)


async def test_fifty_concurrent_duplicate_deliveries_start_one_run(tmp_path: Path) -> None:
    async with serving(tmp_path) as hook, hook.client() as c:
        body = _body("dup-1")

        async def deliver() -> httpx.Response:
            return await c.post(PATH, content=body, headers=_signed(body))

        answers = await asyncio.gather(*(deliver() for _ in range(50)))
        assert [a.status_code for a in answers] == [202] * 50, [a.text for a in answers][:3]
        ids = {a.json()["runId"] for a in answers}
        assert len(ids) == 1
        assert sum(1 for a in answers if a.json()["existing"] is False) >= 1
        runs = await hook.engine.store.list_runs(100, workflow="hooked")
        assert [r.run_id for r in runs] == list(ids)


async def test_a_tenant_the_source_may_not_serve_is_refused_with_429(tmp_path: Path) -> None:
    async with serving(tmp_path) as hook, hook.client() as c:
        body = _body("t-1")
        got = await c.post(PATH, content=body, headers={**_signed(body), "accord-tenant": "globex"})
        assert got.status_code == 429, got.text
        assert [r["code"] for r in got.json()["reasons"]] == ["admission-requester-denied"]
        ok = await c.post(PATH, content=body, headers={**_signed(body), "accord-tenant": "acme"})
        assert ok.status_code == 202 and ok.json()["tenant"] == "acme"


async def test_schedule_routes_list_next_pause_resume_and_fires(tmp_path: Path) -> None:
    from tests.integration._triggers_kit import schedule

    p = plan(WEBHOOK + "\n" + schedule(name="nightly", cron="0 3 * * *", tz="Europe/Berlin"),
             name="hooked")  # fmt: skip
    async with serving(tmp_path, p) as hook:
        control = ControlStore(tmp_path / "control.db")
        try:
            viewer = control.create_key("viewer", ["default"])[0]
            operator = control.create_key("operator", ["default"])[0]
        finally:
            control.close()
        base = "/v1/workflows/hooked/triggers"
        async with httpx.AsyncClient(base_url=hook.url, timeout=30) as c:
            anon = await c.get(base)
            assert anon.status_code == 401
            see = {"Authorization": f"Bearer {viewer}"}
            act = {"Authorization": f"Bearer {operator}"}
            got = await c.get(base, headers=see)
            assert got.status_code == 200, got.text
            assert [t["name"] for t in got.json()["triggers"]] == ["upload-webhook", "nightly"]
            nxt = await c.get(f"{base}/nightly/next?count=5", headers=see)
            assert nxt.status_code == 200 and len(nxt.json()["next"]) == 5
            assert all("T03:00:00" in x["local"] for x in nxt.json()["next"])
            assert (await c.post(f"{base}/nightly/pause", headers=see)).status_code == 403
            paused = await c.post(f"{base}/nightly/pause", headers=act)
            assert paused.status_code == 200 and paused.json()["state"]["paused"] is True
            resumed = await c.post(f"{base}/nightly/resume", headers=act)
            assert resumed.json()["state"]["paused"] is False
            fires = await c.get(f"{base}/nightly/fires", headers=see)
            assert fires.status_code == 200 and fires.json()["fires"] == []
            missing = await c.get(f"{base}/upload-webhook/next", headers=see)
            assert missing.status_code == 404
