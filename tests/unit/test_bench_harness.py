"""The benchmark harness's own logic: summarising repeats, ratios, targets, the peer workload.

Pure functions on synthetic inputs (the figures are made up here, so each assertion can fail),
plus one real end-to-end run of ``python -m bench --smoke --only limits`` (under a second), the
no-op worker's hop stamps, and tiny runs of the distributed fleet (engine and worker processes
on the real Redis and RabbitMQ, a few seconds each).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bench.__main__ import _summarise
from bench.bench_fleet import _configuration, plan, stat_cpu_s
from bench.peers import workload
from bench.peers.venvs import Peer, PeerFailed, measure
from bench.summary import HIGHER, LOWER, advantage, figure, fleet_table, markdown, rows, status
from hypothesis import given
from hypothesis import strategies as st

from accord.adapters.transports.memory import MemoryTransport
from accord.engine.runtime.intake import OUTCOMES_QUEUE
from accord.testing.workers import run_noop_worker
from tests.services import ensure_rabbitmq, ensure_redis

ROOT = Path(__file__).resolve().parents[2]


def _stats(value: float) -> dict[str, float]:
    return {"median": value, "min": value, "max": value, "n": 1}


def _results(**benches: dict[str, Any]) -> dict[str, Any]:
    return {
        "machine": {"cpus": 2, "load_start": "1.00 / 1.00 / 1.00", "load_end": "2.00"},
        "benchmarks": {
            name: {
                "figures": {
                    k: (_stats(v) if isinstance(v, int | float) else {"value": v})
                    for k, v in figures.items()
                }
            }
            for name, figures in benches.items()
        },
    }


PEERS_OK = {
    "celery.status": "ok",
    "celery.throughput.200.runs_per_s": 100.0,
    "celery.latency.hop_p50_ms": 9.0,
    "celery.rss_mib": 230.0,
    "dbos.status": "ok",
    "dbos.throughput.200.runs_per_s": 40.0,
    "dbos.latency.hop_p50_ms": 6.0,
    "dbos.rss_mib": 75.0,
    "temporal.status": "failed: install failed (pip install): no matching distribution",
    "temporal.throughput.200.runs_per_s": 10_000.0,  # a failed peer never counts as best
}


def _row(table: list[Any], start: str) -> Any:
    return next(row for row in table if row.name.startswith(start))


def test_summarise_keeps_keys_missing_from_some_repeats() -> None:
    summary = _summarise([{"a": 1.0, "b": {"c": 3}}, {"a": 3.0, "d": "x"}, {"a": 2.0}])
    assert summary["a"] == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert summary["b.c"] == {"median": 3, "min": 3, "max": 3, "n": 1}
    assert summary["d"] == {"value": "x"}


def test_figure_is_tolerant_of_missing_and_non_numeric() -> None:
    results = _results(engine={"sqlite.runs_per_s": 600.0, "note": "text", "bad": math.nan})
    assert figure(results, "engine", "missing", "sqlite.runs_per_s") == 600.0
    assert figure(results, "engine", "note") is None
    assert figure(results, "engine", "bad") is None
    assert figure(results, "nowhere", "sqlite.runs_per_s") is None


@given(st.floats(0.001, 1e6), st.floats(0.001, 1e6))
def test_advantage_points_the_same_way_for_both_directions(a: float, b: float) -> None:
    ahead = advantage(a, b, HIGHER)
    assert ahead is not None and math.isclose(ahead * advantage(b, a, HIGHER), 1.0)  # type: ignore[operator]
    assert math.isclose(advantage(a, b, LOWER) or 0, b / a)
    assert advantage(None, b, HIGHER) is None and advantage(a, 0.0, LOWER) is None


def test_status_reads_the_operator() -> None:
    assert status(600, ">=", 500) == "met"
    assert status(400, ">=", 500) == "not met"
    assert status(0.9, "<=", 1.0) == "met"
    assert status(1.1, "<=", 1.0) == "not met"
    assert status(None, "<=", 1.0) == "n/a" and status(1.0, ">=", None) == "n/a"


def test_rows_compare_with_best_working_peer_limits_and_targets() -> None:
    results = _results(
        engine={
            "sqlite.runs_per_s": 600.0,
            "sqlite.transitions_per_s": 5400.0,
            "sqlite.hop_p50_ms_single_run": 2.0,
            "bullmq.runs_per_s": 150.0,
            "sqlite.cpu_ms_per_run": 4.0,
        },
        peers=PEERS_OK,
        limits={"sqlite_tx.FULL": 9000.0, "redis_cas.one_task": 4000.0},
    )
    table = rows(results)
    runs = _row(table, "SQLite (WAL FULL) + embedded queue: runs/s")
    assert runs.peer == ("celery", 100.0) and runs.vs_peer == 6.0
    assert runs.limit is not None and runs.limit[1] == 1000.0  # 9,000 tx/s ÷ 9 transitions/run
    assert runs.met == "met"
    hop = _row(table, "SQLite (WAL FULL) + embedded queue: per-hop")
    assert hop.peer == ("dbos", 6.0) and hop.vs_peer == 3.0 and hop.met == "not met"
    bullmq = _row(table, "Redis + BullMQ: runs/s")
    assert bullmq.target == (">=", 200.0) and bullmq.met == "not met"  # 2 × Celery's 100
    assert _row(table, "Redis + RabbitMQ: runs/s").met == "n/a"
    assert _row(table, "CPU per run").met == "met"
    assert _row(table, "compile").met == "n/a"


def test_markdown_shows_failures_and_missing_figures() -> None:
    text = markdown(_results(engine={"sqlite.runs_per_s": 400.0}, peers=PEERS_OK))
    assert "| 400.0 runs/s | 100.0 runs/s (celery) | 4.00× |" in text
    assert "not met (≥ 500.0)" in text
    assert "failed: install failed (pip install): no matching distribution" in text
    assert "n/a" in text and "Load average (1/5/15 min) at start: 1.00 / 1.00 / 1.00" in text


def test_workload_hops_and_latency_figures() -> None:
    run = {"A": [0.0, 1.0], "B": [1.002, 1.5], "C": [1.004, 1.6], "D": [1.601, 2.0]}
    hops = workload.hops_ms(run)
    assert [round(v, 3) for v in hops.values()] == [2.0, 4.0, 1.0]
    figures = workload.latency_figures([10.0, 20.0, 30.0], [run, run])
    assert figures["hop_p50_ms"] == 2.0 and figures["e2e_p50_ms"] == 20.0
    assert figures["hop_join→D_p50_ms"] == 1.0


def test_budget_skips_a_batch_it_cannot_finish_and_says_why() -> None:
    budget = workload.Budget()
    budget.deadline = budget.deadline - 10**6 + 5  # five seconds left
    assert budget.allows("throughput.200", 200)  # no rate yet: always tried
    budget.rate = 10.0
    assert not budget.allows("throughput.1000", 1000)
    assert budget.skipped and budget.skipped[0].startswith("throughput.1000: 1000 runs predicted")


def test_smoke_limits_run_writes_results() -> None:
    ensure_redis()
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--only", "limits"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = (ROOT / "bench" / "out" / "RESULTS.md").read_text()
    assert "| sqlite_tx.FULL |" in text and "| redis_cas.pipelined |" in text
    assert "## Targets and ratios" in text


def test_a_peer_that_cannot_run_fails_with_its_reason(tmp_path: Path) -> None:
    broken = Peer("broken", (), "bench.peers.no_such_peer")
    with pytest.raises(PeerFailed, match=r"exit 1: .*No module named bench\.peers\.no_such_peer"):
        measure(broken, Path(sys.executable), True, 5, tmp_path / "samples.json")


FLEET = {
    "bullmq.runs_per_s": 150.0,
    "bullmq.transitions_per_s": 1350.0,
    "bullmq.hop_p50_ms_single_run": 2.0,
    "bullmq.engines": 1,
    "bullmq.workers": 2,
    "bullmq.slots": 8,
    "bullmq.cpu_ms_per_run": 9.5,
    "bullmq.variants.e2w2s8.runs_per_s": 90.0,
    "bullmq.variants.e2w2s8.conflicts": 2000,
    "bullmq.variants.e2w2s8.outcomes_per_message": 2.5,
}


def test_redis_rows_take_the_fleet_figures_when_the_fleet_ran() -> None:
    engine = {"bullmq.runs_per_s": 30.0, "bullmq.hop_p50_ms_single_run": 12.0}
    engine |= {"rabbitmq.runs_per_s": 40.0}
    table = rows(_results(engine=engine, fleet=FLEET))
    assert _row(table, "Redis + BullMQ: runs/s").value == 150.0
    assert _row(table, "Redis + BullMQ: per-hop").value == 2.0
    assert _row(table, "Redis + RabbitMQ: runs/s").value == 40.0  # no fleet figure: in-process
    assert _row(rows(_results(engine=engine)), "Redis + BullMQ: runs/s").value == 30.0


def test_fleet_table_lists_the_default_then_the_variants() -> None:
    lines = fleet_table(_results(fleet=FLEET))
    assert lines[2].startswith("| bullmq | e1w2s8 (default) | 150.0 |")
    assert "| 9.500 |" in lines[2]
    assert lines[3].startswith("| bullmq | e2w2s8 | 90.0 |")
    assert lines[3].endswith("| 2,000 | 2.500 |")
    assert len(lines) == 4  # no RabbitMQ row without its figures
    assert fleet_table(_results(engine={"bullmq.runs_per_s": 30.0})) == []
    assert "### Distributed fleet" in markdown(_results(fleet=FLEET))


SCALED = {
    "bullmq.runs_per_s": 150.0,
    "bullmq.engines": 1,
    "bullmq.workers": 1,
    "bullmq.slots": 8,
    "bullmq.conflicts_per_run": 0.0,
    "bullmq.engine_cpu_ms_per_run": 4.0,
    "bullmq.total_cpu_ms_per_run": 6.0,
    "bullmq.variants.e2w1s8.runs_per_s": 140.0,
    "bullmq.variants.e2w1s8.conflicts_per_run": 0.005,
    "bullmq.variants.e2w1s8.engine_cpu_ms_per_run": 4.2,
    "bullmq.variants.e4w1s8.runs_per_s": 120.0,
    "bullmq.variants.e4w1s8.conflicts_per_run": 0.01,  # not below 0.01
    "bullmq.variants.e4w1s8.engine_cpu_ms_per_run": 5.0,
    "bullmq.variants.e4w1s8.ownership_lost_per_run": 0.002,
    # other workers than the default's: not one of the scaling configurations
    "bullmq.variants.e2w2s8.runs_per_s": 90.0,
    "bullmq.variants.e2w2s8.conflicts_per_run": 0.5,
    "bullmq.variants.e2w2s8.engine_cpu_ms_per_run": 40.0,
}


def test_scaling_rows_take_the_default_workers_with_one_two_and_four_engines() -> None:
    table = rows(_results(fleet=SCALED))
    conflicts = [_row(table, f"Redis + BullMQ: conflicts per run, {e} engine") for e in (1, 2, 4)]
    assert [row.value for row in conflicts] == [0.0, 0.005, 0.01]
    assert [row.met for row in conflicts] == ["met", "met", "not met"]
    growth = _row(table, "Redis + BullMQ: engine CPU per run, most engines")
    assert growth.value == 1.25 and growth.met == "not met"  # e4 ÷ e1, not e2w2s8's 10×
    cpu = _row(table, "CPU per run (Redis + BullMQ")
    assert cpu.value == 6.0 and cpu.met == "not met"
    assert _row(table, "Redis + RabbitMQ: conflicts per run, 2").met == "n/a"
    e4 = next(line for line in fleet_table(_results(fleet=SCALED)) if "| e4w1s8 |" in line)
    assert "| 0.010 | 0.002 |" in e4  # conflicts/run, ownership lost/run


def test_stat_cpu_reads_utime_and_stime_past_an_awkward_command_name() -> None:
    tail = " ".join(str(v) for v in range(3, 20))  # fields 3.. of /proc/<pid>/stat
    line = f"4242 (a b) c) {tail}"  # utime is field 14 (value 14), stime field 15 (value 15)
    assert math.isclose(stat_cpu_s(line) * os.sysconf("SC_CLK_TCK"), 14 + 15)
    assert stat_cpu_s(Path("/proc/self/stat").read_text()) >= 0


def test_fleet_configurations_default_first_or_as_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCORD_BENCH_FLEET", raising=False)
    full, smoke = plan(smoke=False), plan(smoke=True)
    assert set(full) == {"bullmq", "rabbitmq", "postgres"} and all(
        len(c) == 1 for c in smoke.values()
    )
    assert all(c[0] == smoke[b][0] and c[0] not in c[1:] for b, c in full.items())
    monkeypatch.setenv("ACCORD_BENCH_FLEET", "rabbitmq:2x3,1x1x4")
    assert plan(smoke=True) == {"rabbitmq": [(2, 3, 8), (1, 1, 4)]}


class _Recording(MemoryTransport):
    """The in-memory queue, noting each publish in order."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    async def _publish(self, queue: str, message_id: str, body: bytes, avail_at: int) -> None:
        self.log.append(f"publish {message_id}")
        await super()._publish(queue, message_id, body, avail_at)


async def test_noop_worker_stamps_a_job_start_on_receipt_before_accepting_it() -> None:
    log: list[str] = []
    transport = _Recording(log)
    job = {
        "messageId": "j1", "runId": "r1", "stage": "render", "attempt": 1,
        "fence": "0123456789abcdef",
    }  # fmt: skip
    await transport.publish("q", "j1", json.dumps(job).encode())
    stop = asyncio.Event()

    def observe(what: str, envelope: Any) -> None:
        log.append(f"{what} {envelope['messageId']}")
        if what == "end":
            stop.set()

    await asyncio.wait_for(run_noop_worker(transport, ["q"], stop=stop, observe=observe), 10)
    assert log == [
        "publish j1",
        "start j1",
        "publish j1:accepted",
        "publish j1:succeeded",
        "end j1",
    ]
    answers = [json.loads(d.body)["messageType"] for d in await _drain(transport, OUTCOMES_QUEUE)]
    assert answers == ["accepted", "succeeded"]


async def _drain(transport: MemoryTransport, queue: str) -> list[Any]:
    out = []
    async for delivery in transport.consume(queue, 10):
        out.append(delivery)
        await transport.ack(delivery)
        if len(out) == 2:
            break
    return out


@pytest.mark.parametrize(("broker", "engines"), [("bullmq", 1), ("rabbitmq", 1), ("bullmq", 2)])
async def test_a_tiny_fleet_reports_every_process(broker: str, engines: int) -> None:
    ensure_redis()
    if broker == "rabbitmq":
        ensure_rabbitmq()
    figures = await _configuration(broker, engines, 1, 4, 6, 2)
    # the second engine's commits are counted; with two engines competing for outcomes a
    # stage's `accepted` may reach one engine after its `succeeded` reached the other, and is
    # then recorded as a late rejection (history, so a transition) or nothing at all
    least, most = (9, 9) if engines == 1 else (7, 11)
    assert least <= figures["transitions_per_run"] <= most
    # stamps from the worker process matched every hop
    assert all(math.isfinite(figures[k]) for k in ("hop_p50_ms", "hop_p50_ms_single_run"))
    assert figures["hop_p50_ms"] > 0 and figures["conflicts"] >= 0
    assert figures["cpu_ms_per_run"] >= figures["engine_cpu_ms_per_run"] > 0
    assert figures["outcomes_per_message"] >= 1  # counted in the worker process
    assert ("rabbitmq_cpu_ms_per_run" in figures) == (broker == "rabbitmq")
    assert "redis_cpu_ms_per_run" in figures
    # every engine took its share of the shards before the timed phase, and kept it
    assert figures["shards"] == 8 and figures["shards_moved"] == 0
    assert figures["total_cpu_ms_per_run"] > figures["cpu_ms_per_run"]
    assert figures["conflicts_per_run"] == pytest.approx(figures["conflicts"] / 6, abs=1e-4)
