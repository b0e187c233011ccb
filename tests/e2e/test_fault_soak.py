"""The fault test: 200 runs while the engine, the workers and Redis are killed with ``kill -9``.

A private ``redis-server`` (its own port and directory, AOF with ``appendfsync always``: a kill
loses nothing it acknowledged) holds both the store (``redis://``) and the transport
(``bullmq://``). The runs of :func:`accord.testing.plans.model_ingest_shape` (render, then
analyse and metadata in parallel, then publish) are started first, then served by two
``accord engine run`` and two ``accord worker run`` processes (:mod:`fault_worker`). A chaos
loop kills one of them every second with SIGKILL and starts it again: first an engine, a worker
and Redis in turn, :data:`MIN_KILLS` rounds, then Redis alone until every run has ended. A
worker comes back with the acceptance records it had, as on the same machine. Jobs' locks
(:data:`LOCK_MS`) outlive a Redis restart, so in the Redis-only phase nothing but the live
workers themselves can settle what they hold: a job a worker neither answered nor returned would
stay ``active`` (and, with its prefetch full, the worker would take no more work).

Then, once every queue has stayed empty for longer than the engines' sweep grace and the
processes have stopped gracefully: every run is ``completed``; its history replays to its record
and passes the per-run invariants (:func:`accord.testing.invariants.assert_run_invariants`); every
stage's completion was accepted exactly once (the run did not complete twice) and the run was
started once; the outbox is empty; no job queue, control queue nor the outcomes queue has a job
waiting, active or delayed (completed jobs are kept by design, up to ``done_count``), and there
are no dead letters. No process exited but those the test killed, except one that gave up
starting, with one line, because Redis went away while it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

import pytest
from tests.services import PrivateRedis

from accord.adapters import open_store, open_transport
from accord.adapters.clock import SystemClock
from accord.adapters.transports.bullmq import BullmqTransport
from accord.engine.machine.state import HistoryEntry, RunState
from accord.engine.ports import Store
from accord.engine.runtime.intake import OUTCOMES_QUEUE
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.engine.runtime.outbox import control_queue
from accord.testing.invariants import assert_i1_terminal, assert_run_invariants
from accord.testing.plans import QUEUES, model_ingest_shape, pin
from accord.workflow.kinds.task import TaskStage
from accord.workflow.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
RUNS = 200
ENGINES, WORKERS, SLOTS = 2, 2, 4
KILL_EVERY_S = 1.0  # one kill -9 per period, engine → worker → Redis in turn
MIN_KILLS = 3  # of each: the chaos goes on until then, even if every run has ended
REDIS_DOWN_S = 0.5  # how long Redis stays dead before it is started again
# a job's lock outlives a Redis restart (its loading included): a job a live worker holds is
# not handed out again by the broker while that worker renews it
LOCK_MS = 8_000


def _plan() -> Plan:
    """model-ingest's shape, its worker stages on the capabilities :mod:`fault_worker` serves
    (``soak-<stage>@1``: message types an envelope may carry, with no contracts to check)."""
    shape = model_ingest_shape(
        name="fault-soak", max_attempts=30, queue_deadline_ms=15_000, execution_deadline_ms=10_000
    )
    stages = tuple(
        replace(s, capability=pin(f"soak-{s.name}")) if isinstance(s, TaskStage) else s
        for s in shape.stages
    )
    return Plan.create(name=shape.name, version=shape.version, entry=shape.entry, stages=stages)


PLAN = _plan()
STAGES = ("render", "analyse", "metadata", "publish")
ALL_QUEUES = (*QUEUES, OUTCOMES_QUEUE, *(control_queue(q) for q in QUEUES))
# the accord command, which on SIGUSR1 writes what each of its tasks awaits to its log: how a
# process that holds a job too long is looked into
CLI = """
import asyncio, signal, sys
def dump(*_):
    for task in asyncio.all_tasks():
        print("task", task.get_name(), file=sys.stderr)
        task.print_stack(limit=12, file=sys.stderr)
signal.signal(signal.SIGUSR1, dump)
from accord.cli import main
sys.argv[0] = "accord"
main()
"""

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


@dataclass
class Fleet:
    """The engine and worker processes; :meth:`supervise` starts again any that ended."""

    tmp: Path
    store_url: str
    transport_url: str
    engines: list[subprocess.Popen[bytes]] = field(default_factory=list)
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    killed: set[int] = field(default_factory=set)  # pids this test killed
    unexpected: list[str] = field(default_factory=list)  # exits nobody caused
    refused: int = 0  # starts refused because Redis was away (by design: exit 1, one line)
    _logs: list[IO[bytes]] = field(default_factory=list)
    _since: dict[int, tuple[Path, int]] = field(default_factory=dict)  # pid -> its log, offset

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        path = self.tmp / f"{name}.log"
        log = path.open("ab")
        self._logs.append(log)
        offset = path.stat().st_size
        env = os.environ | {"PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(Path(__file__).parent), env.get("PYTHONPATH", "")) if p
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", CLI, *args], stdout=log, stderr=log, env=env, cwd=ROOT
        )
        self._since[proc.pid] = (path, offset)
        return proc

    def _start_refused(self, proc: subprocess.Popen[bytes]) -> bool:
        """The process gave up starting, with one line, because Redis went away while it
        started (the startup check; a first reconcile pass that meets it is deferred to
        housekeeping): it never began serving. One that fails after it began serving is a
        crash."""
        path, offset = self._since[proc.pid]
        said = path.read_bytes()[offset:].decode(errors="replace").strip().splitlines()
        last = said[-1] if said else ""
        serving = any(" running on " in line or line.startswith("serving ") for line in said)
        away = "connection problem" in last or "not reachable" in last
        return proc.returncode == 1 and not serving and last.startswith("error: ") and away

    def engine(self, n: int) -> subprocess.Popen[bytes]:
        args = ["engine", "run", "--store", self.store_url, "--transport", self.transport_url]
        args += ["--owner", f"e{n}", "--poll-ms", "20", "--lease-ms", "1000", "--grace-ms", "300"]
        return self._spawn(f"engine{n}", [*args, "--no-platform"])

    def worker(self, n: int) -> subprocess.Popen[bytes]:
        args = ["worker", "run", "fault_worker:worker", "--transport", self.transport_url]
        args += ["--contracts", str(ROOT / "schemas" / "contracts")]
        args += ["--state", str(self.tmp / f"worker{n}"), "--slots", str(SLOTS)]
        return self._spawn(f"worker{n}", [*args, "--heartbeat-ms", "1000"])

    def start(self) -> None:
        self.engines = [self.engine(n) for n in range(ENGINES)]
        self.workers = [self.worker(n) for n in range(WORKERS)]

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            self.killed.add(proc.pid)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)

    def supervise(self) -> None:
        for group, make in ((self.engines, self.engine), (self.workers, self.worker)):
            for n, proc in enumerate(group):
                if proc.poll() is None:
                    continue
                if self._start_refused(proc):
                    self.refused += 1
                elif proc.pid not in self.killed:
                    path, offset = self._since[proc.pid]
                    said = path.read_bytes()[offset:].decode(errors="replace").strip()
                    self.unexpected.append(
                        f"{make.__name__}{n} exited {proc.returncode}: …{said[-600:]}"
                    )
                group[n] = make(n)

    def stop(self) -> None:
        """SIGTERM the workers, then the engines, each once it is serving (a process signalled
        while it still imports dies of the signal): each must stop gracefully."""
        for group, ready in ((self.workers, "serving "), (self.engines, " running on ")):
            for proc in group:
                path, offset = self._since[proc.pid]
                serving_by = time.monotonic() + 30
                while ready not in path.read_bytes()[offset:].decode(errors="replace"):
                    assert time.monotonic() < serving_by, f"{path.name} never served"
                    time.sleep(0.05)
                proc.send_signal(signal.SIGTERM)
            for proc in group:
                code = proc.wait(60)
                assert code == 0, f"a process stopped with {code}: {self.tail()}"

    def abandon(self) -> None:
        for proc in (*self.engines, *self.workers):
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        for log in self._logs:
            log.close()

    def tail(self) -> str:
        return "".join(
            f"\n--- {p.name}\n" + p.read_text(errors="replace")[-2000:]
            for p in sorted(self.tmp.glob("*.log"))
        )


async def start_runs(store_url: str, transport_url: str) -> list[str]:
    """Register the plan and start the runs (their first jobs wait in the outbox for an
    engine's sweep): nothing is dispatched from here."""
    setup = Engine(
        open_store(store_url), open_transport(transport_url), SystemClock(),
        options=EngineOptions(dispatch=False),
        owns_ports=True,
    )  # fmt: skip
    await setup.register_plan(PLAN)
    ids = [f"run_fault{n:04d}" for n in range(RUNS)]
    for n in range(0, RUNS, 50):
        batch = ids[n : n + 50]
        await asyncio.gather(
            *(setup.start_run(PLAN.name, {"modelId": f"m{r}"}, run_id=r) for r in batch)
        )
    await setup.stop()
    return ids


async def ended(store: Store, run_ids: list[str]) -> set[str]:
    """The runs in a terminal state (none, while Redis is away)."""
    done: set[str] = set()
    with contextlib.suppress(Exception):
        for n in range(0, len(run_ids), 50):
            batch = run_ids[n : n + 50]
            for rid, stored in zip(
                batch, await asyncio.gather(*map(store.load, batch)), strict=True
            ):
                if stored is not None and RunState.from_json(stored.state).terminal:
                    done.add(rid)
    return done


async def left_on(transport: BullmqTransport) -> dict[str, dict[str, int]]:
    """Jobs waiting, active or delayed on each queue (an empty dict when all are drained)."""
    left = {}
    for queue in ALL_QUEUES:
        counts = await transport.queue(queue).getJobCounts(
            "wait", "active", "delayed", "paused", "prioritized"
        )
        busy = {state: int(n) for state, n in counts.items() if int(n)}
        if busy:
            left[queue] = busy
    return left


async def held_jobs(server: PrivateRedis) -> list[dict[str, object]]:
    """What a queue still holds active: each job, its lock's time to live and holder."""
    client = server.client()
    found: list[dict[str, object]] = []
    try:
        for queue in ALL_QUEUES:
            for job in client.lrange(f"fsb:{queue}:active", 0, -1):
                job_id = str(job)  # a decoding client: text
                lock = f"fsb:{queue}:{job_id}:lock"
                found.append({
                    "queue": queue, "job": job_id, "lock_ttl_ms": client.pttl(lock),
                    "token": client.get(lock),
                    "stalled": client.sismember(f"fsb:{queue}:stalled", job_id),
                    "started": client.hget(f"fsb:{queue}:{job_id}", "ats"),
                })  # fmt: skip
        found.append({"clients": [c.get("name") for c in client.client_list()]})
    finally:
        client.close()
    return found


async def chaos(
    fleet: Fleet, server: PrivateRedis, until: asyncio.Event
) -> tuple[Counter[str], int]:
    """Kill an engine, a worker, Redis, in turn, every :data:`KILL_EVERY_S`, until ``until``
    is set and each has been killed :data:`MIN_KILLS` times; the kills, and how many of them
    came before ``until`` (while runs were under way)."""
    kills: Counter[str] = Counter()
    turn = mid_flight = 0
    while turn < 3 * MIN_KILLS or not until.is_set():
        await asyncio.sleep(KILL_EVERY_S)
        # after the rounds of all three, Redis alone: nothing but a live worker can then settle
        # what the workers hold, so a job held unanswered stays active to the end
        rotating = turn < 3 * MIN_KILLS
        what = ("engine", "worker", "redis")[turn % 3] if rotating else "redis"
        which = (turn // 3) % 2
        turn += 1
        mid_flight += not until.is_set()
        if what == "redis":
            server.kill()
            await asyncio.sleep(REDIS_DOWN_S)
            server.start()
        else:
            group = fleet.engines if what == "engine" else fleet.workers
            fleet.kill(group[which])
        fleet.supervise()
        kills[what] += 1
    return kills, mid_flight


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PrivateRedis]:
    """The private Redis; whichever incarnation of it runs at the end is killed."""
    (tmp_path / "redis").mkdir()
    private = PrivateRedis(tmp_path / "redis").start()
    yield private
    private.kill()


async def test_200_runs_survive_kill_9_of_engines_workers_and_redis(
    tmp_path: Path, server: PrivateRedis
) -> None:
    store_url = server.url(prefix="fs")
    transport_url = (
        f"bullmq://127.0.0.1:{server.port}/0?prefix=fsb&visibility_ms={LOCK_MS}&stalled_ms=1000"
        "&max_deliveries=50"
    )
    fleet = Fleet(tmp_path, store_url, transport_url)
    store, transport = open_store(store_url), open_transport(transport_url)
    assert isinstance(transport, BullmqTransport)
    began = time.monotonic()
    try:
        run_ids = await start_runs(store_url, transport_url)
        fleet.start()
        all_ended = asyncio.Event()
        chaos_task = asyncio.get_running_loop().create_task(chaos(fleet, server, all_ended))
        deadline = time.monotonic() + 240
        done: set[str] = set()
        while len(done) < RUNS and time.monotonic() < deadline and not chaos_task.done():
            done |= await ended(store, sorted(set(run_ids) - done))
            await asyncio.sleep(0.25)
        all_ended.set()
        kills, mid_flight = await chaos_task
        churn_s = time.monotonic() - began
        assert len(done) == RUNS, f"{RUNS - len(done)} runs never ended: {fleet.tail()}"
        # every queue stays empty for longer than the sweep grace: nothing late is left
        quiet_since, settle_by = None, time.monotonic() + 60
        while True:
            fleet.supervise()
            left = await left_on(transport)
            now = time.monotonic()
            quiet_since = None if left else quiet_since or now
            if quiet_since is not None and now - quiet_since >= 3.0:
                break
            if now >= settle_by:
                for proc in (*fleet.engines, *fleet.workers):
                    proc.send_signal(signal.SIGUSR1)
                await asyncio.sleep(1)
                held = await held_jobs(server)
                pytest.fail(f"queues never drained: {left} {held}; logs in {tmp_path}")
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
            assert_run_invariants(PLAN, run, history)
            accepted = Counter(
                (h.event.get("kind"), h.event.get("stage")) for h in history if h.accepted
            )
            starts = sum(n for (kind, _), n in accepted.items() if kind == "run-started")
            assert starts == 1, f"run {rid} started {starts} times"
            for stage in STAGES:
                assert accepted[("stage-succeeded", stage)] == 1, (
                    f"run {rid}: {stage} completed {accepted[('stage-succeeded', stage)]} times"
                )
        assert await store.claim_outbox(1000, "drain-check", 0) == [], "outbox not drained"
        assert await left_on(transport) == {}
        for queue in ALL_QUEUES:
            assert await transport.dead_letters(queue) == [], f"dead letters on {queue}"
    finally:
        await transport.close()
        await store.close()
        server.kill()
    assert len(kills) == 3 and min(kills.values()) >= MIN_KILLS, kills
    assert mid_flight >= 3, f"only {mid_flight} kills came while runs were under way"
    print(
        f"\nfault test: {RUNS} runs ended in {churn_s:.1f} s under kills {dict(kills)} "
        f"({mid_flight} while runs were under way); starts refused while Redis was away: "
        f"{fleet.refused}"
    )
