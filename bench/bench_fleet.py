"""The distributed engine as deployed: engine and worker processes apart, Redis + BullMQ and Redis
+ RabbitMQ.

Same plan as :mod:`bench.bench_engine` (``render → fork(analyse, metadata) → join → publish``,
9 transitions per run), but nothing shares a process with anything else: the engine runs in this
process (it starts the runs, as an engine serving the API does), each of ``W`` workers is a
process of its own serving no-op handlers on the Worker SDK runtime with ``S`` task slots, its
acceptance record on disk, as ``accord worker run`` does, over the same transport URL, and with
more engines the others are processes of their own (:mod:`bench.fleet_proc`) sharing the store's
shards (``shards=8``): each owns its share under a lease and alone reads its shards' outcome
queues, which the jobs of its runs name as ``replyTo``.
Every process runs on the event loop Accord's commands pick (:mod:`accord.loop`). Store and
queues live on fresh prefixes, removed afterwards (:mod:`bench.engine_distributed`). Timing
starts only when every process answered ``ready``, the store's shard leases show every shard
held, unexpired, by the engine the engines' own assignment gives it (so each engine owns its
share and no shard changes hands in the timed phase), and every worker has received a job of a
warm-up batch.

Figures per configuration (``e<engines>w<workers>s<slots per worker>``):

- ``runs_per_s`` / ``transitions_per_s``: N runs started at once, until all are terminal;
  ``conflicts`` (and ``conflicts_per_run``): commits that lost a compare-and-set in that phase,
  summed over the engine processes; ``ownership_lost_per_run``: fenced commits the store refused
  because the run's shard had changed hands; ``shards_moved``: shards taken by any engine in
  that phase (0 when ownership held still);
- ``hop_p50_ms`` / ``hop_p99_ms``: end of one task (its result published) to the start of the
  next (its job received by a worker), during the throughput phase; ``hop_*_single_run``: the
  same with one run in flight; ``single_run_p50_ms``: one run at a time, start to terminal.
  Workers stamp with ``time.perf_counter`` (``CLOCK_MONOTONIC``, one clock machine-wide) and
  hand their stamps back when they stop;
- ``outcomes_per_message``: outcomes the workers sent per broker message that carried them in
  that phase (outcomes ready at once leave as one batch: :mod:`accord.worker.batching`);
- ``cpu_ms_per_run``: CPU of every fleet process over the throughput phase (this process's own,
  the others' ``utime + stime`` from ``/proc/<pid>/stat``), per run, split into
  ``engine_cpu_ms_per_run`` (every engine process's, summed) and ``workers_cpu_ms_per_run``;
  ``redis_cpu_ms_per_run`` (``INFO cpu``, user + sys), ``rabbitmq_cpu_ms_per_run`` (the
  ``beam.smp`` process) and ``postgres_cpu_ms_per_run`` are the servers' over the same window —
  they also count whatever else uses the servers meanwhile; ``total_cpu_ms_per_run`` is the
  fleet's and the servers' together;
- ``load_average_start`` / ``load_average_end``: the machine's 1-minute load around each
  configuration;
- with ``ACCORD_BENCH_FLEET_LAG=1``, the search projector's lag and catch-up under this load
  (:mod:`bench.fleet_lag`; one-engine configurations).

The default configuration is at the top of each broker's figures; the others tried are under
``variants``. On the Redis brokers, 1, 2 and 4 engine processes are measured with the same
worker process (``e1w1s8``, ``e2w1s8``, ``e4w1s8``): what sharding the runs over engines costs.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gc
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from accord.adapters import open_engine
from accord.adapters.clock import SystemClock
from accord.cli._redaction import SEALING_KEY_ENV, SEALING_KEYS_ENV
from accord.contracts.sealing import Keyring
from accord.engine.ports import Shards
from accord.engine.runtime.checks import MessageCatalog
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.engine.runtime.shards import assign
from accord.loop import run as run_loop
from accord.workflow.plan import Plan
from bench import fleet_lag
from bench.bench_engine import PLAN, _pct, _Tracker
from bench.engine_distributed import REDIS_HOST, REDIS_PORT, ROOT, keyspace
from bench.fleet_proc import ENGINE_COUNTERS

# (engines, workers, task slots per worker): one engine and one worker process had the most runs/s
# and the least CPU per run on this 2-core machine; 8 slots rather than 4 let more of a worker's
# outcomes share a broker message (accord.worker.batching) and shorten the hops under load. The
# peers run 4 (Celery: one worker, prefork 4), so 4 slots is measured too; more workers shorten
# RabbitMQ's hops under load; engines share the store's shards, so more engines are measured on
# the Redis brokers with the same worker process (SCALING) to see what they cost
DEFAULT = {"bullmq": (1, 1, 8), "rabbitmq": (1, 1, 8), "postgres": (1, 1, 8)}
VARIANTS = ((1, 1, 4), (1, 2, 8), (2, 1, 8))
SCALING = {"bullmq": ((4, 1, 8),), "rabbitmq": ((4, 1, 8),)}
TICK = os.sysconf("SC_CLK_TCK")
# what each kind of fleet process answers SIGUSR1 with
COUNTERS = {"engine": ENGINE_COUNTERS, "worker": ("outcomes", "outcome_messages")}
SHARDS_SETTLE_S = 60.0  # engines hand shards over within a few beats (a quarter lease each)


def stat_cpu_s(stat: str) -> float:
    """User + system CPU seconds (``utime + stime``, all threads) in a ``/proc/<pid>/stat`` line."""
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces and ")"
    return (int(fields[11]) + int(fields[12])) / TICK


def _proc_cpu_s(pid: int) -> float:
    return stat_cpu_s(Path(f"/proc/{pid}/stat").read_text())


def _beam_pid() -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() == "beam.smp":
                    return int(entry.name)
    return None


def _postgres_cpu_s() -> float:
    """CPU of every ``postgres`` process now running (the server and its backends)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() == "postgres":
                    total += stat_cpu_s((entry / "stat").read_text())
    return total


def _redis_cpu_s() -> float | None:
    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, socket_timeout=2)
    try:
        info = client.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    except (redis.RedisError, KeyError):
        return None
    finally:
        client.close()


@dataclass
class _Child:
    """One fleet process and what it has said on stdout."""

    role: str
    proc: asyncio.subprocess.Process
    out: Path
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    warm: asyncio.Event = field(default_factory=asyncio.Event)
    stats: asyncio.Queue[tuple[int, ...]] = field(default_factory=asyncio.Queue)
    reader: asyncio.Task[None] | None = None
    owner: str | None = None  # an engine's id in the store's shard leases (its ``ready`` line)

    async def read(self, tracker: _Tracker) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            word, *rest = raw.decode().split()
            if word == "ready":
                self.owner = rest[0] if rest else None
                self.ready.set()
            elif word == "warm":
                self.warm.set()
            elif word == "done":
                tracker.done.setdefault(rest[0], float(rest[1]))
                tracker.changed.set()
            elif word == "stats":
                self.stats.put_nowait(tuple(int(v) for v in rest))

    async def counters(self) -> tuple[int, ...]:
        """The counters of :data:`COUNTERS` for this process's role, now."""
        self.proc.send_signal(signal.SIGUSR1)
        return await asyncio.wait_for(self.stats.get(), 10)


async def _spawn(  # noqa: PLR0917 (the child's role, arguments and where it reports)
    role: str, args: list[str], tmp: Path, name: str, tracker: _Tracker, env: dict[str, str]
) -> _Child:
    out, err = tmp / f"{name}.json", (tmp / f"{name}.err").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.fleet_proc", role, *args,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=err, env=env,
    )  # fmt: skip
    err.close()
    child = _Child(role, proc, out)
    child.reader = asyncio.get_running_loop().create_task(child.read(tracker))
    return child


def _stderr_tails(children: list[_Child]) -> str:
    tails = []
    for child in children:
        with contextlib.suppress(OSError):
            tail = child.out.with_suffix(".err").read_text(errors="replace").strip()[-1500:]
            if tail:
                tails.append(f"{child.role} pid {child.proc.pid}: {tail}")
    return " | ".join(tails) or "(none)"


async def _await_all(children: list[_Child], what: str, timeout_s: float) -> None:
    events = [getattr(c, what) for c in children]
    try:
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), timeout_s)
    except TimeoutError:
        late = [c for c, e in zip(children, events, strict=True) if not e.is_set()]
        reasons = []
        for c in late:
            tail = (c.out.with_suffix(".err")).read_text(errors="replace")[-1500:]
            reasons.append(f"{c.role} pid {c.proc.pid} (exit {c.proc.returncode}): {tail}")
        raise RuntimeError(
            f"{len(late)} fleet processes not {what}: " + " | ".join(reasons)
        ) from None


@contextlib.asynccontextmanager
async def _fleet(
    store_url: str,
    transport_url: str,
    engines: int,
    workers: int,
    slots: int,
    *,
    tracker: _Tracker,
    tmp: Path,
    env: dict[str, str],
) -> AsyncIterator[list[_Child]]:
    spawned = [
        _spawn("worker", [transport_url, str(tmp / f"w{i}.json"), f"w{i}", str(slots)], tmp,
               f"w{i}", tracker, env)
        for i in range(workers)
    ] + [
        _spawn("engine", [store_url, transport_url, str(tmp / f"e{i}.json")], tmp, f"e{i}",
               tracker, env)
        for i in range(1, engines)
    ]  # fmt: skip
    children = list(await asyncio.gather(*spawned))
    try:
        await _await_all(children, "ready", 60)
        yield children
    finally:
        for child in children:
            if child.proc.returncode is None:
                child.proc.terminate()
        for child in children:
            try:
                await asyncio.wait_for(child.proc.wait(), 15)
            except TimeoutError:
                child.proc.kill()
                await child.proc.wait()
            if child.reader is not None:
                await child.reader


def _worker_stamps(children: list[_Child], tracker: _Tracker) -> None:
    for child in children:
        if child.role != "worker":
            continue
        doc = json.loads(child.out.read_text())
        for what, stamps in (("start", tracker.start), ("end", tracker.end)):
            for key, t in doc[what].items():
                run_id, stage = key.split(" ")
                stamps[(run_id, stage)] = min(t, stamps.get((run_id, stage), t))


def _declared(children: list[_Child]) -> set[str]:
    names: set[str] = set()
    for child in children:
        with contextlib.suppress(OSError, ValueError):
            names.update(json.loads(child.out.read_text()).get("declared", ()))
    return names


@dataclass(frozen=True)
class Workload:
    """What the runs are: the plan, what their context holds besides ``modelId``, the catalog
    the engine checks contexts with, and the sealing key of every fleet process (``None``: none;
    :mod:`bench.bench_sealing`)."""

    plan: Plan = PLAN
    context: dict[str, Any] = field(default_factory=dict)
    catalog: MessageCatalog | None = None
    sealing: tuple[str, bytes] | None = None

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in (SEALING_KEY_ENV, SEALING_KEYS_ENV)}
        if self.sealing is not None:
            env[SEALING_KEY_ENV] = f"{self.sealing[0]}:{base64.b64encode(self.sealing[1]).decode()}"
        return env


PLAIN = Workload()


async def _warm_up(
    engine: Engine, tracker: _Tracker, workers: list[_Child], slots: int, load: Workload
) -> None:
    """Start batches of runs until every worker has received a job (and the batches finished)."""
    deadline = time.monotonic() + 30
    batch = 0
    while not all(w.warm.is_set() for w in workers):
        if time.monotonic() > deadline:
            raise RuntimeError("a worker received no job in 30 s of warm-up runs")
        runs = [
            await engine.start_run(load.plan.name, {"modelId": f"warm{batch}-{i}"} | load.context)
            for i in range(2 * slots * len(workers))
        ]
        await tracker.wait(runs, 60)
        batch += 1


async def _await_shards(
    engine: Engine, children: list[_Child], timeout_s: float = SHARDS_SETTLE_S
) -> int:
    """Wait until the store's shard leases show every shard held, unexpired, by the engine the
    engines' own assignment (:func:`~accord.engine.runtime.shards.assign` over every engine of
    the fleet) gives it, and this process's engine owns its share: from then on no shard
    changes hands while every engine lives. Returns the store's shard count (0: a store without
    shard leases, whose engines all take every run)."""
    store = engine.store
    if not isinstance(store, Shards):
        return 0
    owners = [engine.owner] + [c.owner or "" for c in children if c.role == "engine"]
    if "" in owners:
        raise RuntimeError("an engine process said `ready` without its owner id")
    wanted = assign(store.shard_count, owners)
    if not all(wanted.get(owner) for owner in owners):
        raise RuntimeError(f"{len(owners)} engines over {store.shard_count} shards: some own none")
    expected = {shard: owner for owner, shards in wanted.items() for shard in shards}
    deadline = time.monotonic() + timeout_s
    while True:
        now = engine.clock.now_ms()
        held = {lease.shard: lease.owner for lease in await store.shard_leases()
                if lease.expires_at_ms > now}  # fmt: skip
        if held == expected and set(engine.shards.owned) == wanted[engine.owner]:
            return store.shard_count
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"shards not settled in {timeout_s:.0f} s: held {held}, expected {expected}"
            )
        await asyncio.sleep(0.1)


async def _snapshot(
    engine: Engine, children: list[_Child], beam: int | None, postgres: bool = False
) -> dict[str, float]:
    """CPU seconds of every fleet process (and of the servers) and the engines' counters, now."""
    own = (engine.transitions, engine.conflicts, engine.ownership_lost, engine.shards.gained)
    snap = {name: float(v) for name, v in zip(ENGINE_COUNTERS, own, strict=True)}
    snap |= {"outcomes": 0.0, "outcome_messages": 0.0}
    for child in children:
        values = await child.counters()
        for name, value in zip(COUNTERS[child.role], values, strict=True):
            snap[name] += value
    snap["engine"] = time.process_time()
    for child in children:
        snap[child.role] = snap.get(child.role, 0.0) + _proc_cpu_s(child.proc.pid)
    redis_cpu = _redis_cpu_s()
    if redis_cpu is not None:
        snap["redis"] = redis_cpu
    if beam is not None:
        snap["rabbitmq"] = _proc_cpu_s(beam)
    if postgres:
        snap["postgres"] = _postgres_cpu_s()
    return snap


async def _phases(
    engine: Engine,
    tracker: _Tracker,
    children: list[_Child],
    broker: str,
    *,
    n: int,
    singles: int,
    slots: int,
    load: Workload = PLAIN,
    lag: fleet_lag.LagWatch | None = None,
) -> dict[str, Any]:
    """Settle the shards, warm up, then the throughput phase and the one-run-at-a-time phase."""
    shards = await _await_shards(engine, children)
    await _warm_up(engine, tracker, [c for c in children if c.role == "worker"], slots, load)
    if lag is not None:
        lag.mark()
    beam = _beam_pid() if broker == "rabbitmq" else None
    before = await _snapshot(engine, children, beam, broker == "postgres")
    t0 = time.perf_counter()
    runs = [await engine.start_run(load.plan.name, {"modelId": f"m{i}"} | load.context)
            for i in range(n)]  # fmt: skip
    await tracker.wait(runs, 300)
    elapsed = time.perf_counter() - t0
    after = await _snapshot(engine, children, beam, broker == "postgres")
    used = {key: after[key] - before[key] for key in after if key in before}
    lagged = {} if lag is None else await lag.figures(runs, tracker.done)
    single, alone = await tracker.one_at_a_time(engine, singles)
    fleet_cpu = used["engine"] + used.get("worker", 0.0)
    servers = [server for server in ("redis", "rabbitmq", "postgres")
               if server in used and (server != "redis" or broker != "postgres")]  # fmt: skip
    total_cpu = fleet_cpu + sum(used[server] for server in servers)
    figures: dict[str, Any] = {
        "runs_per_s": round(n / elapsed, 1),
        "transitions_per_s": round(used["transitions"] / elapsed, 1),
        "transitions_per_run": round(used["transitions"] / n, 2),
        "conflicts": int(used["conflicts"]),
        "conflicts_per_run": round(used["conflicts"] / n, 4),
        "ownership_lost_per_run": round(used["ownership_lost"] / n, 4),
        "shards": shards,
        "shards_moved": int(used["shards_gained"]),
        "single_run_p50_ms": round(statistics.median(single), 3) if single else math.nan,
        "cpu_ms_per_run": round(fleet_cpu * 1000 / n, 3),
        "engine_cpu_ms_per_run": round(used["engine"] * 1000 / n, 3),
        "workers_cpu_ms_per_run": round(used.get("worker", 0.0) * 1000 / n, 3),
        # how many outcomes a broker message carried (accord.worker.batching)
        "outcomes_per_message": round(used["outcomes"] / max(used["outcome_messages"], 1), 2),
        "total_cpu_ms_per_run": round(total_cpu * 1000 / n, 3),
    }
    for server in servers:
        figures[f"{server}_cpu_ms_per_run"] = round(used[server] * 1000 / n, 3)
    return {"figures": figures | lagged, "runs": runs, "alone": alone}


async def _configuration(  # noqa: PLR0917 (the configuration's dimensions, then its sizes)
    broker: str,
    engines: int,
    workers: int,
    slots: int,
    n: int,
    singles: int,
    load: Workload = PLAIN,
) -> dict[str, Any]:
    """One configuration measured: ``engines`` engine processes (this one included) and
    ``workers`` worker processes of ``slots`` task slots each over fresh prefixes of ``broker``."""
    declared: set[str] = set()
    tracker = _Tracker()
    load_start = os.getloadavg()[0]
    lag = fleet_lag.watch()  # the projector's lag too, with ACCORD_BENCH_FLEET_LAG=1
    async with keyspace(broker, declared) as (store_url, transport_url):
        engine = open_engine(
            store_url,
            transport_url,
            SystemClock(),
            options=EngineOptions(poll_ms=20),
            observers=[tracker.transition],
            catalog=load.catalog,
            sealing=None if load.sealing is None else Keyring(load.sealing),
            sink=None if lag is None else lag.sink,
        )
        if lag is not None:
            lag.attach(engine)
        await engine.register_plan(PLAN)  # the one-at-a-time phase runs it
        if load.plan is not PLAN:
            await engine.register_plan(load.plan)
        await engine.start()
        gc.collect()
        gc.freeze()
        try:
            with tempfile.TemporaryDirectory(prefix="accord-fleet-") as tmpdir:
                tmp = Path(tmpdir)
                async with _fleet(
                    store_url, transport_url, engines, workers, slots, tracker=tracker, tmp=tmp,
                    env=load.env(),
                ) as children:  # fmt: skip
                    try:
                        measured = await _phases(
                            engine, tracker, children, broker, n=n, singles=singles, slots=slots,
                            load=load, lag=lag,
                        )  # fmt: skip
                    except TimeoutError as exc:  # with what the fleet processes had to say
                        raise TimeoutError(f"{exc}; stderr: {_stderr_tails(children)}") from exc
                _worker_stamps(children, tracker)
                declared |= _declared(children)
        finally:
            declared.update(getattr(engine.transport, "declared", ()))
            await engine.stop()
            gc.unfreeze()
            if lag is not None:
                await lag.close()
    hops, idle_hops = tracker.hops(measured["runs"]), tracker.hops(measured["alone"])
    figures: dict[str, Any] = measured["figures"]
    figures |= {
        "hop_p50_ms": round(_pct(hops, 0.5), 3),
        "hop_p99_ms": round(_pct(hops, 0.99), 3),
        "hop_p50_ms_single_run": round(_pct(idle_hops, 0.5), 3),
        "hop_p99_ms_single_run": round(_pct(idle_hops, 0.99), 3),
        "load_average_start": round(load_start, 2),
        "load_average_end": round(os.getloadavg()[0], 2),
    }
    return figures


def label(engines: int, workers: int, slots: int) -> str:
    return f"e{engines}w{workers}s{slots}"


def plan(smoke: bool) -> dict[str, list[tuple[int, int, int]]]:
    """Configurations per broker, the default first, then the variants and the broker's
    :data:`SCALING` ones: ``ACCORD_BENCH_FLEET`` (for instance ``bullmq:1x2,2x2x4;rabbitmq:1x3``,
    engines × workers [× slots, 8 when left out]) overrides them."""
    chosen = os.environ.get("ACCORD_BENCH_FLEET")
    if chosen:
        picks = dict(part.split(":") for part in chosen.split(";"))
        return {
            broker: [_config(c) for c in configs.split(",")] for broker, configs in picks.items()
        }
    return {
        broker: [default]
        + ([] if smoke else [v for v in (*VARIANTS, *SCALING.get(broker, ())) if v != default])
        for broker, default in DEFAULT.items()
    }


def _config(text: str) -> tuple[int, int, int]:
    engines, workers, *slots = (int(part) for part in text.split("x"))
    return engines, workers, slots[0] if slots else 8


def run(smoke: bool) -> dict[str, Any]:
    n, singles = (20, 3) if smoke else (1000, 30)
    out: dict[str, Any] = {"load_average_start": round(os.getloadavg()[0], 2)}
    for broker, ((engines, workers, slots), *tried) in plan(smoke).items():
        figures = run_loop(_configuration(broker, engines, workers, slots, n, singles))
        figures |= {"engines": engines, "workers": workers, "slots": slots}
        variants = {label(*c): run_loop(_configuration(broker, *c, n, singles)) for c in tried}
        out[broker] = figures | ({"variants": variants} if variants else {})
    out["load_average_end"] = round(os.getloadavg()[0], 2)
    return out


if __name__ == "__main__":
    print(json.dumps(run(smoke="--smoke" in sys.argv), indent=2))
