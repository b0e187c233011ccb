"""Crash and fault tests on PostgreSQL: the store and the queue in one schema, processes killed.

- ``kill -9`` between commit and publish, and between publish and outbox-done: an engine process
  dies at the crash point (:mod:`crash_procs`, ``ACCORD_CRASH_AT``), another takes over; every run
  completes as its history explains, outbox and queues drained (the checks of
  :mod:`test_crash_engine`).
- ``kill -9`` of ``accord engine run`` mid-flight: a second one finishes the runs and stops
  gracefully on SIGTERM.
- The fault test: :data:`RUNS` runs (200; ``ACCORD_SOAK_RUNS=1000`` for the full soak, as ``make
  soak`` runs it) served by two engines and two workers while a chaos loop kills an engine, a
  worker and the PostgreSQL server itself (a private cluster: ``initdb`` in a temp folder, its
  whole process group killed with SIGKILL and started again, recovering from its WAL) in turn,
  :data:`~test_fault_soak.MIN_KILLS` rounds (while the runs are under way), then no more kills
  until every run has ended: a restarted engine's start-up pass covers every run, longer than a
  kill period on this machine at 1,000 runs.
  Then every run completed exactly once per stage, histories replay, nothing is left queued, no
  dead letters, and no process exited but those the test killed (or one that gave up starting,
  with one line, while the server was away).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from tests.e2e import test_crash_engine as crash
from tests.e2e import test_fault_soak as soak
from tests.e2e.test_crash_engine_cli import PLAN as CLI_PLAN
from tests.e2e.test_crash_engine_cli import _engine_process
from tests.services import _pg_bin, ensure_postgres, postgres_url

from accord.adapters import open_store, open_transport
from accord.adapters.clock import SystemClock
from accord.engine.machine.replay import ReplayDivergence, replay
from accord.engine.machine.state import HistoryEntry, RunState
from accord.engine.ports import QueueAdmin, Store
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.testing.invariants import assert_i1_terminal, assert_run_invariants

PROCS = Path(__file__).with_name("crash_procs.py")
RUNS = int(os.environ.get("ACCORD_SOAK_RUNS", "200"))

pytestmark = pytest.mark.slow


def _spawn(role: str, url: str, logs: Path, **env: str) -> subprocess.Popen[bytes]:
    full = {k: v for k, v in os.environ.items() if k != "ACCORD_CRASH_AT"} | env
    log = logs / f"{role}.{time.time_ns()}.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(PROCS), role, url], env=full, stdout=err, stderr=err
        )
    proc.args = [str(log)]  # where crash._log looks
    return proc


@pytest.mark.parametrize("point", ["after-commit:6", "after-publish:6"])
async def test_engine_killed_at_a_crash_point(tmp_path: Path, point: str) -> None:
    url = postgres_url("visibility_ms=1000")
    runs = await crash._start_runs(url)
    worker = _spawn("worker", url, tmp_path)
    first = _spawn("engine", url, tmp_path, ACCORD_CRASH_AT=point)
    try:
        assert await crash._wait_exit(first, 30) == 137
        again = _spawn("engine", url, tmp_path)
        try:
            await crash._wait_all_terminal(url, runs)
            await crash._wait_drained(url)
        finally:
            crash._stop(again)
        assert again.returncode == 0, crash._log(again)
    finally:
        crash._stop(first)
        crash._stop(worker)
    await crash._check_explained(url, runs)


async def test_engine_run_command_survives_kill_9(tmp_path: Path) -> None:
    url = postgres_url("visibility_ms=1000")
    log = tmp_path / "engine.log"
    setup = Engine(
        open_store(url), open_transport(url), SystemClock(),
        options=EngineOptions(dispatch=False), owns_ports=True,
    )  # fmt: skip
    await setup.register_plan(CLI_PLAN)
    runs = [await setup.start_run(CLI_PLAN.name, {"modelId": f"m{i}"}) for i in range(8)]
    await setup.stop()
    worker = _spawn("worker", url, tmp_path)
    proc = _engine_process(url, log)
    try:
        await asyncio.sleep(1.5)
        proc.send_signal(signal.SIGKILL)  # mid-flight, no cleanup
        proc.wait(10)
        second_from = len(log.read_text())
        proc = _engine_process(url, log)
        await crash._wait_all_terminal(url, runs)
        serving = time.monotonic() + 30
        while "running on" not in log.read_text()[second_from:] and time.monotonic() < serving:
            await asyncio.sleep(0.05)
        assert "running on" in log.read_text()[second_from:], log.read_text()
        await crash._wait_drained(url)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        crash._stop(worker)
    store = open_store(url)
    try:
        for rid in runs:
            stored = await store.load(rid)
            assert stored is not None and stored.state["status"] == "completed", rid
            history = [HistoryEntry.from_json(h) for h in await store.history(rid)]
            assert replay(CLI_PLAN, history) == RunState.from_json(stored.state)
        assert await store.claim_outbox(100, "check", 0) == [], "outbox not drained"
    finally:
        await store.close()


# ---- the fault test -----------------------------------------------------------------------


class PrivatePostgres:
    """A PostgreSQL cluster of the test's own on a free loopback port (trust auth, ``fsync`` on:
    what it acknowledged survives a kill), run as ``nobody`` when the test runs as root. Its
    postmaster is started in a session of its own, so :meth:`kill` takes every backend with it,
    as a power cut of the server would."""

    def __init__(self) -> None:
        ensure_postgres()  # installs the binaries when missing
        initdb, postgres = _pg_bin("initdb"), _pg_bin("postgres")
        assert initdb and postgres, "PostgreSQL binaries not found"
        self.postgres = postgres
        self.root = Path(tempfile.mkdtemp(prefix="accord-pgf-"))
        self.data = self.root / "data"
        self.user: dict[str, int] = {}
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            os.chown(self.root, nobody.pw_uid, nobody.pw_gid)
            self.user = {"user": nobody.pw_uid, "group": nobody.pw_gid}
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        subprocess.run([initdb, "-D", str(self.data), "-U", "postgres", "-A", "trust"],
                       check=True, capture_output=True, timeout=120, **self.user)  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> PrivatePostgres:
        args = [self.postgres, "-D", str(self.data), "-p", str(self.port), "-k", str(self.root),
                "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200"]  # fmt: skip
        with (self.root / "log").open("ab") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=log, start_new_session=True, **self.user
            )
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(psycopg.Error):
                psycopg.connect(self.dsn, connect_timeout=1).close()
                return self
            assert time.monotonic() < deadline and self.proc.poll() is None, (
                self.root / "log"
            ).read_text()[-2000:]
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
            self.proc = None

    def remove(self) -> None:
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def server() -> Iterator[PrivatePostgres]:
    private = PrivatePostgres().start()
    yield private
    private.remove()


class PgFleet(soak.Fleet):
    def _start_refused(self, proc: subprocess.Popen[bytes]) -> bool:
        """Gave up starting, with one line, because the server was away."""
        path, offset = self._since[proc.pid]
        said = path.read_bytes()[offset:].decode(errors="replace").strip().splitlines()
        last = said[-1] if said else ""
        serving = any(" running on " in line or line.startswith("serving ") for line in said)
        # a start meets the server away in its first calls: any of them may be the one
        away = last.startswith("error: postgresql ") and " failed " in last
        return proc.returncode == 1 and not serving and last.startswith("error: ") and away


async def _start_runs(url: str) -> list[str]:
    setup = Engine(
        open_store(url), open_transport(url), SystemClock(),
        options=EngineOptions(dispatch=False), owns_ports=True,
    )  # fmt: skip
    await setup.register_plan(soak.PLAN)
    ids = [f"run_pgf{n:05d}" for n in range(RUNS)]
    for n in range(0, RUNS, 100):
        await asyncio.gather(
            *(setup.start_run(soak.PLAN.name, {"modelId": f"m{r}"}, run_id=r)
              for r in ids[n : n + 100])
        )  # fmt: skip
    await setup.stop()
    return ids


async def _ended(store: Store, run_ids: list[str]) -> set[str]:
    """The runs found in a terminal state; a batch the server's absence interrupts is simply
    looked at again next time (the others keep what they found)."""
    done: set[str] = set()
    for n in range(0, len(run_ids), 50):
        batch = run_ids[n : n + 50]
        with contextlib.suppress(Exception):
            loaded = await asyncio.gather(*map(store.load, batch))
            done |= {
                rid for rid, stored in zip(batch, loaded, strict=True)
                if stored is not None and RunState.from_json(stored.state).terminal
            }  # fmt: skip
    return done


async def _left(transport: QueueAdmin) -> dict[str, int]:
    left = {}
    for queue in soak.ALL_QUEUES:
        with contextlib.suppress(Exception):  # the server may be away
            waiting = await transport.waiting(queue)
            if waiting:
                left[queue] = len(waiting)
    return left


async def _chaos(
    fleet: PgFleet, server: PrivatePostgres, until: asyncio.Event
) -> tuple[Counter[str], int]:
    kills: Counter[str] = Counter()
    turn = mid_flight = 0
    while turn < 3 * soak.MIN_KILLS or not until.is_set():
        await asyncio.sleep(soak.KILL_EVERY_S)
        if turn >= 3 * soak.MIN_KILLS:  # the rounds are done: let the fleet finish
            turn += 1
            fleet.supervise()
            continue
        what = ("engine", "worker", "postgres")[turn % 3]
        which = (turn // 3) % 2
        turn += 1
        mid_flight += not until.is_set()
        if what == "postgres":
            server.kill()
            await asyncio.sleep(0.5)
            server.start()
        else:
            fleet.kill((fleet.engines if what == "engine" else fleet.workers)[which])
        fleet.supervise()
        kills[what] += 1
    return kills, mid_flight


@pytest.mark.timeout(420 if RUNS <= 200 else 1200)
async def test_runs_survive_kill_9_of_engines_workers_and_postgres(
    tmp_path: Path, server: PrivatePostgres
) -> None:
    url = f"{server.dsn}?schema=fault&visibility_ms=8000&max_deliveries=50&pool_size=4"
    fleet = PgFleet(tmp_path, url, url)
    began = time.monotonic()
    run_ids = await _start_runs(url)
    store, transport = open_store(url), open_transport(url)
    assert isinstance(transport, QueueAdmin)
    try:
        fleet.start()
        all_ended = asyncio.Event()
        chaos_task = asyncio.get_running_loop().create_task(_chaos(fleet, server, all_ended))
        deadline = time.monotonic() + max(300, RUNS * 0.8)
        done: set[str] = set()
        while len(done) < RUNS and time.monotonic() < deadline and not chaos_task.done():
            done |= await _ended(store, sorted(set(run_ids) - done))
            await asyncio.sleep(0.25)
        all_ended.set()
        kills, mid_flight = await chaos_task
        churn_s = time.monotonic() - began
        assert len(done) == RUNS, f"{RUNS - len(done)} runs never ended: {fleet.tail()}"
        quiet_since, settle_by = None, time.monotonic() + 60
        while True:
            fleet.supervise()
            left = await _left(transport)
            now = time.monotonic()
            quiet_since = None if left else quiet_since or now
            if quiet_since is not None and now - quiet_since >= 3.0:
                break
            assert now < settle_by, f"queues never drained: {left}; logs in {tmp_path}"
            await asyncio.sleep(0.2)
        fleet.stop()
        assert not fleet.unexpected, f"processes died unasked: {fleet.unexpected}{fleet.tail()}"
    except BaseException:  # close the clients here: a leaked socket would fail a later test
        await transport.close()
        await store.close()
        raise
    finally:
        fleet.abandon()
    try:
        for rid in run_ids:
            stored = await store.load(rid)
            assert stored is not None, f"run {rid} lost"
            run = RunState.from_json(stored.state)
            history = [HistoryEntry.from_json(h) for h in await store.history(rid)]
            assert_i1_terminal(run)
            assert run.status == "completed", f"run {rid} ended {run.status}: {history[-4:]}"
            try:
                replayed = replay(soak.PLAN, history)
            except ReplayDivergence as exc:  # say what was recorded, not only where
                shown = "\n".join(repr(h) for h in history[:8])
                raise AssertionError(f"run {rid}: {exc}\n{shown}") from None
            assert replayed == run
            assert_run_invariants(soak.PLAN, run, history)
            accepted = Counter(
                (h.event.get("kind"), h.event.get("stage")) for h in history if h.accepted
            )
            assert sum(n for (k, _), n in accepted.items() if k == "run-started") == 1, rid
            for stage in soak.STAGES:
                assert accepted[("stage-succeeded", stage)] == 1, f"run {rid}: {stage}"
        assert await store.claim_outbox(1000, "drain-check", 0) == [], "outbox not drained"
        assert await _left(transport) == {}
        for queue in soak.ALL_QUEUES:
            assert await transport.dead_letters(queue) == [], f"dead letters on {queue}"
    finally:
        await transport.close()
        await store.close()
    assert len(kills) == 3 and min(kills.values()) >= soak.MIN_KILLS, kills
    assert mid_flight >= 3, f"only {mid_flight} kills came while runs were under way"
    print(
        f"\nPostgreSQL fault test: {RUNS} runs ended in {churn_s:.1f} s under kills"
        f" {dict(kills)} ({mid_flight} while runs were under way); starts refused while the"
        f" server was away: {fleet.refused}"
    )
