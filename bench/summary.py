"""Targets and ratios: Accord's headline figures next to the best peer, the limits and the targets.

Pure functions over the ``results`` mapping that ``python -m bench`` builds (each benchmark's
figures flattened to dotted keys, each a ``{"median", "min", "max", "n"}`` or ``{"value"}``).
Keys are looked up tolerantly: the modules that produce them evolve, so every lookup takes
candidate keys in order and a figure that is absent shows as ``n/a`` rather than failing.

For each headline row: the Accord value, the best peer's (highest runs/s, lowest latency, CPU
or memory; peers that failed are left out of "best" but listed in the peer table with their
reason), ``vs best peer`` as an advantage factor (> 1 means Accord is ahead, whichever way the
figure points), ``vs limit`` as the fraction of the physical limit reached, and the project's
performance target as ``met`` / ``not met`` / ``n/a``. The distributed rows' runs/s target is
twice Celery's runs/s measured in the same run, so it moves with the machine as Celery's figure
does; 275 runs/s (twice the 137 Celery first did on this machine) when Celery's figure is
missing. The engine-scaling rows take the fleet's configurations with 1, 2 and 4 engine
processes and the default's workers (``e1w1s8``, ``e2w1s8``, ``e4w1s8``): conflicts per run below
0.01 with each, engine CPU per run (summed over the engine processes) not growing with the
engines (the larger of e2 ÷ e1 and e4 ÷ e1 at most 1.10, noise allowed for), and every store's
CPU per run (for the distributed ones every fleet process and server together) at most 5 ms.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

PEERS = ("celery", "temporal", "dbos")
FLEET_BACKENDS = ("bullmq", "rabbitmq", "postgres")
HIGHER, LOWER = "higher", "lower"
SCALED_ENGINES = (1, 2, 4)  # the engine processes of the scaling rows
ENGINE_CPU_GROWTH = (
    1.10  # engine CPU per run with more engines ÷ with one: "not growing", noise aside
)
CONFIG = re.compile(r"e(\d+)w(\d+)s(\d+)")


def figure(results: dict[str, Any], bench: str, *keys: str) -> float | None:
    """The median (or plain numeric value) of the first key present in a benchmark's figures."""
    figures = results.get("benchmarks", {}).get(bench, {}).get("figures", {})
    for key in keys:
        stats = figures.get(key)
        if not isinstance(stats, dict):
            continue
        value = stats.get("median", stats.get("value"))
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None


def text(results: dict[str, Any], bench: str, key: str) -> str | None:
    stats = results.get("benchmarks", {}).get(bench, {}).get("figures", {}).get(key)
    return None if not isinstance(stats, dict) or "value" not in stats else str(stats["value"])


def peer_ok(results: dict[str, Any], peer: str) -> bool:
    return text(results, "peers", f"{peer}.status") == "ok"


def peer_figure(results: dict[str, Any], peer: str, key: str) -> float | None:
    """A peer's figure; ``{n}`` in the key is the first throughput batch (200, or 20 in smoke)."""
    return figure(results, "peers", *(f"{peer}.{key}".format(n=n) for n in (200, 20)))


def best_peer(results: dict[str, Any], key: str, better: str) -> tuple[str, float] | None:
    found = [
        (peer, value)
        for peer in PEERS
        if peer_ok(results, peer) and (value := peer_figure(results, peer, key))
    ]
    if not found:
        return None
    pick = max if better == HIGHER else min
    return pick(found, key=lambda pair: pair[1])


def advantage(value: float | None, other: float | None, better: str) -> float | None:
    """How far Accord is ahead: > 1 ahead, < 1 behind, whichever way the figure points."""
    if value is None or other is None or value <= 0 or other <= 0:
        return None
    return value / other if better == HIGHER else other / value


def status(value: float | None, op: str, threshold: float | None) -> str:
    if value is None or threshold is None:
        return "n/a"
    if op == ">=":
        ok = value >= threshold
    else:
        ok = value < threshold if op == "<" else value <= threshold
    return "met" if ok else "not met"


@dataclass(frozen=True)
class Row:
    name: str
    unit: str
    value: float | None
    better: str
    peer: tuple[str, float] | None = None
    limit: tuple[str, float] | None = None  # (label, the limit in the row's unit)
    target: tuple[str, float | None] | None = None  # (op, threshold)

    @property
    def vs_peer(self) -> float | None:
        return advantage(self.value, self.peer[1] if self.peer else None, self.better)

    @property
    def vs_limit(self) -> float | None:
        """Fraction of the limit reached (1.0 = at the limit)."""
        return advantage(self.value, self.limit[1] if self.limit else None, self.better)

    @property
    def met(self) -> str:
        return "" if self.target is None else status(self.value, *self.target)


def deployed(r: dict[str, Any], backend: str, key: str) -> float | None:
    """A backend's figure as deployed: for the distributed ones the fleet benchmark's default
    configuration (engine and worker processes apart), else the in-process engine benchmark's."""
    fleet = figure(r, "fleet", f"{backend}.{key}") if backend in FLEET_BACKENDS else None
    if fleet is not None:
        return fleet
    return figure(r, "engine", *(f"{k}.{key}" for k in (backend, f"redis_{backend}")))


def _per_ms(rate: float | None) -> float | None:
    return 1000 / rate if rate else None


def rows(r: dict[str, Any]) -> list[Row]:
    """The headline rows, in the order of the targets."""
    fsync_tx, redis_cas = (
        figure(r, "limits", "sqlite_tx.FULL"),
        figure(r, "limits", "redis_cas.one_task"),
    )
    redis_many = figure(r, "limits", "redis_cas.many_tasks")
    celery = peer_figure(r, "celery", "throughput.{n}.runs_per_s") if peer_ok(r, "celery") else None
    runs_peer = best_peer(r, "throughput.{n}.runs_per_s", HIGHER)
    hop_peer = best_peer(r, "latency.hop_p50_ms", LOWER)
    out: list[Row] = []
    for label, key, tx_limit, hop_limit, goal, goal_hop in (
        ("memory + embedded queue", "memory", None, None, None, None),
        ("SQLite (WAL FULL) + embedded queue", "sqlite", fsync_tx, _per_ms(fsync_tx), 500.0, 1.0),
        ("Redis + BullMQ", "bullmq", redis_many, _per_ms(redis_cas), None, 2.5),
        ("Redis + RabbitMQ", "rabbitmq", redis_many, _per_ms(redis_cas), None, 2.5),
    ):
        runs = deployed(r, key, "runs_per_s")
        tps = deployed(r, key, "transitions_per_s")
        hop = deployed(r, key, "hop_p50_ms_single_run") or deployed(r, key, "hop_p50_ms")
        # twice Celery's runs/s measured in the same run; 275 (2 × 137) when it is missing
        goal_runs = (2 * celery if celery else 275.0) if key in ("bullmq", "rabbitmq") else goal
        limit_runs = tx_limit * runs / tps if tx_limit and runs and tps else None
        out.append(Row(f"{label}: runs/s", "runs/s", runs, HIGHER, runs_peer,
                       ("transactions/s ÷ transitions/run", limit_runs) if limit_runs else None,
                       (">=", goal_runs) if goal_runs or key != "memory" else None))  # fmt: skip
        out.append(Row(f"{label}: per-hop p50", "ms", hop, LOWER, hop_peer,
                       ("one durable write", hop_limit) if hop_limit else None,
                       ("<=", goal_hop) if goal_hop else None))  # fmt: skip
    for key, unit, name, goal in (
        ("cpu_ms_per_run", "ms", "CPU per run (SQLite)", 5.0),
        ("rss_mib", "MiB", "engine RSS (SQLite)", 100.0),
    ):
        peer_key = "throughput.{n}.cpu_ms_per_run" if key == "cpu_ms_per_run" else key
        value = figure(r, "engine", f"sqlite.{key}")
        out.append(Row(name, unit, value, LOWER, best_peer(r, peer_key, LOWER), None, ("<=", goal)))
    out += scaling_rows(r)
    # sealing sensitive fields at rest (bench_sealing): the fleet's ABBA difference, and the
    # sealing work of one run measured alone against the same unsealed fleet CPU per run
    sealed = figure(r, "sealing", "overhead_pct")
    alone = figure(r, "sealing", "sealing_pct_of_off")
    out.append(Row("sealing: extra fleet CPU per run (Redis + BullMQ, ABBA)", "%", sealed, LOWER,
                   None, None, ("<=", 5.0)))  # fmt: skip
    out.append(Row("sealing: its work alone, of the fleet CPU per run", "%", alone, LOWER,
                   None, None, ("<=", 5.0)))  # fmt: skip
    contracts = ("thumbnail-generation-request@2", "technical-metadata@1")
    valid = [figure(r, "validation", f"{c}.accord.valid_us") for c in contracts]
    floor = [figure(r, "validation", f"{c}.engine_floor_us") for c in contracts]
    worst = max((v for v in valid if v is not None), default=None)
    floor_worst = max((v for v in floor if v is not None), default=None)
    floor_row = ("jsonschema-rs alone", floor_worst) if floor_worst else None
    name = "validation, valid message (slowest contract)"
    out.append(Row(name, "µs", worst, LOWER, None, floor_row, ("<=", 2.0)))
    compile_ms = figure(r, "compile", "compile_ms.1000")
    out.append(Row("compile, 1,000 stages", "ms", compile_ms, LOWER, None, None, ("<=", 200.0)))
    queue, raw = figure(r, "limits", "queue.embedded"), figure(r, "limits", "queue.raw_sqlite")
    out.append(Row("embedded queue publish+consume", "msg/s", queue, HIGHER, None,
                   ("raw SQLite queue", raw) if raw else None))  # fmt: skip
    return out


FLEET_LABELS = {"bullmq": "Redis + BullMQ", "rabbitmq": "Redis + RabbitMQ",
                "postgres": "PostgreSQL + its queue"}  # fmt: skip


def scaling_configs(r: dict[str, Any], broker: str) -> dict[int, str]:
    """``engines → key prefix`` of ``broker``'s fleet configurations with the default's workers
    and slots and 1, 2 or 4 engines (:data:`SCALED_ENGINES`)."""
    found: dict[int, str] = {}
    configs = fleet_configs(r, broker)
    default = CONFIG.match(configs[0][0]) if configs else None
    if default is None:
        return found
    for label, prefix in configs:
        match = CONFIG.match(label)
        if match and match.group(2, 3) == default.group(2, 3):
            engines = int(match.group(1))
            if engines in SCALED_ENGINES:
                found.setdefault(engines, prefix)
    return found


def scaling_rows(r: dict[str, Any]) -> list[Row]:
    """Per distributed store: conflicts per run with 1, 2 and 4 engine processes, how engine CPU
    per run grows with them, and the CPU per run of the whole fleet with its servers."""
    out: list[Row] = []
    for broker in FLEET_BACKENDS:
        label = FLEET_LABELS[broker]
        configs = scaling_configs(r, broker)
        if broker != "postgres":  # the engine-scaling goals are the Redis stores'
            for engines in SCALED_ENGINES:
                prefix = configs.get(engines)
                value = (
                    None if prefix is None else figure(r, "fleet", f"{prefix}.conflicts_per_run")
                )
                out.append(Row(f"{label}: conflicts per run, {engines} engine process"
                               + ("es" if engines > 1 else ""), "", value, LOWER, None, None,
                               ("<", 0.01)))  # fmt: skip
            one = (
                figure(r, "fleet", f"{configs[1]}.engine_cpu_ms_per_run") if 1 in configs else None
            )
            growth = [
                cpu / one
                for engines, prefix in configs.items()
                if engines > 1 and one
                and (cpu := figure(r, "fleet", f"{prefix}.engine_cpu_ms_per_run")) is not None
            ]  # fmt: skip
            out.append(Row(f"{label}: engine CPU per run, most engines ÷ one (largest of e2, e4)",
                           "×", max(growth, default=None), LOWER, None, None,
                           ("<=", ENGINE_CPU_GROWTH)))  # fmt: skip
        total = figure(r, "fleet", f"{broker}.total_cpu_ms_per_run")
        if total is not None or broker != "postgres":
            out.append(Row(f"CPU per run ({label}, every fleet process and server)", "ms", total,
                           LOWER, None, None, ("<=", 5.0)))  # fmt: skip
    return out


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "n/a"
    digits = 3 if abs(value) < 10 else 1 if abs(value) < 1000 else 0
    return f"{value:,.{digits}f}{(' ' + unit) if unit else ''}"


def _factor(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}×"


def peer_table(r: dict[str, Any]) -> list[str]:
    lines = ["| peer | status | runs/s (200) | runs/s (1000) | transitions/s (200) | hop p50 ms"
             " | hop p99 ms | e2e p50 ms | CPU ms/run | RSS MiB |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for peer in PEERS:
        state = text(r, "peers", f"{peer}.status") or "not run"
        version = text(r, "peers", f"{peer}.version") or ""
        keys = ("throughput.{n}.runs_per_s", "throughput.1000.runs_per_s",
                "throughput.{n}.transitions_per_s", "latency.hop_p50_ms", "latency.hop_p99_ms",
                "latency.e2e_p50_ms", "throughput.{n}.cpu_ms_per_run", "rss_mib")  # fmt: skip
        cells = [_num(peer_figure(r, peer, k)) for k in keys]
        state = state.replace("|", "\\|").replace("\n", " ⏎ ")
        lines.append(f"| {peer} {version} | {state} | " + " | ".join(cells) + " |")
    return lines


FLEET_COLUMNS = (
    ("runs/s", "runs_per_s"),
    ("hop p50 ms", "hop_p50_ms"),
    ("hop p99 ms", "hop_p99_ms"),
    ("hop p50 ms (1 run)", "hop_p50_ms_single_run"),
    ("hop p99 ms (1 run)", "hop_p99_ms_single_run"),
    ("CPU ms/run (fleet)", "cpu_ms_per_run"),
    ("engine", "engine_cpu_ms_per_run"),
    ("workers", "workers_cpu_ms_per_run"),
    ("Redis", "redis_cpu_ms_per_run"),
    ("RabbitMQ", "rabbitmq_cpu_ms_per_run"),
    ("PostgreSQL", "postgres_cpu_ms_per_run"),
    ("CPU ms/run (all)", "total_cpu_ms_per_run"),
    ("conflicts/run", "conflicts_per_run"),
    ("ownership lost/run", "ownership_lost_per_run"),
    ("conflicts", "conflicts"),
    ("outcomes/message", "outcomes_per_message"),
)


def fleet_configs(r: dict[str, Any], broker: str) -> list[tuple[str, str]]:
    """``(label, key prefix)`` of each fleet configuration measured for ``broker``, the default
    first: the labels read ``e<engines>w<workers>s<task slots per worker>`` (without ``s`` in
    results from before the slots were a dimension: 4 slots)."""
    figures = r.get("benchmarks", {}).get("fleet", {}).get("figures", {})
    if f"{broker}.runs_per_s" not in figures:
        return []
    engines = figure(r, "fleet", f"{broker}.engines")
    workers = figure(r, "fleet", f"{broker}.workers")
    slots = figure(r, "fleet", f"{broker}.slots")
    default = f"e{engines:.0f}w{workers:.0f}" if engines and workers else "default"
    if engines and workers and slots:
        default += f"s{slots:.0f}"
    found = [(f"{default} (default)", broker)]
    variants = f"{broker}.variants."
    for key in figures:
        if key.startswith(variants) and key.endswith(".runs_per_s"):
            label = key.removeprefix(variants).removesuffix(".runs_per_s")
            found.append((label, f"{variants}{label}"))
    return found


def fleet_table(r: dict[str, Any]) -> list[str]:
    """The distributed fleet's configurations, one row each (empty when it was not run)."""
    head = "| broker | engines × workers × slots | "
    lines = [head + " | ".join(c for c, _ in FLEET_COLUMNS) + " |",
             "| --- | --- |" + " ---: |" * len(FLEET_COLUMNS)]  # fmt: skip
    for broker in FLEET_BACKENDS:
        for label, prefix in fleet_configs(r, broker):
            values = [(key, figure(r, "fleet", f"{prefix}.{key}")) for _, key in FLEET_COLUMNS]
            cells = [
                f"{v:,.0f}" if key == "conflicts" and v is not None else _num(v)
                for key, v in values
            ]
            lines.append(f"| {broker} | {label} | " + " | ".join(cells) + " |")
    return lines if len(lines) > 2 else []


def furthest_behind(table: list[Row]) -> tuple[Row | None, Row | None]:
    """The row furthest behind the best peer, and the one furthest from its limit."""
    by_peer = [row for row in table if row.vs_peer is not None]
    by_limit = [row for row in table if row.vs_limit is not None]
    return (
        min(by_peer, key=lambda row: row.vs_peer or 0, default=None),
        min(by_limit, key=lambda row: row.vs_limit or 0, default=None),
    )


def markdown(r: dict[str, Any]) -> str:
    """The closing section of RESULTS.md."""
    table = rows(r)
    machine = r.get("machine", {})
    lines = ["", "## Targets and ratios", "",
             f"Load average (1/5/15 min) at start: {machine.get('load_start', 'n/a')}; at end:"
             f" {machine.get('load_end', 'n/a')} — other work shares this {machine.get('cpus')}"
             "-CPU machine, so figures are noisy. `vs best peer`: > 1 means Accord is ahead"
             " (either direction of figure); `vs limit`: fraction of the physical limit reached.",
             "", "| figure | Accord | best peer | vs best peer | limit | vs limit | target |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]  # fmt: skip
    for row in table:
        peer = f"{_num(row.peer[1], row.unit)} ({row.peer[0]})" if row.peer else "n/a"
        limit = f"{_num(row.limit[1], row.unit)} ({row.limit[0]})" if row.limit else "n/a"
        goal = ""
        if row.target is not None:
            op, threshold = row.target
            goal = f"{row.met} ({op.replace('>=', '≥').replace('<=', '≤')} {_num(threshold)})"
        cells = (_num(row.value, row.unit), peer, _factor(row.vs_peer), limit)
        lines.append(
            f"| {row.name} | " + " | ".join(cells) + f" | {_factor(row.vs_limit)} | {goal} |"
        )
    lines += [
        "",
        "Every repetition of every benchmark runs in a fresh interpreter. The memory and SQLite"
        " rows run engine and no-op worker in one process (the CPU figure counts both); the"
        " Redis rows come from the fleet benchmark when it ran: engine and worker processes"
        " apart, as deployed. RSS is the peak (VmHWM) of a fresh interpreter running the"
        " SQLite variant alone.",
        "",
        "### Peers (same workload, own virtual environments)",
        "",
        *peer_table(r),
        "",
        "Peers' RSS is the sum of each server or worker process's peak (`VmHWM`); Celery's"
        " prefork children share pages, so its figure is an upper bound. Peers' CPU counts"
        " their own processes (Redis's, for Celery, is `celery.broker_cpu_ms_per_run`).",
    ]
    fleet = fleet_table(r)
    if fleet:
        at = lines.index("### Peers (same workload, own virtual environments)")
        lines[at:at] = [
            "### Distributed fleet (engine and worker processes apart)",
            "",
            *fleet,
            "",
            "`CPU ms/run (fleet)` is every engine and worker process's (`engine` + `workers`;"
            " `engine` sums every engine process); `Redis`, `RabbitMQ` and `PostgreSQL` are the"
            " servers' over the same window (anything else using them meanwhile included);"
            " `CPU ms/run (all)` is the fleet's and the servers' together. `conflicts`: commits"
            " that lost a compare-and-set (summed over the engine processes, also per run);"
            " `ownership lost/run`: fenced commits refused because the run's shard had changed"
            " hands. With more engines, each owns its share of the store's shards, taken before"
            " the timed phase."
            " `outcomes/message`: outcomes per broker message that carried them (a worker's"
            " outcomes that are ready at once leave as one)."
            " Hops without `(1 run)` are measured during the throughput phase.",
            "",
        ]
    behind_peer, behind_limit = furthest_behind(table)
    lines.append("")
    if behind_peer is not None:
        lines.append(f"Furthest behind the best peer: **{behind_peer.name}** "
                     f"({_factor(behind_peer.vs_peer)}).")  # fmt: skip
    if behind_limit is not None:
        lines.append(f"Furthest from its limit: **{behind_limit.name}** "
                     f"({_factor(behind_limit.vs_limit)} of the limit).")  # fmt: skip
    met = sum(row.met == "met" for row in table)
    judged = sum(row.met in ("met", "not met") for row in table)
    lines.append(f"Targets met: {met} of {judged} measured.")
    return "\n".join(lines) + "\n"
