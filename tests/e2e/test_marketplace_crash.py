"""Marketplace publication across real process deaths, on the embedded default.

An engine process (`accord engine run`, platform actions included) and an Etsy connector process
(`accord worker run accord_worker_marketplace_etsy.handler:worker`) run marketplace-publish runs
against the Etsy test double, which holds every create's answer after the write. Each listing is
approved at the workflow's gate by an operator (`accord runs approve`, a process of its own) once
it waits. While the answers are held, a process is killed with SIGKILL (`kill -9`: no cleanup,
no flush):

- the engine: the connector's request is in flight when the engine dies, and its answer never
  comes in time: the connector's read times out, its reconciliation query finds the listing, and
  the outcome waits in the queue until a new engine applies it;
- the connector: the listing exists and nobody heard of it; a replacement connector (a new
  machine: its own acceptance record) takes the redelivered job, and its reconciliation query
  finds the listing instead of creating another.

Either way every run completes and each model is listed exactly once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.etsy_double.app import EtsyDouble, serve
from tests.etsy_double.flow import decide_when_waiting
from tests.etsy_double.support import CONTRACTS, ROOT, TOKENS, refresh

from accord.adapters import open_engine, open_store
from accord.cli.workflow import compile_file
from accord.contracts.sources import load_catalog
from accord.engine.machine.state import RunState
from accord.engine.runtime.orchestrator import EngineOptions

pytestmark = pytest.mark.slow
ACCORD = Path(sys.executable).with_name("accord")
MODELS = ("cube", "torus", "bracket")


@pytest.fixture
def double() -> Iterator[tuple[EtsyDouble, str]]:
    d = EtsyDouble(hold=threading.Event())
    with serve(d) as url:
        yield d, url


def _context(model_id: str) -> dict[str, Any]:
    return {
        "modelId": model_id,
        "format": "stl",
        "descriptors": [f"principal extents 20 × 20 × 20 of {model_id}"],
        "tags": [
            {"label": "convex", "confidence": 0.9},
            {"label": "multi-part", "confidence": 0.8},
        ],
        "previewKeys": [],  # images: test_marketplace_workflow; here, the create alone
    }


class Procs:
    def __init__(self, tmp: Path, url: str, base_url: str, read_timeout_s: str = "60") -> None:
        self.tmp, self.url = tmp, url
        tokens = tmp / "tokens.json"
        tokens.write_text(json.dumps(TOKENS))
        self.env = os.environ | {
            "ACCORD_ETSY_BASE_URL": base_url,
            "ACCORD_ETSY_API_KEY": "double-api-key",
            "ACCORD_ETSY_TOKENS": str(tokens),
            "ACCORD_POLICIES": str(tmp / "policies"),
            "ACCORD_CONTRACTS": str(CONTRACTS),
            "ACCORD_ETSY_READ_TIMEOUT_S": read_timeout_s,
        }
        self.env.pop("ACCORD_CRASH_AT", None)
        self.started: list[subprocess.Popen[bytes]] = []

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = self.tmp / f"{name}.{time.time_ns()}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([str(ACCORD), *args], env=self.env, stdout=out, stderr=out)
        proc.args = [str(log)]
        self.started.append(proc)
        return proc

    def engine(self) -> subprocess.Popen[bytes]:
        return self._spawn("engine", [
            "engine", "run", "--store", self.url, "--transport", self.url, "--poll-ms", "20",
            "--lease-ms", "1000", "--grace-ms", "300", "--state", str(self.tmp / "state"),
            "--contracts", str(CONTRACTS),
        ])  # fmt: skip

    def worker(self, name: str) -> subprocess.Popen[bytes]:
        return self._spawn(name, [
            "worker", "run", "accord_worker_marketplace_etsy.handler:worker", "--transport",
            self.url, "--store", self.url, "--contracts", str(CONTRACTS), "--state",
            str(self.tmp / name), "--heartbeat-ms", "200",
        ])  # fmt: skip

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return Path(str(proc.args[0])).read_text(errors="replace")[-3000:]  # type: ignore[index]

    def stop_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def procs(
    tmp_path: Path, double: tuple[EtsyDouble, str], request: pytest.FixtureRequest
) -> Iterator[Procs]:
    url = f"sqlite:///{tmp_path / 'accord.db'}?visibility_ms=1500"
    refresh(tmp_path / "policies", tmp_path)
    p = Procs(tmp_path, url, double[1], getattr(request, "param", "60"))
    try:
        yield p
    finally:
        p.stop_all()


async def _start_runs(url: str) -> list[str]:
    catalog = load_catalog(CONTRACTS)
    plan = compile_file(ROOT / "workflows" / "marketplace-publish.yaml", catalog).unwrap()
    setup = open_engine(url, url, options=EngineOptions(dispatch=False), catalog=catalog)
    try:
        await setup.register_plan(plan)
        return [await setup.start_run(plan.name, _context(m), tenant="demo") for m in MODELS]
    finally:
        await setup.stop()


async def _wait_terminal(url: str, runs: list[str], timeout_s: float = 60) -> list[RunState]:
    store = open_store(url)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            loaded = [await store.load(r) for r in runs]
            states = [RunState.from_json(s.state) for s in loaded if s is not None]
            if len(states) == len(runs) and all(s.terminal for s in states):
                return states
            await asyncio.sleep(0.1)
        raise AssertionError(f"runs not terminal: {[s.status for s in states]}")
    finally:
        await store.close()


async def _held(etsy: EtsyDouble, procs: Procs, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not etsy.written.is_set() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert etsy.written.is_set(), "no create reached Etsy:\n" + "\n".join(
        procs.log(p) for p in procs.started
    )


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL


def _check(states: list[RunState], etsy: EtsyDouble, procs: Procs) -> list[dict[str, object]]:
    logs = "\n".join(procs.log(p) for p in procs.started)
    results = []
    for st in states:
        assert st.status == "completed", (st.status, st.error, logs)
        results.append(dict(st.stages["publish-listing"].result or {}))
    assert len(etsy.listings) == len(MODELS), "one listing per model"
    assert etsy.received.count("createListing") == len(MODELS), "no create was repeated"
    assert {r["listingId"] for r in results} == set(etsy.listings)
    # canary: the OAuth token is in no log, run record, history or queue row
    token = TOKENS["demo-shop"].encode()
    for path in procs.tmp.rglob("*"):
        if path.is_file() and path.name != "tokens.json":
            assert token not in path.read_bytes(), f"the token leaked into {path}"
    return results


@pytest.mark.parametrize("procs", ["1.5"], indirect=True)  # the connector's read timeout, s
async def test_engine_killed_between_the_etsy_request_and_its_answer(
    procs: Procs, double: tuple[EtsyDouble, str]
) -> None:
    etsy, _ = double
    runs = await _start_runs(procs.url)
    engine = procs.engine()
    procs.worker("connector")
    await decide_when_waiting(procs.url, runs)
    await _held(etsy, procs)
    _kill(engine)
    await asyncio.sleep(2.0)  # the create times out; the query finds it; nobody reads the outcome
    procs.engine()
    results = _check(await _wait_terminal(procs.url, runs), etsy, procs)
    assert all(r["reconciled"] for r in results), "every answer was lost: all were found"


async def test_connector_killed_between_the_etsy_request_and_its_answer(
    procs: Procs, double: tuple[EtsyDouble, str]
) -> None:
    etsy, _ = double
    runs = await _start_runs(procs.url)
    procs.engine()
    doomed = procs.worker("connector")
    await decide_when_waiting(procs.url, runs)
    await _held(etsy, procs)
    _kill(doomed)
    written = len(etsy.listings)
    assert etsy.hold is not None
    etsy.hold.set()
    procs.worker("replacement")  # a new machine: its own acceptance record
    results = _check(await _wait_terminal(procs.url, runs), etsy, procs)
    assert sum(bool(r["reconciled"]) for r in results) >= written >= 1
