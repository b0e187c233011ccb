"""What ``accord demo`` shows: a live table of runs and stages, then one summary row per model.

Both are built from durable run records only (the store), never from worker-side state, so what
the table says is what the engine committed. A run that took the cache-hit branch has no worker
results of its own; its summary reads the cached results the lookup referenced.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from accord.engine.machine.state import RunState, StageState

__all__ = ["STAGES", "ModelRun", "live_table", "summarise", "summary_table"]

STAGES = ("cache-lookup", "render-thumbnail", "semantic-analysis", "technical-metadata", "publish")
_SHORT = {"cache-lookup": "lookup", "render-thumbnail": "render", "semantic-analysis": "analyse",
          "technical-metadata": "metadata", "publish": "publish"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ModelRun:
    model_id: str
    source: Path
    run_id: str


def _ms(st: StageState) -> int | None:
    cur = st.current
    if cur is None or cur.finished_at_ms is None:
        return None
    return cur.finished_at_ms - cur.dispatched_at_ms


def _cell(st: StageState | None) -> str:
    if st is None or st.status == "pending":
        return "[dim]·[/dim]"
    if st.status == "completed":
        return f"[green]✓[/green] {_ms(st) or 0} ms"
    if st.status in ("queued", "running", "retry-scheduled"):
        pct = f" {int(st.progress * 100)}%" if st.progress else ""
        return f"[yellow]{st.status}{pct}[/yellow]"
    code = (st.error or {}).get("code", st.status)
    return f"[red]✗ {code}[/red]"


def live_table(
    runs: Sequence[ModelRun], states: Mapping[str, RunState | None], title: str
) -> Table:
    table = Table(title=title)
    for column in ("model", "run", *(_SHORT[s] for s in STAGES), "audit"):
        table.add_column(column, overflow="fold")
    for mr in runs:
        run = states.get(mr.run_id)
        if run is None:
            table.add_row(mr.model_id, "starting", *["" for _ in STAGES], "")
            continue
        colour = {"completed": "green", "failed": "red"}.get(run.status, "yellow")
        audit = ", ".join(run.finalisers) or ("…" if run.status == "finalising" else "·")
        cells = [_cell(run.stages.get(s)) for s in STAGES]
        table.add_row(mr.model_id, f"[{colour}]{run.status}[/{colour}]", *cells, audit)
    return table


def _cached(run: RunState, objects_parent: Path) -> dict[str, dict[str, Any]]:
    """The results a cache hit referenced, by result contract."""
    lookup = run.stages["cache-lookup"].result or {}
    found: dict[str, dict[str, Any]] = {}
    for ref in lookup.get("results", []):
        path = objects_parent / str(ref["objectKey"])
        try:
            found[str(ref["contract"])] = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue
    return found


def summarise(mr: ModelRun, run: RunState, state_dir: Path, objects: Path) -> dict[str, Any]:
    """One model's outcome as plain data (also what ``--json`` prints)."""
    lookup = run.stages["cache-lookup"].result or {}
    hit = bool(lookup.get("hit"))
    results = _cached(run, state_dir) if hit else {}
    for stage, contract in (("render-thumbnail", "thumbnail-generated@1"),
                            ("semantic-analysis", "semantic-analysis@1"),
                            ("technical-metadata", "technical-metadata@1")):  # fmt: skip
        st = run.stages.get(stage)
        if st is not None and st.result:
            results[contract] = dict(st.result)
    meta = results.get("technical-metadata@1", {})
    thumbs = results.get("thumbnail-generated@1", {})
    analysis = results.get("semantic-analysis@1", {})
    errors = {n: s.error.get("code") for n, s in run.stages.items() if s.error}
    stages = {
        s: {"status": run.stages[s].status, "ms": _ms(run.stages[s])}
        for s in STAGES
        if s in run.stages
    }
    return {
        "modelId": mr.model_id,
        "source": str(mr.source),
        "runId": run.run_id,
        "status": run.status,
        "route": "cache hit" if hit else ("workers" if lookup else "-"),
        "cacheOutcome": lookup.get("outcome"),
        "stages": stages,
        "errors": errors,
        "format": meta.get("format"),
        "faces": meta.get("faceCount"),
        "watertight": meta.get("watertight"),
        "volume": meta.get("volume"),
        "tags": [t["label"] for t in analysis.get("tags", [])][:4],
        "thumbnails": [
            str(objects / run.tenant / p["objectKey"]) for p in thumbs.get("previews", [])
        ],
        "views": len(thumbs.get("views", [])),
    }


def _short(path: str) -> str:
    p, here = Path(path), Path.cwd()
    return str(p.relative_to(here)) if p.is_relative_to(here) else path


def summary_table(rows: Sequence[Mapping[str, Any]], title: str) -> Table:
    table = Table(title=title)
    for column in ("model", "status", "route", "stages (ms)", "format", "faces", "watertight",
                   "volume", "tags", "thumbnail"):  # fmt: skip
        table.add_column(column, overflow="fold")
    for row in rows:
        stages = " · ".join(
            f"{_SHORT[s]} {v['ms']}" for s, v in row["stages"].items() if v["ms"] is not None
        )
        if row["errors"]:
            stages += " [red]" + ", ".join(f"{k}: {v}" for k, v in row["errors"].items()) + "[/red]"
        volume = row["volume"]
        route = row["route"] if row["route"] != "cache hit" else "[cyan]cache hit[/cyan]"
        table.add_row(
            row["modelId"], row["status"], route, stages, str(row["format"] or "-"),
            str(row["faces"] if row["faces"] is not None else "-"), str(row["watertight"]),
            f"{volume:.4g}" if isinstance(volume, int | float) else "-",
            ", ".join(row["tags"]) or "-",
            _short(row["thumbnails"][0]) if row["thumbnails"] else "-",
        )  # fmt: skip
    return table
