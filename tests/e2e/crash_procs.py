"""Engine and worker processes for the crash tests (run as scripts, killed for real).

``python crash_procs.py engine URL`` runs an engine (with the test actions) until SIGTERM; the
dispatcher dies at ``ACCORD_CRASH_AT`` when that is set. ``python crash_procs.py worker URL``
runs a no-op worker on every queue of the test plan; with ``WORKER_CRASH_AFTER_ACCEPT=1`` it
dies right after publishing its first acceptance, before the job's result or acknowledgement.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Mapping
from typing import Any

from accord.adapters import open_engine, open_transport
from accord.engine.runtime.actions import ActionContext
from accord.engine.runtime.orchestrator import EngineOptions
from accord.testing.plans import QUEUES
from accord.testing.workers import run_noop_worker


async def _audit(payload: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
    return {"audited": ctx.run_id}


async def _lookup(payload: dict[str, Any], ctx: ActionContext) -> dict[str, Any]:
    return {"hit": False}


ACTIONS = {"test.audit@1": _audit, "test.lookup@1": _lookup}


async def _until_term() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def engine(url: str) -> None:
    e = open_engine(
        url, url, options=EngineOptions(poll_ms=20, lease_ms=1_000, grace_ms=300), actions=ACTIONS
    )
    await e.start()
    print("ready", flush=True)
    await _until_term()
    await e.stop()


async def worker(url: str) -> None:
    transport = open_transport(url)
    crash = os.environ.get("WORKER_CRASH_AFTER_ACCEPT") == "1"

    async def handler(envelope: Mapping[str, Any]) -> dict[str, Any]:
        if crash:
            await asyncio.sleep(0.05)  # let the acceptance reach the queue
            os._exit(137)
        return {"ok": True}

    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(
        run_noop_worker(
            transport,
            QUEUES,
            handler=handler,
            stop=stop,
            worker_id=os.environ.get("WORKER_ID", "noop-worker"),
        )
    )
    print("ready", flush=True)
    await _until_term()
    stop.set()
    await task
    await transport.close()


if __name__ == "__main__":
    role, url = sys.argv[1], sys.argv[2]
    asyncio.run(engine(url) if role == "engine" else worker(url))
