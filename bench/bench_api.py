"""Starting runs through the HTTP control plane, next to the same through the Python API.

One plan (a single worker task whose context is checked by ``model-ingest-context@1``; no
worker answers, so only the start is measured) on the embedded default (SQLite, WAL,
``synchronous=FULL``, store and queue in one file), the engine's loops running:

- ``api``: ``POST /v1/runs`` to ``accord serve``'s application on uvicorn in its own process
  (so the client's CPU is not the server's), authenticated with an API key, each with a fresh
  ``Idempotency-Key``; the answer comes once the run's first commit is made. ``start_p50_ms`` /
  ``start_p99_ms``: one request at a time (httpx, keep-alive); ``runs_per_s``: ``CONCURRENCY``
  requests in flight until ``N`` runs are started;
- ``python``: :meth:`Engine.start_run` in this process on the same plan and store settings:
  the same two figures (``CONCURRENCY`` starts in flight for the throughput);
- ``overhead_p50_ms``: the difference of the two medians, what HTTP, authentication, the
  idempotency claim and the audit record add to a start.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CONCURRENCY = 8
IDLE = "bench.idle"


def _plan() -> Any:
    from accord.testing.plans import pin
    from accord.workflow.plan import Binding, Plan, RetryPolicy, TaskStage, Timeouts

    task = TaskStage(
        name="work",
        type="worker",
        capability=pin("bench.work"),
        input={"modelId": Binding(source="context", path=("modelId",), raw="${context.modelId}")},
        on_success="completed",
        on_failure="failed",
        retry=RetryPolicy(max_attempts=1),
        timeouts=Timeouts(queue_deadline_ms=3_600_000, execution_deadline_ms=3_600_000),
        queue=IDLE,
    )
    return Plan.create(
        name="bench-api",
        version="1.0.0",
        entry="work",
        stages=(task,),
        context_contract="model-ingest-context@1",
    )


def _engine(folder: Path) -> Any:
    from accord.adapters import open_engine
    from accord.contracts.sources import find_root, load_catalog
    from accord.engine.runtime.orchestrator import EngineOptions

    url = f"sqlite:///{folder / 'accord.db'}"
    catalog = load_catalog(find_root() / "schemas" / "contracts")
    return open_engine(url, url, options=EngineOptions(poll_ms=20), catalog=catalog)


async def _serve(folder: Path) -> None:
    """The server process: prints ``port key`` once listening, serves until its stdin closes."""
    import contextlib

    import uvicorn

    from accord.adapters.ingress.app import create_app
    from accord.adapters.ingress.control import ControlStore
    from accord.adapters.ingress.limits import ApiLimits

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            yield

    engine = _engine(folder)
    control = ControlStore(folder / "control.db")
    await engine.register_plan(_plan())
    # admission wants the capability live; no worker serves it here (the runs only start)
    await engine.announce("bench-worker", ["bench.work@1"], 3_600_000)
    await engine.start()
    app = create_app(engine, control, limits=ApiLimits(rate_per_s=0))
    server = Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=0, lifespan="off", log_level="warning", access_log=False
        )
    )
    task = asyncio.get_running_loop().create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    key, _ = control.create_key("operator", ["bench"])
    print(port, key, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    server.should_exit = True
    await task
    await engine.stop()
    control.close()


def _quantiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "start_p50_ms": statistics.median(ordered),
        "start_p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
    }


async def _through_api(folder: Path, sequential: int, burst: int) -> dict[str, float]:
    import httpx

    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.bench_api", "serve", str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        port, key = proc.stdout.readline().split()
        headers = {"Authorization": f"Bearer {key}"}
        limits = httpx.Limits(max_connections=CONCURRENCY)
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers=headers, limits=limits, timeout=60
        ) as client:
            n = 0

            async def one() -> float:
                nonlocal n
                n += 1
                body = {"workflow": "bench-api", "context": {"modelId": f"m{n}"}}
                began = time.perf_counter()
                got = await client.post(
                    "/v1/runs", json=body, headers={"Idempotency-Key": f"k-{n}"}
                )
                assert got.status_code == 201, got.text
                return (time.perf_counter() - began) * 1000

            for _ in range(10):  # warm up
                await one()
            latencies = [await one() for _ in range(sequential)]
            began = time.perf_counter()
            await _in_flight(one, burst)
            elapsed = time.perf_counter() - began
        proc.stdin.close()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return {**_quantiles(latencies), "runs_per_s": burst / elapsed}


async def _in_flight(one: Any, total: int) -> None:
    left = total

    async def lane() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await one()

    await asyncio.gather(*(lane() for _ in range(CONCURRENCY)))


async def _through_python(folder: Path, sequential: int, burst: int) -> dict[str, float]:
    engine = _engine(folder)
    await engine.register_plan(_plan())
    await engine.start()
    try:
        n = 0

        async def one() -> float:
            nonlocal n
            n += 1
            began = time.perf_counter()
            await engine.start_run("bench-api", {"modelId": f"m{n}"}, "bench")
            return (time.perf_counter() - began) * 1000

        for _ in range(10):
            await one()
        latencies = [await one() for _ in range(sequential)]
        began = time.perf_counter()
        await _in_flight(one, burst)
        elapsed = time.perf_counter() - began
    finally:
        await engine.stop()
    return {**_quantiles(latencies), "runs_per_s": burst / elapsed}


def run(smoke: bool) -> dict[str, Any]:
    sequential, burst = (50, 100) if smoke else (400, 1_000)
    from accord.loop import run as run_loop

    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        api = run_loop(_through_api(Path(a), sequential, burst))
        python = run_loop(_through_python(Path(b), sequential, burst))
    return {
        "api": api,
        "python": python,
        "overhead_p50_ms": api["start_p50_ms"] - python["start_p50_ms"],
        "sequential_starts": sequential,
        "burst_starts": burst,
        "concurrency": CONCURRENCY,
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        from accord.loop import run as run_loop

        run_loop(_serve(Path(sys.argv[2])))
    else:
        print(json.dumps(run(smoke="--smoke" in sys.argv), indent=2))
