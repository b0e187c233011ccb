"""The web UI in a real headless Chromium (Debian's ``chromium``, driven by Playwright for Python
with ``executable_path``; no browser download) against a real uvicorn serving ``/ui/`` and the
``/v1`` API over an engine on a SQLite file, with the search projection beside it.

One server and one browser for the module; each test has its own browser context (its own
sessionStorage, so its own sign-in). The runs are made through the API: completed runs for the
list's pages, a run whose stage fails and is re-driven, a run whose first attempt is retried, an
idle run to cancel, and runs of a second tenant. Each page's screenshot is written to the temp
folder (to docs/ui/ with ``make ui-shots``, ``ACCORD_UI_SHOTS``).
The last test starts ``accord serve`` as its own process and reads ``/ui/`` from it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import struct
import tempfile
import zlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, async_playwright, expect
from tests.integration.test_api_serve import CONTRACTS, _accord, _process, _serving_url
from tests.integration.test_api_support import QUEUE, Api, _task, serving, wait_status

from accord.adapters.ingress import ui as ui_module
from accord.adapters.ingress.problems import Problem
from accord.adapters.ingress.ui import STATIC
from accord.adapters.projection import open_projection
from accord.engine.runtime.projector import Projector, rebuild
from accord.errors import StageFailed
from accord.testing.plans import pin
from accord.testing.workers import run_noop_worker
from accord.worker.storage import ObjectStorage, StorageMap
from accord.workflow.plan import ApprovalStage, Approvers, Plan, RetryPolicy

ROOT = Path(__file__).resolve().parents[2]
# the pages' screenshots: into the temp folder, or docs/ui/ with ``make ui-shots``
SHOTS = Path(os.environ.get("ACCORD_UI_SHOTS") or Path(tempfile.gettempdir()) / "accord-ui-shots")
CHROMIUM = Path("/usr/bin/chromium")
MODEL_INGEST = ROOT / "workflows" / "model-ingest.yaml"
RETRIED = "ui.retried"  # the first attempt of each stage fails retryably
COMPLETED = 30  # more than one page (25) of completed runs in acme
THUMBS = "ui.thumbs"  # answers as the render-thumbnail stage: previews naming a stored PNG
PREVIEW_KEY = "thumbnails/m/gallery-96.png"
PREVIEW = (96, 64)  # its width and height
BAD_YAML = """name: broken
version: "1.0.0"
entry: first
terminals: [completed, failed]
stages:
  - name: first
    type: worker
    queue: q
    worker: no.such.capability@1
    input: { modelId: "${context.modelId}" }
    on_success: nowhere
    on_failure: failed
"""
BAD_LINE = 11  # on_success: nowhere

pytestmark = pytest.mark.asyncio(loop_scope="module")
expect.set_options(timeout=15_000)  # make test shares two cores: wait for events, not for luck


def _needs(ok: bool, what: str) -> None:
    """Skip without ``what`` on a developer's machine; in CI (``CI=true``) fail instead."""
    if not ok:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{what} is missing")
        pytest.skip(f"{what} is missing")


async def _retryable(envelope: Mapping[str, Any]) -> dict[str, Any]:
    if envelope["attempt"] == 1:
        raise StageFailed("the first attempt fails, retryably", "busy", retryable=True)
    return {}


def retry_plan() -> Plan:
    """``work`` on :data:`RETRIED` with two attempts: the first fails, the retry succeeds."""
    retry = RetryPolicy(max_attempts=2, initial_backoff_ms=50, max_backoff_ms=50)
    retried = dataclasses.replace(_task("work", RETRIED), retry=retry)
    return Plan.create(name="ui-retry", version="1.0.0", entry="work", stages=(retried,),
                       context_contract="model-ingest-context@1")  # fmt: skip


def _png(width: int, height: int) -> bytes:
    """A real PNG of ``width`` x ``height`` RGB pixels (a gradient)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(
        b"\0" + bytes(v for x in range(width) for v in (x * 255 // width, y * 255 // height, 160))
        for y in range(height)
    )
    head = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", zlib.compress(rows))
            + chunk(b"IEND", b""))  # fmt: skip


async def _rendered(envelope: Mapping[str, Any]) -> dict[str, Any]:
    preview = {"previewType": "gallery", "objectKey": PREVIEW_KEY, "contentType": "image/png",
               "width": PREVIEW[0], "height": PREVIEW[1]}  # fmt: skip
    return {"modelId": "m", "previews": [preview], "views": [], "renderMs": 1}


def thumbs_plan() -> Plan:
    """A ``render-thumbnail`` stage (on :data:`THUMBS`) whose result names a preview."""
    stage = dataclasses.replace(_task("render-thumbnail", THUMBS), capability=pin("test.work"))
    return Plan.create(name="ui-thumbs", version="1.0.0", entry="render-thumbnail",
                       stages=(stage,), context_contract="model-ingest-context@1")  # fmt: skip


def gated_plan() -> Plan:
    """An approval gate (operators, not the requester) before one task that completes at once."""
    gate = ApprovalStage(
        name="review",
        approvers=Approvers(role="operator", exclude_requester=True),
        options=("approve", "reject"),
        on_approve="work",
        on_reject="failed",
        timeout_ms=3_600_000,
        on_timeout="failed",
    )
    return Plan.create(name="ui-gated", version="1.0.0", entry="review",
                       stages=(gate, _task("work", QUEUE)),
                       context_contract="model-ingest-context@1")  # fmt: skip


@dataclass
class Ui:
    api: Api
    browser: Browser
    projector: Projector
    app: Any = None  # the served app (its state.objects is the object store)
    runs: dict[str, str] = field(default_factory=dict)  # what each run is for -> run id

    @property
    def base(self) -> str:
        return f"{self.api.url}/ui/"

    async def start(self, workflow: str, tenant: str = "acme", model: str = "m") -> str:
        async with self.api.as_("operator", tenant) as client:
            got = await client.post("/v1/runs", json={"workflow": workflow,
                                                      "context": {"modelId": model}})  # fmt: skip
        assert got.status_code == 201, got.text
        run_id: str = got.json()["run_id"]
        return run_id

    async def page(self, role: str, tenant: str = "acme", *, width: int = 1280,
                   height: int = 800) -> Page:  # fmt: skip
        context = await self.browser.new_context(viewport={"width": width, "height": height})
        page = await context.new_page()
        await page.goto(self.base)
        await page.get_by_label("API key or token").fill(self.api.key(role, tenant))
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.locator("#who")).to_contain_text(role)
        return page


async def _stage_status(api: Api, run_id: str, stage: str, want: str, tenant: str = "acme") -> None:
    async with api.as_("viewer", tenant) as client, asyncio.timeout(20):
        while (await client.get(f"/v1/runs/{run_id}")).json()["stages"][stage]["status"] != want:
            await asyncio.sleep(0.05)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def ui(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Ui]:
    _needs(CHROMIUM.is_file(), "Debian's chromium (`make test-deps` installs it)")
    _needs((STATIC / "index.html").is_file(), "the built UI (`make node` builds it)")
    tmp = tmp_path_factory.mktemp("ui")
    projection = open_projection(f"sqlite:///{tmp / 'projection.db'}")
    ObjectStorage(tmp / "objects", "acme").put_bytes(PREVIEW_KEY, _png(*PREVIEW))
    apps: list[Any] = []

    def attach(app: Any) -> Any:
        app.state.projection = projection
        app.state.objects = StorageMap.local(tmp / "objects")
        apps.append(app)
        return app

    async with serving(tmp, wrap=attach) as api, async_playwright() as pw:
        await api.engine.register_plan(retry_plan())
        await api.engine.register_plan(gated_plan())
        await api.engine.register_plan(thumbs_plan())
        stop = asyncio.Event()
        worker = asyncio.get_running_loop().create_task(
            run_noop_worker(api.engine.transport, [RETRIED], stop=stop, handler=_retryable)
        )
        renderer = asyncio.get_running_loop().create_task(
            run_noop_worker(api.engine.transport, [THUMBS], stop=stop, handler=_rendered)
        )
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        projector = Projector(api.engine.store, projection, api.engine.clock)
        here = Ui(api, browser, projector, apps[0])
        done = [await here.start("api-flow", model=f"m{i}") for i in range(COMPLETED)]
        here.runs["globex"] = await here.start("api-flow", "globex", model="g1")
        here.runs["failing"] = await here.start("api-fallback")
        for run_id in done:
            await wait_status(api, run_id)
        await _stage_status(api, here.runs["globex"], "work", "completed", "globex")
        await _stage_status(api, here.runs["failing"], "work", "failed")
        async with api.as_("author") as author:
            source = MODEL_INGEST.read_text()
            for version, deadline in (("2.3.0", "300000"), ("2.4.0", "240000")):
                text = source.replace('version: "2.3.0"', f'version: "{version}"')
                text = text.replace(f"execution_deadline_ms: {300000}",
                                    f"execution_deadline_ms: {deadline}")  # fmt: skip
                got = await author.post("/v1/workflows", json={
                    "source": text, "filename": "model-ingest.yaml", "admit": False})  # fmt: skip
                assert got.status_code in (200, 201), got.text
        await rebuild(api.engine.store, projector)
        SHOTS.mkdir(parents=True, exist_ok=True)
        try:
            yield here
        finally:
            stop.set()
            await worker
            await renderer
            await browser.close()
            await projection.close()


async def test_sign_in_then_the_run_list_filters_and_pages(ui: Ui) -> None:
    page = await ui.page("viewer")
    total = COMPLETED + 1  # acme's completed runs and its failing one
    await expect(page.locator("#run-count")).to_contain_text(f"1–25 of {total} runs")
    assert await page.locator("tbody tr").count() == 25
    await expect(page.locator('[data-facet="status:completed"] .count')).to_have_text(
        str(COMPLETED)
    )
    await page.screenshot(path=SHOTS / "runs.png", full_page=True)
    await page.get_by_role("link", name="Next").click()
    await expect(page.locator("#run-count")).to_contain_text(f"26–{total} of {total} runs")
    assert await page.locator("tbody tr").count() == total - 25
    assert "cursor=" in page.url  # a keyset cursor, not an offset
    await expect(page.locator('[rel="next"]')).to_have_count(0)  # the last page
    await page.get_by_role("link", name="Previous").click()
    await expect(page.locator("#run-count")).to_contain_text(f"1–25 of {total} runs")
    await page.get_by_role("link", name="Next").click()
    await expect(page.locator("#run-count")).to_contain_text(f"26–{total} of {total} runs")
    await page.get_by_label("Status", exact=True).select_option("running")
    await page.get_by_role("button", name="Search").click()
    await expect(page.locator("#run-count")).to_contain_text(
        "1–1 of 1 run matching “status:running”"
    )
    await expect(page.locator("tbody tr a")).to_have_text(ui.runs["failing"])
    await page.locator('[data-facet^="version:"]').first.wait_for()
    await page.get_by_label("Status", exact=True).select_option("")
    await page.get_by_label("Stage (name or name=status)").fill("notify")
    await page.get_by_role("button", name="Search").click()
    await expect(page.locator("#run-count")).to_contain_text("1–1 of 1 run matching “stage:notify”")
    await page.get_by_role("link", name="Clear").click()
    await expect(page.locator("#run-count")).to_have_text(
        re.compile(f"^1–25 of {total} runs( ·|$)")
    )
    await page.get_by_label("Words").fill("flaky")  # the failure class
    await page.get_by_role("button", name="Search").click()
    await expect(page.locator("#run-count")).to_contain_text("1–1 of 1 run matching “flaky”")
    await expect(page.locator("tbody tr a")).to_have_text(ui.runs["failing"])


async def test_a_tenant_sees_no_other_tenants_run(ui: Ui) -> None:
    page = await ui.page("viewer", "globex")
    await expect(page.locator("#run-count")).to_contain_text("1–1 of 1 run")
    await expect(page.locator("tbody tr a")).to_have_text(ui.runs["globex"])
    assert await page.get_by_label("Tenant").count() == 0  # one tenant: nothing to pick
    await page.goto(f"{ui.base}#/runs/{ui.runs['failing']}")
    await expect(page.get_by_role("heading", name="Run not found")).to_be_visible()
    await expect(page.get_by_role("alert")).to_contain_text("among your tenants' runs")


async def _filled(page: Page, stage: str, colour: str) -> None:
    """Wait until the stage's box in the plan graph is painted ``colour`` (fails on timeout)."""
    await page.wait_for_function(
        """([stage, colour]) => {
             const r = document.querySelector(`.plan-graph [data-stage="${stage}"] rect`);
             return r !== null && getComputedStyle(r).fill === colour;
           }""",
        arg=[stage, colour],
        timeout=5000,
    )


async def test_the_graph_colours_a_failed_stage_then_its_re_drive_over_sse(ui: Ui) -> None:
    run_id = ui.runs["failing"]
    page = await ui.page("operator")
    await page.goto(f"{ui.base}#/runs/{run_id}")
    work = page.locator('.plan-graph [data-stage="work"]')
    await expect(work).to_have_attribute("data-status", "failed")
    await expect(page.locator('.plan-graph [data-stage="notify"]')).to_have_attribute(
        "data-status", "queued"
    )
    await _filled(page, "work", "rgb(253, 226, 228)")  # the failure's red
    await expect(page.locator('.plan-graph [data-kind="failure"]')).to_have_count(2)
    await expect(page.locator("#stream-state")).to_have_text("following")
    await page.screenshot(path=SHOTS / "run-failed.png", full_page=True)
    await page.get_by_role("button", name="Re-drive work").click()
    # the SSE stream brings the re-drive's outcome: no reload
    await expect(work).to_have_attribute("data-status", "completed")
    await _filled(page, "work", "rgb(220, 245, 227)")  # success's green
    await expect(page.locator('.plan-graph [data-stage="notify"]')).to_have_attribute(
        "data-status", "cancelled"
    )
    await expect(page.locator("#run-status")).to_contain_text("completed")
    await expect(page.locator(".explain")).to_contain_text("re-drive of 'work' requested")
    await expect(page.locator('.timeline [data-stage="work"]')).to_have_count(2)
    await page.screenshot(path=SHOTS / "run.png", full_page=True)


async def test_the_timeline_shows_a_retried_attempt_and_history_filters(ui: Ui) -> None:
    run_id = await ui.start("ui-retry")
    await wait_status(ui.api, run_id)
    page = await ui.page("viewer")
    await page.goto(f"{ui.base}#/runs/{run_id}")
    first = page.locator('.timeline [data-stage="work"][data-attempt="1"]')
    await expect(first).to_have_attribute("data-status", "failed")
    await expect(page.locator('.timeline [data-stage="work"][data-attempt="2"]')).to_have_attribute(
        "data-status", "succeeded"
    )
    await expect(page.locator("#stream-state")).to_have_text("ended")
    count = page.locator("#history-count")
    await expect(count).to_contain_text(" of ")
    every = (await count.inner_text()).split(" of ")[1]
    assert int(every.split()[0]) >= 4, every
    times = await page.locator("section[aria-labelledby=history-title] time").all_inner_texts()
    assert times and all(t.endswith("Z") and "T" in t for t in times), times
    await page.get_by_label("Refused only (stale, duplicate, late)").check()
    await expect(count).to_have_text(f"0 of {every}")
    await page.get_by_label("Refused only (stale, duplicate, late)").uncheck()
    await page.get_by_label("Kind").select_option("stage-failed")
    await expect(count).to_have_text(f"1 of {every}")
    await page.get_by_label("Kind").select_option("")
    await page.locator("section[aria-labelledby=timeline-title]").screenshot(
        path=SHOTS / "run-timeline.png"
    )


async def test_an_operator_cancels_a_run_and_a_viewer_cannot(ui: Ui) -> None:
    run_id = await ui.start("api-idle")
    viewer = await ui.page("viewer")
    await viewer.goto(f"{ui.base}#/runs/{run_id}")
    await expect(viewer.locator("#run-status")).to_contain_text("running")
    assert await viewer.get_by_role("button", name="Cancel run…").count() == 0
    async with ui.api.as_("viewer") as client:  # and the server refuses it anyway
        refused = await client.post(f"/v1/runs/{run_id}/cancel", json={})
    assert refused.status_code == 403

    page = await ui.page("operator")
    await page.goto(f"{ui.base}#/runs/{run_id}")
    await page.get_by_role("button", name="Cancel run…").click()
    await page.get_by_label("Reason").fill("not needed")
    await page.get_by_role("button", name=f"Cancel run {run_id}").click()
    await expect(page.locator("#run-status")).to_contain_text("cancelled")
    assert (await wait_status(ui.api, run_id))["status"] == "cancelled"
    await expect(page.get_by_role("button", name="Cancel run…")).to_be_hidden()
    # the viewer's open page follows over SSE
    await expect(viewer.locator("#run-status")).to_contain_text("cancelled")


async def test_an_approval_gate_is_offered_only_to_whom_may_decide_it(ui: Ui) -> None:
    run_id = await ui.start("ui-gated")  # by acme's operator, whom the gate excludes
    await _stage_status(ui.api, run_id, "review", "waiting")
    gate = '[data-gate="review"]'
    for role in ("viewer", "operator"):
        page = await ui.page(role)
        await page.goto(f"{ui.base}#/runs/{run_id}")
        await expect(page.locator(gate)).to_contain_text("you may not decide this gate")
        assert await page.get_by_role("button", name="Approve review").count() == 0
    admin = await ui.page("admin")
    await admin.goto(f"{ui.base}#/runs/{run_id}")
    await expect(admin.locator('.plan-graph [data-stage="review"]')).to_have_attribute(
        "data-status", "waiting"
    )
    await admin.get_by_label("Comment (recorded)").fill("looks right")
    await admin.screenshot(path=SHOTS / "run-gate.png", full_page=True)
    await admin.get_by_role("button", name="Approve review").click()
    await expect(admin.locator('.plan-graph [data-stage="work"]')).to_have_attribute(
        "data-status", "completed"
    )
    await expect(admin.locator(gate)).to_have_count(0)
    await expect(admin.locator("#run-status")).to_contain_text("completed")
    async with ui.api.as_("viewer") as client:
        history = (await client.get(f"/v1/runs/{run_id}/history")).json()["entries"]
    decided = [e["event"] for e in history if e["event"]["kind"] == "approval-decided"]
    assert decided and decided[0]["comment"] == "looks right", decided


async def test_the_workflow_diff_and_the_compiler_errors_render(ui: Ui) -> None:
    page = await ui.page("author")
    await page.get_by_role("link", name="Workflows").click()
    await page.get_by_role("link", name="model-ingest").click()
    await expect(page.locator("#versions-title")).to_be_visible()
    await expect(page.locator(".plan-graph").first.locator('[data-kind="decision"]')).to_have_count(
        2
    )
    await expect(page.locator(".plan-graph").first.locator('[data-kind="fork"]')).to_have_count(2)
    await expect(page.locator(".plan-graph").first.locator('[data-kind="join"]')).to_have_count(2)
    await page.get_by_role("button", name="Compare").click()
    summary = page.locator("#diff-summary")
    await expect(summary).to_contain_text("2.3.0 → 2.4.0: 0 stage(s) added, 0 removed, 1 changed")
    await expect(page.locator("#diff-out table").first).to_contain_text("render-thumbnail")
    await expect(page.locator("#diff-out table").first).to_contain_text("240000")
    changed = page.locator('#diff-out .plan-graph [data-stage="render-thumbnail"]')
    await expect(changed).to_have_attribute("data-status", "changed")
    await page.screenshot(path=SHOTS / "workflow.png", full_page=True)

    await page.get_by_label("Workflow definition (YAML)").fill(BAD_YAML)
    await page.get_by_label("File name").fill("broken.yaml")
    await page.get_by_role("button", name="Check").click()
    await expect(page.locator("#check-summary")).to_contain_text("Refused")
    findings = page.locator(".findings li")
    await expect(findings.first).to_contain_text("broken.yaml:")
    await expect(findings.first).to_contain_text(f"broken.yaml:{BAD_LINE}:")
    await expect(findings.first).to_contain_text("graph-unknown-target")
    await expect(findings.first).to_contain_text("(stage first)")
    lines = {int(x) for x in await findings.evaluate_all("els => els.map(e => e.dataset.line)")}
    assert lines == {BAD_LINE}, lines
    await expect(page.locator(f"#src-line-{BAD_LINE}")).to_contain_text("on_success: nowhere")
    for n in lines:
        await expect(page.locator(f"#src-line-{n}")).to_have_class("marked sev-error")
    await findings.first.locator("a").click()  # jumps to the line
    await expect(page.locator(f"#src-line-{min(lines)}")).to_be_focused()
    await page.locator("section.checker").screenshot(path=SHOTS / "workflow-check.png")


async def test_a_viewer_is_not_offered_the_compiler_and_the_other_pages_render(ui: Ui) -> None:
    page = await ui.page("viewer")
    await page.goto(f"{ui.base}#/workflows")
    await expect(page.locator(".checker")).to_contain_text("needs the author role")
    await page.get_by_role("link", name="Contracts").click()
    await page.get_by_role("link", name="model-ingest-context").click()
    await page.get_by_role("heading", name="Compatibility").wait_for()
    used = page.locator("table", has_text="Active workflow")
    await expect(used).to_contain_text("api-flow@1.0.0")
    await expect(used).to_contain_text("context (model-ingest-context@1)")
    await expect(page.locator('[data-fixture="invalid/type-modelId"]')).to_be_visible()
    await expect(page.locator('[data-fixture="valid/minimal"]')).to_be_visible()
    await page.screenshot(path=SHOTS / "contracts.png", full_page=True)
    async with ui.api.as_("viewer") as client:
        usage = (await client.get("/v1/contracts/thumbnail-generation-request/usage")).json()
        unknown = await client.get("/v1/contracts/no-such-contract/usage")
    assert {"capability": "thumbnail.render@3", "as": "request",
            "contract": "thumbnail-generation-request@2"} in usage["capabilities"]  # fmt: skip
    stage = (
        "stage render-thumbnail request (thumbnail-generation-request@2, via thumbnail.render@3)"
    )
    assert any(stage in w["uses"] for w in usage["workflows"]), usage["workflows"]
    assert unknown.status_code == 404 and unknown.json()["code"] == "contract-not-found"
    await page.get_by_role("link", name="Fleet").click()
    await expect(page.locator("main")).to_contain_text("test.work@1")
    await page.screenshot(path=SHOTS / "fleet.png", full_page=True)


async def test_phone_width_keyboard_and_labels(ui: Ui) -> None:
    context = await ui.browser.new_context(viewport={"width": 390, "height": 844})
    page = await context.new_page()
    await page.goto(ui.base)
    await expect(page.get_by_label("API key or token")).to_be_focused()  # no mouse needed
    await page.keyboard.type(ui.api.key("operator"))
    await page.keyboard.press("Enter")
    await expect(page.locator("#run-count")).to_be_visible()
    for url in ("#/runs", f"#/runs/{ui.runs['failing']}", "#/workflows/model-ingest"):
        await page.goto(f"{ui.base}{url}")
        await page.locator("main h1").wait_for()
        unlabelled = await page.evaluate(
            """() => [...document.querySelectorAll('input, select, textarea')]
                 .filter(e => e.labels.length === 0 && !e.getAttribute('aria-label'))
                 .map(e => e.id || e.name)"""
        )
        assert unlabelled == [], (url, unlabelled)
        wide = await page.evaluate("() => document.documentElement.scrollWidth")
        assert wide <= 390, (url, wide)
    await page.goto(f"{ui.base}#/runs")
    await page.locator("#run-count").wait_for()
    await page.screenshot(path=SHOTS / "runs-phone.png", full_page=True)
    await context.close()


async def test_the_ui_needs_no_other_host(ui: Ui) -> None:
    """Every built asset is served from this server: no URL names another host, and the pages
    are served with a policy that lets them load or reach nothing else."""
    async with ui.api.client() as client:
        got = await client.get("/ui/")
        assert (
            got.status_code == 200
            and "default-src 'none'" in got.headers["content-security-policy"]
        )
        assert "connect-src 'self'" in got.headers["content-security-policy"]
        for sneaky in (
            "/ui/..%2fapp.py",
            "/ui/%2e%2e/%2e%2e/ingress/app.py",
            "/ui/..%2f..%2fui.py",
        ):
            assert (await client.get(sneaky)).status_code == 404, sneaky
        assert (await client.get("/ui/nope.js")).status_code == 404
        assert (await client.get("/ui", follow_redirects=False)).status_code == 308
    for path in STATIC.iterdir():
        if path.suffix in (".html", ".js", ".css"):
            text = path.read_text()
            for marker in ("https://", "http://", "//cdn", "@import"):
                hits = [i for i in range(len(text)) if text.startswith(marker, i)]
                allowed = ("http://www.w3.org/2000/svg",)
                bad = [text[i : i + 60] for i in hits if not text.startswith(allowed, i)]
                assert not bad, (path.name, bad[:3])


async def test_a_server_whose_ui_was_not_built_says_how_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ui_module, "STATIC", tmp_path / "ui_static")
    with pytest.raises(Problem) as refused:
        ui_module._asset("index.html")
    assert refused.value.status == 503 and refused.value.code == "ui-not-built"
    assert "make node" in refused.value.detail


async def test_the_reads_the_ui_needs(ui: Ui) -> None:
    """``/v1/me``, ``/v1/plans/{digest}`` and ``POST /v1/workflows/check``, each by role."""
    async with ui.api.as_("viewer") as viewer, ui.api.as_("author") as author:
        me = (await viewer.get("/v1/me")).json()
        assert me["role"] == "viewer" and me["tenants"] == ["acme"]
        assert me["may"]["run.cancel"] is False and me["may"]["workflow.check"] is False
        assert (await author.get("/v1/me")).json()["may"]["workflow.check"] is True
        async with ui.api.client() as nobody:
            assert (await nobody.get("/v1/me")).status_code == 401
        active = (await viewer.get("/v1/workflows/model-ingest")).json()
        plan = await viewer.get(f"/v1/plans/{active['digest']}")
        assert plan.status_code == 200 and plan.json()["plan"]["name"] == "model-ingest"
        unknown = await viewer.get("/v1/plans/sha256:" + "0" * 64)
        assert unknown.status_code == 404 and unknown.json()["code"] == "activation-unknown-plan"
        assert (await viewer.get("/v1/plans/nope")).status_code == 422
        body = {"source": BAD_YAML, "filename": "broken.yaml"}
        refused = await viewer.post("/v1/workflows/check", json=body)
        assert refused.status_code == 403 and refused.json()["needed_role"] == "author"
        checked = (await author.post("/v1/workflows/check", json=body)).json()
        assert checked["ok"] is False and checked["errors"] >= 1
        assert all(d["file"] == "broken.yaml" and d["line"] >= 1 for d in checked["diagnostics"])
        good = {"source": MODEL_INGEST.read_text(), "filename": "model-ingest.yaml"}
        fine = (await author.post("/v1/workflows/check", json=good)).json()
        assert fine["ok"] is True and fine["digest"].startswith("sha256:")
        versions = (await viewer.get("/v1/workflows/model-ingest/versions")).json()["versions"]
        assert len(versions) == 2  # checking stored and activated nothing


async def test_an_admin_sees_who_activated_each_version(ui: Ui) -> None:
    author_id = (await _me(ui, "author"))["principal"]
    page = await ui.page("admin")
    await page.goto(f"{ui.base}#/workflows/model-ingest")
    box = page.locator("section[aria-labelledby=activations-title]")
    await expect(box.locator("tbody tr")).to_have_count(2)
    await expect(box.locator("tbody tr").first).to_contain_text(author_id)
    await expect(box.locator("tbody tr").first).to_contain_text("activation")
    other = await ui.page("author")  # the author's role does not read the audit log
    await other.goto(f"{ui.base}#/workflows/model-ingest")
    await expect(other.locator("section[aria-labelledby=activations-title]")).to_contain_text(
        "which the admin role reads"
    )


async def _me(ui: Ui, role: str) -> dict[str, Any]:
    async with ui.api.as_(role) as client:
        doc: dict[str, Any] = (await client.get("/v1/me")).json()
    return doc


async def test_the_live_run_list_shows_a_new_run_without_a_reload(ui: Ui) -> None:
    """After every test that counts acme's runs: it projects one more."""
    page = await ui.page("viewer")
    await page.get_by_label("Words").fill("api")
    await page.get_by_label("Live (refresh every 3 s)").check()
    await expect(page).to_have_url(re.compile("live=1"))
    count = page.locator("#run-count")
    await expect(count).to_contain_text("of 31 runs")
    words = page.get_by_label("Words")
    await words.fill("typed meanwhile")  # a refresh redraws the results, never the form
    run_id = await ui.start("api-flow", model="live")
    await wait_status(ui.api, run_id)
    await ui.projector.project([run_id])
    await expect(count).to_contain_text("of 32 runs", timeout=10_000)
    await expect(page.locator("tbody tr a").first).to_have_text(run_id)
    await expect(words).to_have_value("typed meanwhile")
    await expect(words).to_be_focused()


async def test_the_search_pages_by_cursor_over_the_api(ui: Ui) -> None:
    """``GET /v1/search``'s ``cursor``: pages that neither repeat nor skip; a bad one is 422."""
    async with ui.api.as_("viewer") as client:
        whole = (await client.get("/v1/search", params={"limit": 500})).json()
        ids, cursor, pages = [], "", 0
        while True:
            got = (await client.get("/v1/search", params={"limit": 7, "cursor": cursor})).json()
            assert got["total"] == whole["total"]
            ids.extend(r["run_id"] for r in got["runs"])
            pages += 1
            if got["next_cursor"] is None:
                break
            cursor = got["next_cursor"]
        assert ids == [r["run_id"] for r in whole["runs"]] and pages == -(-len(ids) // 7)
        assert whole["next_cursor"] is None
        for bad in ("nope!", "WzEsMl0"):  # not base64 JSON; [1,2] (a number for the run id)
            refused = await client.get("/v1/search", params={"cursor": bad})
            assert refused.status_code == 422, bad
            assert refused.json()["code"] == "search-invalid"
            assert "cursor:" in refused.json()["detail"]


async def test_facets_count_failed_stages_failure_classes_and_tenants(ui: Ui) -> None:
    page = await ui.page("operator", "both")  # an operator of acme and globex
    await expect(page.locator('[data-facet="tenant:globex"] .count')).to_have_text("1")
    await expect(page.locator('[data-facet="failure_class:flaky"] .count')).to_have_text("1")
    await page.locator('[data-facet="failed_stage:work"]').click()
    await expect(page.locator("#run-count")).to_contain_text(
        "1–1 of 1 run matching “stage:work=failed”"
    )
    await expect(page.locator("tbody tr a")).to_have_text(ui.runs["failing"])
    await page.screenshot(path=SHOTS / "runs-facets.png", full_page=True)
    one = await ui.page("viewer", "globex")  # one tenant: no tenant facet
    await expect(one.locator("#run-count")).to_be_visible()
    await expect(one.locator('[data-facet^="tenant:"]')).to_have_count(0)


async def test_saved_views_keep_filters_by_name(ui: Ui) -> None:
    page = await ui.page("viewer")
    await page.get_by_label("Status", exact=True).select_option("completed")
    await page.get_by_role("button", name="Search").click()
    await expect(page.locator("#run-count")).to_contain_text("matching “status:completed”")
    await page.get_by_label("Save filters as").fill("done runs")
    await page.get_by_role("button", name="Save view").click()
    await expect(page.locator('[data-view="done runs"]')).to_be_visible()
    await page.get_by_role("link", name="Clear").click()
    await expect(page.locator("#run-count")).not_to_contain_text("matching")
    await page.reload()  # kept in localStorage, not in the page
    await page.locator('[data-view="done runs"]').click()
    await expect(page.locator("#run-count")).to_contain_text("matching “status:completed”")
    await expect(page.get_by_label("Status", exact=True)).to_have_value("completed")
    await expect(page.locator('[data-view="done runs"]')).to_have_attribute("aria-current", "true")
    await page.get_by_role("button", name="Forget view done runs").click()
    await expect(page.locator('[data-view="done runs"]')).to_have_count(0)


async def test_an_operator_bulk_cancels_a_selection_and_each_answer_is_shown(ui: Ui) -> None:
    idle = [await ui.start("api-idle", "globex", model=f"idle{i}") for i in range(2)]
    await ui.projector.project(idle)
    viewer = await ui.page("viewer", "globex")
    await expect(viewer.locator("#run-count")).to_contain_text("of 3 runs")
    assert await viewer.locator("[data-select]").count() == 0  # a viewer is offered no bulk action
    assert await viewer.get_by_role("button", name="Cancel selected…").count() == 0
    async with ui.api.as_("viewer", "globex") as client:  # and the server refuses it anyway
        assert (await client.post(f"/v1/runs/{idle[0]}/cancel", json={})).status_code == 403

    page = await ui.page("operator", "globex")
    await expect(page.locator("#run-count")).to_contain_text("1–3 of 3 runs")
    await page.get_by_role("button", name="Cancel all matching…").click()
    await expect(page.locator("#bulk-confirm")).to_have_text("Cancel 3 runs")
    await page.get_by_role("button", name="Keep them").click()
    await page.get_by_label("Select every run on this page").check()
    await expect(page.locator("#selected-count")).to_have_text("3 selected")
    await page.get_by_role("button", name="Cancel selected…").click()
    await page.get_by_label("Reason").fill("bulk tidy")
    await page.screenshot(path=SHOTS / "runs-bulk.png", full_page=True)
    await page.get_by_role("button", name="Cancel 3 runs").click()
    await expect(page.locator("#bulk-summary")).to_have_text("Cancel 3 runs: 2 done, 1 refused")
    done = ui.runs["globex"]  # completed: the run's rules refuse its cancellation
    await expect(page.locator(f'[data-run="{done}"]')).to_have_attribute("data-ok", "false")
    await expect(page.locator(f'[data-run="{done}"]')).to_contain_text("refused: refused-by-run")
    for run_id in idle:
        await expect(page.locator(f'[data-run="{run_id}"]')).to_have_attribute("data-ok", "true")
    async with ui.api.as_("viewer", "globex") as client, asyncio.timeout(20):
        for run_id in idle:
            while (await client.get(f"/v1/runs/{run_id}")).json()["status"] != "cancelled":
                await asyncio.sleep(0.05)

    # re-drive of a selection: each selected run's failed stages
    failing = await ui.start("api-fallback", "globex", model="gf")
    await _stage_status(ui.api, failing, "work", "failed", "globex")
    await ui.projector.project([failing])
    await page.reload()
    await expect(page.locator("#run-count")).to_contain_text("of 4 runs")
    await page.get_by_label(f"Select {failing}").check()
    await page.get_by_role("button", name="Re-drive selected…").click()
    await page.get_by_role("button", name="Re-drive the failed stages of 1 run").click()
    await expect(page.locator("#bulk-summary")).to_have_text(
        "Re-drive the failed stages of 1 run: 1 done, 0 refused"
    )
    await expect(page.locator(f'[data-run="{failing}"]')).to_contain_text("re-drove work")
    await _stage_status(ui.api, failing, "work", "completed", "globex")


async def test_the_fleet_shows_queues_their_age_and_a_queue_no_live_worker_serves(ui: Ui) -> None:
    ghost = Plan.create(name="ui-ghost", version="1.0.0", entry="ghost",
                        stages=(_task("ghost", "ui.ghost"),),
                        context_contract="model-ingest-context@1")  # fmt: skip
    await ui.api.engine.register_plan(ghost)
    await ui.api.engine.announce("ghost-worker", ["test.ghost@1"], 60_000)  # admits the start
    run_id = await ui.start("ui-ghost")
    await _stage_status(ui.api, run_id, "ghost", "queued")
    await ui.api.engine.announce("ghost-worker", [], 60_000)  # the worker goes away
    await ui.projector.project([run_id])
    async with ui.api.as_("viewer") as acme, ui.api.as_("viewer", "globex") as globex:
        got = (await acme.get("/v1/fleet")).json()
        other = (await globex.get("/v1/fleet")).json()
    queue = next(q for q in got["queues"] if q["queue"] == "ui.ghost")
    assert queue["capability"] == "test.ghost@1" and queue["live"] is False
    assert queue["queued"] == 1 and queue["age_ms"] >= 0 and queue["stages"] == ["ui-ghost/ghost"]
    assert got["alerts"] == []  # this server evaluates no alert rules
    assert all(q["queue"] != "ui.ghost" for q in other["queues"])  # acme's run, not globex's
    page = await ui.page("viewer")
    await page.get_by_role("link", name="Fleet").click()
    banner = page.locator('[data-stranded="ui.ghost"]')
    await expect(banner).to_contain_text("1 stage(s) queued on ui.ghost for test.ghost@1")
    await expect(banner).to_contain_text("no live worker announces test.ghost@1")
    await expect(
        page.locator("section, main").get_by_text("no live worker", exact=True)
    ).to_be_visible()
    await expect(page.get_by_text("No open alert.")).to_be_visible()
    await page.screenshot(path=SHOTS / "fleet.png", full_page=True)


async def test_accord_serve_serves_the_ui_as_its_own_process(tmp_path: Path) -> None:
    _needs((STATIC / "index.html").is_file(), "the built UI (`make node` builds it)")
    code, out, err = await _accord(tmp_path, "keys", "create", "--role", "operator",
                                   "--tenant", "demo", "--json")  # fmt: skip
    assert code == 0, err
    key = json.loads(out)["key"]
    args = ["serve", "--port", "0", "--contracts", str(CONTRACTS), "--no-platform"]
    async with _process(tmp_path, "serve", *args) as server:
        url = await _serving_url(server, tmp_path)
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            page = await client.get("/ui/")
            script = await client.get("/ui/app.js")
            me = await client.get("/v1/me", headers={"Authorization": f"Bearer {key}"})
            found = await client.get("/v1/search", headers={"Authorization": f"Bearer {key}"})
    assert page.status_code == 200 and '<script type="module" src="/ui/app.js">' in page.text
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert me.status_code == 200 and me.json()["may"]["run.cancel"] is True
    assert found.status_code == 200 and found.json()["total"] == 0  # the projection is there


async def test_the_run_page_shows_the_thumbnails_the_result_names(ui: Ui) -> None:
    run_id = await ui.start("ui-thumbs")
    await _stage_status(ui.api, run_id, "render-thumbnail", "completed")
    page = await ui.page("viewer")
    await page.goto(f"{ui.base}#/runs/{run_id}")
    img = page.get_by_role("img", name=re.compile(r"thumbnail from stage render-thumbnail"))
    await expect(img).to_be_visible()
    await expect(img).to_have_attribute("src", re.compile(r"^blob:"))
    await img.evaluate("i => i.decode()")  # the image loaded and decoded (else this throws)
    assert await img.evaluate("i => [i.naturalWidth, i.naturalHeight]") == list(PREVIEW)
    await page.locator("#thumbnails").screenshot(path=SHOTS / "run-thumbnails.png")
    url = f"/v1/runs/{run_id}/objects"
    async with ui.api.as_("viewer") as viewer, ui.api.as_("viewer", "globex") as other:
        got = await viewer.get(url, params={"key": PREVIEW_KEY})
        assert got.status_code == 200, got.text
        assert got.headers["content-type"] == "image/png"
        assert got.headers["cache-control"].startswith("private")
        assert got.content == _png(*PREVIEW)
        listed = (await viewer.get(f"/v1/runs/{run_id}/previews")).json()["previews"]
        assert [p["objectKey"] for p in listed] == [PREVIEW_KEY]
        refused = await other.get(url, params={"key": PREVIEW_KEY})  # another tenant's run
        assert refused.status_code == 404 and refused.json()["code"] == "run-not-found"
        for key in ("models/m.stl", "thumbnails/m/../m/gallery-96.png"):  # not named by the run
            unnamed = await viewer.get(url, params={"key": key})
            assert unnamed.status_code == 404 and unnamed.json()["code"] == "object-not-named"
        objects, ui.app.state.objects = ui.app.state.objects, None
        try:
            none = await viewer.get(url, params={"key": PREVIEW_KEY})
        finally:
            ui.app.state.objects = objects
        assert none.status_code == 404 and none.json()["code"] == "no-object-store"
