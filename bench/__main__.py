"""`python -m bench [--smoke] [--only NAME] [--repeat N]`: run every benchmark, write the results.

Each ``bench/bench_<name>.py`` module exposes ``run(smoke: bool) -> dict`` returning a flat or
nested mapping of figures. Every benchmark is repeated (3 times by default; once in smoke mode)
and numeric figures are summarised as median with min–max. Results go to ``bench/RESULTS.md``
and ``bench/results.json`` (smoke runs and ``--only`` runs write under ``bench/out/`` so the
committed full results stay put),
closing with the targets-and-ratios section of :mod:`bench.summary` and the plots of
:mod:`bench.plots` beside them. The load average at start and end is recorded with the machine.
A benchmark that fails is reported with its error, never silently dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import pkgutil
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from accord.loop import chosen
from bench import plots, summary

HERE = Path(__file__).resolve().parent


def _discover() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules([str(HERE)]) if m.name.startswith("bench_"))


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, sub in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), sub, out)
    else:
        out[prefix] = value


def _summarise(samples: list[dict[str, Any]]) -> dict[str, Any]:
    flat = []
    for sample in samples:
        row: dict[str, Any] = {}
        _flatten("", sample, row)
        flat.append(row)
    summary: dict[str, Any] = {}
    keys = list(dict.fromkeys(key for row in flat for key in row))  # a key may miss in a repeat
    for key in keys:
        values = [row[key] for row in flat if key in row]
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        if numbers and len(numbers) == len(values):
            summary[key] = {
                "median": statistics.median(numbers),
                "min": min(numbers),
                "max": max(numbers),
                "n": len(numbers),
            }
        else:
            summary[key] = {"value": values[-1]}
    return summary


_ISOLATED = """
import json, sys
from bench import {name} as module
result = module.run(smoke={smoke})
with open(sys.argv[1], "w") as out:
    json.dump(result, out)
"""


def _run_isolated(name: str, smoke: bool) -> dict[str, Any]:
    """One repetition in a fresh interpreter, so no benchmark pays for what an earlier one left
    behind (heap, threads, child processes) and each process's peak memory is its own."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        code = _ISOLATED.format(name=name, smoke=smoke)
        subprocess.run([sys.executable, "-c", code, out.name], cwd=HERE.parent, check=True)
        result: dict[str, Any] = json.loads(Path(out.name).read_text())
    return result


def _machine() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "loop": chosen(),  # the event loop Accord's processes ran on (ACCORD_LOOP)
        "load_start": _load(),
    }


def _load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.1f}"
    return str(value).replace("|", "\\|").replace("\n", " ⏎ ")


def _markdown(results: dict[str, Any]) -> str:
    lines = ["# Benchmark results", ""]
    m = results["machine"]
    lines.append(
        f"Machine: {m['cpus']} CPUs, {m['processor']}, Python {m['python']}, {m['platform']}; "
        f"event loop {m.get('loop', 'asyncio')}. "
        f"Mode: {'smoke' if results['smoke'] else 'full'}; repetitions: {results['repeat']}."
    )
    for name, body in results["benchmarks"].items():
        lines += ["", f"## {name}", ""]
        if "error" in body:
            lines += [f"**failed**: `{body['error']}`"]
            continue
        lines += ["| figure | median | min | max |", "| --- | ---: | ---: | ---: |"]
        for key, stats in body["figures"].items():
            if "median" in stats:
                cells = (_fmt(stats["median"]), _fmt(stats["min"]), _fmt(stats["max"]))
                lines.append(f"| {key} | " + " | ".join(cells) + " |")
            else:
                lines.append(f"| {key} | {_fmt(stats['value'])} | | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--smoke", action="store_true", help="seconds, not minutes: check it works")
    parser.add_argument("--only", action="append", default=[], help="run only these benchmarks")
    parser.add_argument("--repeat", type=int, default=None)
    args = parser.parse_args(argv)
    repeat = args.repeat or (1 if args.smoke else 3)
    names = [n for n in _discover() if not args.only or n.removeprefix("bench_") in args.only]
    results: dict[str, Any] = {
        "machine": _machine(),
        "smoke": args.smoke,
        "repeat": repeat,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "benchmarks": {},
    }
    failed = 0
    for name in names:
        label = name.removeprefix("bench_")
        print(f"[bench] {label} ×{repeat} …", flush=True)
        began = time.perf_counter()
        try:
            samples = [_run_isolated(name, args.smoke) for _ in range(repeat)]
            results["benchmarks"][label] = {
                "figures": _summarise(samples),
                "seconds": round(time.perf_counter() - began, 2),
            }
        except Exception as exc:  # reported, not dropped
            failed += 1
            traceback.print_exc()
            results["benchmarks"][label] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"[bench] {label} done in {time.perf_counter() - began:.1f}s", flush=True)
    results["machine"]["load_end"] = _load()
    out = HERE / "out" if args.smoke or args.only else HERE  # a partial run replaces nothing
    out.mkdir(exist_ok=True)
    closing = summary.markdown(results)
    try:
        pictures = plots.write(results, out, HERE / "out" / "samples")
        closing += "\nPlots: " + ", ".join(f"`{p.name}`" for p in pictures) + "\n"
    except Exception as exc:  # the tables matter more than the pictures
        traceback.print_exc()
        closing += f"\nPlots not written: `{type(exc).__name__}: {exc}`\n"
    (out / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    (out / "RESULTS.md").write_text(_markdown(results) + closing)
    print(f"[bench] wrote {out / 'RESULTS.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
