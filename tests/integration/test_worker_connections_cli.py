"""`accord worker run --connections FILE`: the real binary serves a worker whose handler resolves
``storageConnectionRef`` names through the registry the file describes, per the run's tenant;
a file it cannot use stops it before it serves anything, one line naming the file, exit 1.

The engine runs in this process on a SQLite file that is also the queue; the worker is the
`accord worker run` process on the same file.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from accord.adapters import open_engine
from accord.engine.runtime.orchestrator import EngineOptions
from accord.testing.plans import pin
from accord.workflow.plan import Binding, Plan, RetryPolicy, TaskStage, Timeouts

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = ROOT / "schemas" / "contracts"
ACCORD = Path(sys.executable).parent / "accord"
QUEUE = "conn.work"

WORKER_MODULE = """
from accord.worker import Worker

worker = Worker("conn-worker")


@worker.handler("conntest@1", queue="conn.work")
def work(payload, ctx):
    opened = ctx.services["storage"].open(payload["ref"], ctx.tenant)
    return {"storage": type(opened).__name__}
"""

REGISTRY = {
    "connections": [
        {
            "name": "acme-files",
            "tenant": "acme",
            "url": "s3://models?endpoint=http://127.0.0.1:9",
            "prefix": "tenants/acme/",
            "operations": ["read"],
        }
    ]
}


def _plan() -> Plan:
    task = TaskStage(
        name="work",
        type="worker",
        capability=pin("conntest"),
        input={"ref": Binding(source="context", path=("ref",), raw="${context.ref}")},
        on_success="completed",
        on_failure="failed",
        retry=RetryPolicy(max_attempts=1, initial_backoff_ms=10, max_backoff_ms=10),
        timeouts=Timeouts(queue_deadline_ms=60_000, execution_deadline_ms=60_000),
        queue=QUEUE,
    )
    return Plan.create(name="conn-flow", version="1.0.0", entry="work", stages=(task,))


def _args(url: str, tmp: Path, *rest: str) -> list[str]:
    return [str(ACCORD), "worker", "run", "conn_worker:worker", "--transport", url,
            "--contracts", str(CONTRACTS), "--state", str(tmp / "wstate"), *rest]  # fmt: skip


def _env(tmp: Path) -> dict[str, str]:
    return os.environ | {"PYTHONPATH": str(tmp), "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}


async def _ended(engine: Any, run_id: str) -> Any:
    async with asyncio.timeout(30):
        while True:
            run = await engine.load(run_id)
            if run is not None and run.terminal:
                return run
            await asyncio.sleep(0.05)


async def test_the_worker_resolves_references_through_the_connections_file(
    tmp_path: Path,
) -> None:
    (tmp_path / "conn_worker.py").write_text(WORKER_MODULE, encoding="utf-8")
    registry = tmp_path / "connections.json"
    registry.write_text(json.dumps(REGISTRY), encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'accord.db'}"
    engine = open_engine(url, url, options=EngineOptions(poll_ms=10))
    await engine.register_plan(_plan())
    await engine.start()
    log = (tmp_path / "worker.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        *_args(url, tmp_path, "--connections", str(registry)), cwd=tmp_path,
        stdout=log, stderr=subprocess.STDOUT, env=_env(tmp_path),
    )  # fmt: skip
    try:
        own = await engine.start_run("conn-flow", {"ref": "acme-files"}, "acme")
        other = await engine.start_run("conn-flow", {"ref": "acme-files"}, "globex")
        done, refused = await _ended(engine, own), await _ended(engine, other)
        said = (tmp_path / "worker.log").read_text()
        assert done.status == "completed", (done.stages["work"], said)
        assert done.stages["work"].result == {"storage": "RemoteStorage"}
        stage = refused.stages["work"]
        assert refused.status == "failed" and stage.error["code"] == "storage-ref-denied", stage
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
        log.close()
        await engine.stop()


async def test_a_connections_file_it_cannot_use_is_one_line_and_exit_1(tmp_path: Path) -> None:
    (tmp_path / "conn_worker.py").write_text(WORKER_MODULE, encoding="utf-8")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"connections": [{"name": "x", "tenant": "acme"}]}), "utf-8")
    for path, expected in ((tmp_path / "missing.json", "cannot read"), (bad, "connections[0]")):
        proc = await asyncio.create_subprocess_exec(
            *_args("memory://", tmp_path, "--connections", str(path)), cwd=tmp_path,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(tmp_path),
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        text = err.decode()
        assert proc.returncode == 1, (out, text)
        assert "Traceback" not in text and "serving" not in out.decode(), text
        [line] = [x for x in text.splitlines() if x.strip()]
        assert line.startswith("error: worker not started: --connections:"), line
        assert str(path) in line and expected in line, line
