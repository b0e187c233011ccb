"""The control plane under test: a real uvicorn on a loopback port chosen by the kernel, over an
engine on a SQLite file, with httpx as the client (no tests of its own here)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from accord.adapters import open_engine
from accord.adapters.ingress.app import create_app
from accord.adapters.ingress.auth import JwtVerifier
from accord.adapters.ingress.control import ControlStore
from accord.adapters.ingress.limits import ApiLimits
from accord.contracts.catalog import Catalog
from accord.contracts.sources import load_catalog
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.errors import StageFailed
from accord.testing.plans import pin
from accord.testing.workers import run_noop_worker
from accord.workflow.plan import Binding, Plan, RetryPolicy, TaskStage, Timeouts

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = ROOT / "schemas" / "contracts"
QUEUE = "api.work"  # a worker answers every job at once
IDLE = "api.idle"  # nobody serves it: runs stay running
FLAKY = "api.flaky"  # the first attempt of each stage fails, later ones succeed
TENANTS = ("acme", "globex")
ROLES = ("viewer", "operator", "author", "admin")

_catalog: Catalog | None = None


def catalog() -> Catalog:
    global _catalog  # noqa: PLW0603 - parsed once per test process
    if _catalog is None:
        _catalog = load_catalog(CONTRACTS)
    return _catalog


def _task(name: str, queue: str, on_failure: str = "failed") -> TaskStage:
    return TaskStage(
        name=name,
        type="worker",
        capability=pin(f"test.{name}"),
        input={"modelId": Binding(source="context", path=("modelId",), raw="${context.modelId}")},
        on_success="completed",
        on_failure=on_failure,
        retry=RetryPolicy(max_attempts=1, initial_backoff_ms=50, max_backoff_ms=50),
        timeouts=Timeouts(queue_deadline_ms=600_000, execution_deadline_ms=600_000),
        queue=queue,
    )


def plan(name: str = "api-flow", queue: str = QUEUE, version: str = "1.0.0") -> Plan:
    """One worker task on ``queue``, its context checked by a real contract."""
    return Plan.create(
        name=name,
        version=version,
        entry="work",
        stages=(_task("work", queue),),
        context_contract="model-ingest-context@1",
    )


def fallback_plan() -> Plan:
    """``work`` (on :data:`FLAKY`: its first attempt fails) falls over to ``notify``, which
    nobody serves: the run has no intent while ``work`` is failed, so it may be re-driven."""
    stages = (_task("work", FLAKY, on_failure="notify"), _task("notify", IDLE))
    return Plan.create(
        name="api-fallback",
        version="1.0.0",
        entry="work",
        stages=stages,
        context_contract="model-ingest-context@1",
    )


async def _flaky(envelope: Mapping[str, Any]) -> dict[str, Any]:
    if envelope["attempt"] == 1:
        raise StageFailed("the first attempt fails", "flaky")
    return {}


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class Api:
    url: str
    engine: Engine
    control: ControlStore
    keys: dict[tuple[str, str], str] = field(default_factory=dict)  # (role, tenant) -> key

    def client(self, key: str | None = None, **headers: str) -> httpx.AsyncClient:
        chosen = dict(headers)
        if key is not None:
            chosen["Authorization"] = f"Bearer {key}"
        return httpx.AsyncClient(base_url=self.url, headers=chosen, timeout=30)

    def key(self, role: str, tenant: str = "acme") -> str:
        return self.keys[(role, tenant)]

    def as_(self, role: str, tenant: str = "acme") -> httpx.AsyncClient:
        return self.client(self.key(role, tenant))


@contextlib.asynccontextmanager
async def serving(
    tmp: Path,
    *,
    limits: ApiLimits | None = None,
    jwt: JwtVerifier | None = None,
    worker: bool = True,
    starts: str = "engine",
    wrap: Callable[[Any], Any] | None = None,
) -> AsyncIterator[Api]:
    """The API with the engine in this process, a key per role and tenant, and a worker that
    answers every job on :data:`QUEUE` (unless ``worker`` is false)."""
    url = f"sqlite:///{tmp / 'accord.db'}"
    engine = open_engine(
        url,
        url,
        options=EngineOptions(poll_ms=10, grace_ms=200, dispatch=starts == "engine"),
        catalog=catalog(),
    )
    control = ControlStore(tmp / "control.db")
    api_limits = limits or ApiLimits(rate_per_s=10_000, burst=10_000)
    app = create_app(
        engine,
        control,
        starts="engine" if starts == "engine" else "queue",
        catalog=catalog(),
        root=ROOT,
        jwt=jwt,
        limits=api_limits,
    )
    server = _Server(
        uvicorn.Config(
            wrap(app) if wrap else app,
            host="127.0.0.1",
            port=0,
            lifespan="off",
            log_level="warning",
            access_log=False,
        )
    )
    for one in (plan(), plan("api-idle", IDLE), fallback_plan()):
        await engine.register_plan(one)
    # the workers these plans name are live as far as admission can tell (IDLE's never answers)
    await engine.announce("api-workers", ["test.work@1", "test.notify@1"], 86_400_000)
    if starts == "engine":
        await engine.start()
    stop = asyncio.Event()
    tasks = []
    if worker and starts == "engine":
        spawn = asyncio.get_running_loop().create_task
        tasks.append(spawn(run_noop_worker(engine.transport, [QUEUE], stop=stop)))
        tasks.append(spawn(run_noop_worker(engine.transport, [FLAKY], stop=stop, handler=_flaky)))
    serve = asyncio.get_running_loop().create_task(server.serve())
    try:
        async with asyncio.timeout(10):
            while not server.started:
                assert not serve.done(), "the server did not start"
                await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        api = Api(f"http://127.0.0.1:{port}", engine, control)
        for role in ROLES:
            for tenant in TENANTS:
                api.keys[(role, tenant)] = control.create_key(role, [tenant])[0]
        api.keys[("operator", "both")] = control.create_key("operator", list(TENANTS))[0]
        yield api
    finally:
        server.should_exit = True
        await asyncio.wait_for(serve, 15)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await engine.stop()
        control.close()


async def wait_status(api: Api, run_id: str, *, timeout_s: float = 30) -> dict[str, Any]:
    """The run (read through the API) once it has ended."""
    async with api.as_("viewer") as client, asyncio.timeout(timeout_s):
        while True:
            got = await client.get(f"/v1/runs/{run_id}")
            assert got.status_code == 200, got.text
            doc: dict[str, Any] = got.json()
            if doc["status"] in ("completed", "failed", "cancelled"):
                return doc
            await asyncio.sleep(0.05)
