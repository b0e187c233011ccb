"""What sealing sensitive fields at rest costs the fleet, in CPU per run.

The fleet of :mod:`bench.bench_fleet` (this process's engine, one worker process of 8 slots,
Redis + BullMQ) runs a variant of its plan whose context carries a sensitive
``storageConnectionRef`` (by a small catalog: ``bench-context@1`` marks it sensitive), bound into
every task's request, and whose no-op handlers hand it back in a result field the result
contracts mark sensitive. So, with a key, each run has its context sealed at start (one
AES-256-GCM seal), each of its 4 jobs carries the token and the worker opens it (4 opens), and
each result comes back in clear and is sealed where the engine commits it (4 seals); without a
key the same runs carry the same values in clear. Both arms check the context against the same
contract, so the difference is the sealing alone.

The arms run in ABBA order (off, on, on, off), each a fresh fleet on fresh prefixes, so a drift
of the machine over the four shows as a difference between the two ``off`` (or the two ``on``)
figures rather than as a cost. Figures: ``cpu_ms_per_run`` (engine + worker processes, as in
:mod:`bench.bench_fleet`) and its engine and worker parts per arm, their means per setting, and
``overhead_pct``: how much more fleet CPU a run takes sealed (the goal is under 5 %). On a busy
machine the fleet figures drift by more than that between arms, so ``sealing_us_per_run`` also
measures the sealing work of one run alone (1 seal, 4 opens, 4 seals, on one core) and
``sealing_pct_of_off`` puts it against the ``off`` fleet CPU per run.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Mapping
from typing import Any

from accord.contracts.model import FieldSpec, MessageContract
from accord.contracts.sealing import Keyring, open_all, seal_fields
from accord.loop import run as run_loop
from accord.workflow.plan import Binding, Plan, TaskStage
from bench.bench_engine import PLAN
from bench.bench_fleet import Workload, _configuration

CONTEXT = "bench-context@1"
ORDER = ("off", "on", "on", "off")
FIGURES = ("cpu_ms_per_run", "engine_cpu_ms_per_run", "workers_cpu_ms_per_run", "runs_per_s")


class _Catalog:
    """The few message contracts the sealed plan names (a ``MessageCatalog``)."""

    def __init__(self, contracts: Mapping[str, MessageContract]) -> None:
        self._contracts = dict(contracts)

    def message(self, ref: str) -> MessageContract | None:
        return self._contracts.get(ref)

    def messages(self) -> list[MessageContract]:
        return list(self._contracts.values())


def _message(ref: str, fields: Mapping[str, FieldSpec]) -> MessageContract:
    name, _, version = ref.rpartition("@")
    return MessageContract(name=name, wire_version=int(version), owner="bench", payload=fields)


def sealed_workload(key: tuple[str, bytes] | None) -> Workload:
    """The benchmark plan with a sensitive ``storageConnectionRef`` bound into every task."""
    ref = Binding(
        source="context", path=("storageConnectionRef",), raw="${context.storageConnectionRef}"
    )
    stages = tuple(
        dataclasses.replace(s, input={**s.input, "storageConnectionRef": ref})
        if isinstance(s, TaskStage)
        else s
        for s in PLAN.stages
    )
    plan = Plan.create(
        name="bench-sealed",
        version="1.0.0",
        entry=PLAN.entry,
        stages=stages,
        context_contract=CONTEXT,
    )
    secret = FieldSpec("string", sensitive=True, max_length=256)
    contracts = {
        CONTEXT: _message(CONTEXT, {"modelId": FieldSpec("string", required=True),
                                    "storageConnectionRef": secret}),
    } | {
        s.capability.result: _message(s.capability.result, {"ref": secret})
        for s in stages
        if isinstance(s, TaskStage)
    }  # fmt: skip
    context = {"storageConnectionRef": "s3://bench-bucket/tenants/acme?role=reader&token=x1"}
    return Workload(plan, context, _Catalog(contracts), key)


def sealing_us_per_run(load: Workload, repeat: int = 2000) -> float:
    """The sealing work of one run measured alone (µs): its context sealed, each task's request
    opened (the worker) and each result sealed (the engine) — what the fleet's figures differ by
    apart from the longer tokens' bytes, measured without the fleet's noise."""
    assert load.sealing is not None and load.catalog is not None
    keys = Keyring(load.sealing)
    context_contract = load.catalog.message(CONTEXT)
    tasks = [s for s in load.plan.stages if isinstance(s, TaskStage)]
    results = [load.catalog.message(s.capability.result) for s in tasks]
    context = {"modelId": "m1"} | load.context

    def one() -> None:
        sealed = seal_fields(context_contract, context, keys)
        for result in results:
            request = {"modelId": "m1", "storageConnectionRef": sealed["storageConnectionRef"]}
            opened = open_all(request, keys)
            seal_fields(result, {"ref": opened["storageConnectionRef"]}, keys)

    one()
    began = time.process_time()
    for _ in range(repeat):
        one()
    return (time.process_time() - began) * 1e6 / repeat


def run(smoke: bool) -> dict[str, Any]:
    n, singles = (20, 0) if smoke else (1000, 0)
    key = ("bench", Keyring.generate_key())
    arms: list[dict[str, Any]] = []
    for setting in ORDER:
        load = sealed_workload(key if setting == "on" else None)
        figures = run_loop(_configuration("bullmq", 1, 1, 8, n, singles, load))
        arms.append({"sealing": setting} | {k: figures[k] for k in FIGURES})
    out: dict[str, Any] = {"order": " ".join(ORDER), "runs_per_arm": n}
    for setting in ("off", "on"):
        mine = [a for a in arms if a["sealing"] == setting]
        out[setting] = {k: round(statistics.fmean(a[k] for a in mine), 3) for k in FIGURES}
    off, on = out["off"]["cpu_ms_per_run"], out["on"]["cpu_ms_per_run"]
    out["overhead_pct"] = round((on - off) * 100 / off, 2) if off else float("nan")
    work = sealing_us_per_run(sealed_workload(key))
    out["sealing_us_per_run"] = round(work, 2)  # the sealing work itself, on one core
    out["sealing_pct_of_off"] = round(work / 10 / off, 2) if off else float("nan")
    out["arms"] = {f"{i + 1}-{a['sealing']}": a for i, a in enumerate(arms)}
    return out


if __name__ == "__main__":
    print(json.dumps(run(smoke="--smoke" in sys.argv), indent=2))
