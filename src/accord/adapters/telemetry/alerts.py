"""Alerts that lead to work (docs/observability.md, "Alerts").

A small rule set, evaluated in the engine's process by :class:`Alerting` (an engine observer
plus a periodic :meth:`Alerting.evaluate`):

- ``divergence-found``: a run reports ``run.needs-reconciliation`` (or a reconcile pass reports
  divergence); action: reconcile;
- ``stranded-outbox``: the store reports an outbox entry older than ``stranded_ms`` (a store that
  offers ``stranded_outbox``); action: reconcile;
- ``projector-lag``: the projector's lag is over ``lag_ms``;
- ``poison-growing``: ``poison_count`` or more poison reports within ``poison_window_ms``;
- ``no-live-worker``: a stage has waited ``queued_ms`` for a capability no live worker announces.

An alert is a record in :class:`AlertBook` (a SQLite file of its own, beside the engine's
state), one per rule and subject (a workflow, a capability, the deployment): raised again it
counts up and keeps the newest detail and affected runs; when its condition no longer holds at
an evaluation it is ``resolved``. The reconcile action runs the engine's reconciler once
(:meth:`~accord.engine.runtime.orchestrator.Engine.reconcile`, which republishes stranded
entries, re-arms missing deadlines and reports poison) and records what it did on the alert.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accord.engine.runtime.orchestrator import Delivered, Engine

__all__ = ["Alert", "AlertBook", "AlertRules", "Alerting"]

log = logging.getLogger("accord.alerts")
MAX_RUNS = 50  # affected runs kept per alert


@dataclass(frozen=True, slots=True)
class AlertRules:
    stranded_ms: int = 60_000
    lag_ms: int = 60_000
    poison_count: int = 3
    poison_window_ms: int = 600_000
    queued_ms: int = 30_000
    every_ms: int = 10_000


@dataclass(frozen=True, slots=True)
class Alert:
    alert_id: str  # <rule>:<subject>
    rule: str
    subject: str
    state: str  # open | resolved
    detail: str
    runs: list[str]
    count: int
    first_at_ms: int
    last_at_ms: int
    action: str = ""  # what was started, and what it did

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _alert(r: tuple[Any, ...]) -> Alert:
    return Alert(
        alert_id=r[0], rule=r[1], subject=r[2], state=r[3], detail=r[4], runs=json.loads(r[5]),
        count=int(r[6]), first_at_ms=int(r[7]), last_at_ms=int(r[8]), action=r[9],
    )  # fmt: skip


class AlertBook:
    """Alert records in one SQLite file (WAL; every change one transaction)."""

    def __init__(self, path: Path | str) -> None:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS alerts (alert_id TEXT PRIMARY KEY, rule TEXT NOT NULL,"
            " subject TEXT NOT NULL, state TEXT NOT NULL, detail TEXT NOT NULL, runs TEXT NOT"
            " NULL, count INTEGER NOT NULL, first_at_ms INTEGER NOT NULL, last_at_ms INTEGER"
            " NOT NULL, action TEXT NOT NULL DEFAULT '')"
        )

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def raise_(self, rule: str, subject: str, detail: str, runs: list[str], now_ms: int) -> Alert:
        alert_id = f"{rule}:{subject}"
        with self._tx() as db:
            row = db.execute("SELECT runs, count, first_at_ms, state FROM alerts WHERE alert_id=?",
                             (alert_id,)).fetchone()  # fmt: skip
            if row is None or row[3] == "resolved":
                kept, count, first = runs[:MAX_RUNS], 1, now_ms
            else:
                old = json.loads(row[0])
                kept = (old + [r for r in runs if r not in old])[-MAX_RUNS:]
                count, first = int(row[1]) + 1, int(row[2])
            db.execute(
                "INSERT INTO alerts VALUES (?,?,?,?,?,?,?,?,?,'') ON CONFLICT(alert_id) DO UPDATE"
                " SET state=excluded.state, detail=excluded.detail, runs=excluded.runs,"
                " count=excluded.count, first_at_ms=excluded.first_at_ms,"
                " last_at_ms=excluded.last_at_ms",
                (alert_id, rule, subject, "open", detail, json.dumps(kept), count, first, now_ms),
            )
        found = self.get(alert_id)
        assert found is not None
        return found

    def act(self, alert_id: str, action: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE alerts SET action=? WHERE alert_id=?", (action, alert_id))

    def resolve(self, alert_id: str, now_ms: int) -> None:
        with self._tx() as db:
            db.execute("UPDATE alerts SET state='resolved', last_at_ms=? WHERE alert_id=? AND"
                       " state='open'", (now_ms, alert_id))  # fmt: skip

    def get(self, alert_id: str) -> Alert | None:
        rows = self.list(alert_id=alert_id)
        return rows[0] if rows else None

    def list(self, state: str | None = None, alert_id: str | None = None) -> list[Alert]:
        sql, args = "SELECT * FROM alerts WHERE 1=1", list[str]()
        if state:
            sql, args = sql + " AND state=?", [*args, state]
        if alert_id:
            sql, args = sql + " AND alert_id=?", [*args, alert_id]
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY last_at_ms DESC, alert_id", args).fetchall()
        return [_alert(r) for r in rows]

    def close(self) -> None:
        self._db.close()


class Alerting:
    """The rules of the module docstring over one engine, recording into ``book``."""

    def __init__(
        self,
        engine: Engine,
        book: AlertBook,
        rules: AlertRules | None = None,
        *,
        lag_ms: Callable[[], int] | None = None,
    ) -> None:
        self.engine, self.book, self.rules = engine, book, rules or AlertRules()
        self._lag = lag_ms
        self._diverged: dict[str, list[str]] = {}  # workflow -> runs reported since evaluation
        self._poison: collections.deque[int] = collections.deque(maxlen=10_000)
        self._queued: dict[tuple[str, str], tuple[str, int]] = {}  # (run, stage) -> cap, since
        engine.observers.append(self)

    def __call__(self, done: Delivered) -> None:
        """The observer: notes what the rules need from each committed transition."""
        for effect in done.effects:
            name = getattr(effect, "name", "")
            attrs = getattr(effect, "attributes", None) or {}
            if name == "stage.dispatched":
                key = (done.run_id, str(attrs.get("stage", "")))
                self._queued[key] = (str(attrs.get("capability", "")), self._now())
            elif name == "run.needs-reconciliation" and done.run is not None:
                self._diverged.setdefault(done.run.workflow, []).append(done.run_id)
        for entry in done.history:
            kind = entry.event.get("kind")
            stage = str(entry.event.get("stage") or "")
            if kind == "poison-reported" and entry.accepted:
                self._poison.append(entry.at_ms)
            if kind in ("stage-accepted", "stage-succeeded", "stage-failed", "poison-reported"):
                self._queued.pop((done.run_id, stage), None)
        if done.run is not None and done.run.terminal:
            for key in [k for k in self._queued if k[0] == done.run_id]:
                del self._queued[key]

    def _now(self) -> int:
        return int(self.engine.clock.now_ms())

    async def _reconcile(self, alert: Alert) -> None:
        try:
            report = await self.engine.reconcile()
        except Exception as exc:
            self.book.act(alert.alert_id, f"reconcile failed: {type(exc).__name__}: {exc}"[:500])
            return
        r = report.to_json()
        done = (f"reconcile: {r['runs_checked']} runs checked, {r['republished']} republished,"
                f" {r['rearmed']} re-armed, {r['poisoned']} poisoned,"
                f" {len(r['divergences'])} divergent")  # fmt: skip
        self.book.act(alert.alert_id, done)
        for d in report.divergences:
            self._diverged.setdefault("reconciler", []).append(d.run_id)

    async def evaluate(self) -> list[Alert]:
        """One evaluation of every rule; the alerts raised by it."""
        now, rules, raised = self._now(), self.rules, []
        open_ids = {a.alert_id for a in self.book.list(state="open")}
        firing: set[str] = set()

        def fire(rule: str, subject: str, detail: str, runs: list[str]) -> Alert:
            alert = self.book.raise_(rule, subject, detail, runs, now)
            firing.add(alert.alert_id)
            raised.append(alert)
            log.warning("alert %s: %s", alert.alert_id, detail)
            return alert

        diverged, self._diverged = self._diverged, {}
        for workflow, runs in sorted(diverged.items()):
            alert = fire("divergence-found", workflow,
                         f"{len(runs)} run(s) need reconciliation", runs)  # fmt: skip
            if workflow != "reconciler":  # what a reconcile pass itself reported: no loop
                await self._reconcile(alert)
        stranded = getattr(self.engine.store, "stranded_outbox", None)
        if callable(stranded):
            count = int(await stranded(rules.stranded_ms))
            if count:
                alert = fire(
                    "stranded-outbox",
                    "deployment",
                    f"{count} outbox entries older than {rules.stranded_ms} ms",
                    [],
                )
                await self._reconcile(alert)  # fmt: skip
        if self._lag is not None:
            lag = int(self._lag())
            if lag > rules.lag_ms:
                fire("projector-lag", "projection", f"lag {lag} ms > {rules.lag_ms} ms", [])
        while self._poison and self._poison[0] < now - rules.poison_window_ms:
            self._poison.popleft()
        if len(self._poison) >= rules.poison_count:
            many = f"{len(self._poison)} poison reports in {rules.poison_window_ms} ms"
            fire("poison-growing", "deployment", many, [])
        waiting: dict[str, list[str]] = {}
        for (run_id, _stage), (cap, since) in self._queued.items():
            if cap and now - since >= rules.queued_ms:
                waiting.setdefault(cap, []).append(run_id)
        if waiting:
            live = await self.engine.store.live_capabilities(now)
            for cap, runs in sorted(waiting.items()):
                if not live.get(cap):
                    fire("no-live-worker", cap,
                         f"{len(runs)} stage(s) queued for {cap}, which no live worker announces",
                         runs)  # fmt: skip
        for alert_id in open_ids - firing:
            if not alert_id.startswith("divergence-found:"):  # divergence stays until looked at
                self.book.resolve(alert_id, now)
        return raised

    async def run(self, stop: asyncio.Event) -> None:
        """Evaluate every ``every_ms`` until ``stop`` is set; a failed evaluation is logged."""
        while not stop.is_set():
            try:
                await self.evaluate()
            except Exception:
                log.warning("alert evaluation failed", exc_info=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.rules.every_ms / 1000)
