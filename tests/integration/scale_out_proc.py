"""The scale-out soak's child programs: ``python scale_out_proc.py engine|worker ARGS``.

``engine STORE TRANSPORT PLAN_JSON OWNER COUNT RUN_PREFIX GO_FILE [SHARD_LEASE_MS]`` — an engine
process (``accord.adapters.open_engine`` with the no-op platform actions), which registers the
compiled plan, starts, prints ``ready``, waits for ``GO_FILE`` to exist, starts ``COUNT`` runs with
ids ``run_<RUN_PREFIX><n>`` and then serves until SIGTERM, when it stops gracefully and prints its
counters (commits, conflicts, shard changes, commits refused for ownership lost, commits of
existing runs made without a shard fence) as one JSON line.
Its shard transitions (``took shard(s)``, ``lost shard``, lapsed leases) are logged to stderr with
a wall-clock time, so a fault test can read when each happened.

``worker TRANSPORT MARKS_REDIS MARKS_PREFIX SEED STATE_DIR SLOTS`` — a worker process: the Worker
SDK runtime serving the no-op worker over a :class:`FaultyTransport`. Its acceptance records live
in a file of its own incarnation: a killed worker's records die with it, as on a replaced machine.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path

from scale_out_support import FaultyTransport, noop_actions, noop_worker

from accord.adapters import open_engine, open_transport
from accord.engine.ports import Commit, Shards, Store, shard_of
from accord.engine.runtime.orchestrator import EngineOptions
from accord.loop import run as run_loop
from accord.worker.acceptance import AcceptanceLog
from accord.worker.runtime import Runtime
from accord.workflow.plan import Plan


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def _count_unfenced(store: Store) -> list[int]:
    """Count (and log, with the time) the commits of existing runs made without a shard fence:
    with shards, each should carry its owner's lease, so one without shows a commit made by an
    engine that did not own the run's shard when it committed (protected only by the version)."""
    count, commit = [0], store.commit
    shards = store.shard_count if isinstance(store, Shards) else 1
    log = logging.getLogger("scale_out.commits")

    async def counted(change: Commit) -> int:
        if change.fence is None and change.expected_version > 0 and shards > 1:
            count[0] += 1
            log.warning("unfenced commit of %s (shard %d) at version %d", change.run_id,
                        shard_of(change.run_id, shards), change.expected_version)  # fmt: skip
        return await commit(change)

    setattr(store, "commit", counted)  # noqa: B010 - a spy on the instance, not the class
    return count


async def engine_main(  # noqa: PLR0917 - one positional per command-line argument
    store: str,
    transport: str,
    plan_path: str,
    owner: str,
    count: str,
    prefix: str,
    go: str,
    shard_lease_ms: str = "10000",
) -> None:
    logging.basicConfig(format="%(created).3f %(name)s %(levelname)s %(message)s")
    logging.getLogger("accord.engine.shards").setLevel(logging.INFO)
    stop = _stop_on_signals()
    plan = Plan.from_json(json.loads(Path(plan_path).read_text()))
    options = EngineOptions(owner=owner, poll_ms=20, shard_lease_ms=int(shard_lease_ms))
    engine = open_engine(store, transport, options=options, actions=noop_actions())
    unfenced = _count_unfenced(engine.store)
    await engine.register_plan(plan)
    await engine.start()
    print("ready", flush=True)
    while not Path(go).exists() and not stop.is_set():
        await asyncio.sleep(0.01)
    run_ids = [f"run_{prefix}{n:05d}" for n in range(int(count))]
    for n in range(0, len(run_ids), 25):  # a few at a time: intake keeps flowing meanwhile
        batch = run_ids[n : n + 25]
        await asyncio.gather(
            *(engine.start_run(plan.name, {"modelId": f"m-{r}"}, run_id=r) for r in batch)
        )
    await stop.wait()
    await engine.stop()
    keeper = engine.shards
    stats = {
        "owner": engine.owner,
        "transitions": engine.transitions,
        "commits": engine.commits,
        "conflicts": engine.conflicts,
        "ownership_lost": engine.ownership_lost,
        "shards_gained": keeper.gained,
        "shards_lost_leases": keeper.lost_leases,
        "shards_handed_over": keeper.handed_over,
        "unfenced_commits": unfenced[0],
    }
    print(json.dumps(stats), flush=True)


async def worker_main(  # noqa: PLR0917
    transport: str, marks_redis: str, marks: str, seed: str, state: str, slots: str
) -> None:
    stop = _stop_on_signals()
    port = FaultyTransport(open_transport(transport), marks_redis, marks, int(seed))
    log = AcceptanceLog(Path(state) / f"soak-{os.getpid()}.acceptance.db")
    runtime = Runtime(noop_worker(), port, acceptance=log, slots=int(slots))
    print("ready", flush=True)
    try:
        await runtime.run(stop)
    finally:
        await port.close()
        log.close()
    print(json.dumps(runtime.stats), flush=True)


if __name__ == "__main__":
    role, args = sys.argv[1], sys.argv[2:]
    # the loop `accord engine run` and `accord worker run` pick (uvloop where installed)
    run_loop(engine_main(*args) if role == "engine" else worker_main(*args))
