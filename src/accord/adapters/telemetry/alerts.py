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
an evaluation of the engine process that raised it last (its ``owner``: engines sharing a book
each see only what they dispatched), or of any engine once the owner has not raised it for three
evaluation periods, it is ``resolved``. The reconcile action runs the engine's
reconciler once (:meth:`~accord.engine.runtime.orchestrator.Engine.reconcile`, which
republishes stranded entries, re-arms missing deadlines and reports poison) and records what it
did on the alert.

Each transition is logged once, on one line at WARNING (``alert firing: <id>: <detail>`` when
an alert opens, ``alert resolved: <id> (open since …)`` when it closes; raised again while open
it only counts up), and counted in the process's metrics when given: the gauge
``accord_alerts_open`` (by ``rule``) and the counter ``accord_alert_transitions_total`` (by
``rule`` and ``outcome``: ``firing`` or ``resolved``). :meth:`Alerting.run` is the periodic
evaluation ``accord engine run`` and ``accord serve`` start (``--alert-rules``).
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
    from accord.adapters.telemetry.metrics import Metrics
    from accord.engine.runtime.orchestrator import Delivered, Engine

__all__ = ["RULES", "Alert", "AlertBook", "AlertRules", "Alerting", "parse_rules"]

log = logging.getLogger("accord.alerts")
MAX_RUNS = 50  # affected runs kept per alert
RULES = ("divergence-found", "stranded-outbox", "projector-lag", "poison-growing", "no-live-worker")


@dataclass(frozen=True, slots=True)
class AlertRules:
    stranded_ms: int = 60_000
    lag_ms: int = 60_000
    poison_count: int = 3
    poison_window_ms: int = 600_000
    queued_ms: int = 30_000
    every_ms: int = 10_000


_SPEC = {  # --alert-rules key -> (AlertRules field, is a duration)
    "every": ("every_ms", True), "stranded": ("stranded_ms", True), "lag": ("lag_ms", True),
    "queued": ("queued_ms", True), "poison": ("poison_count", False),
    "poison-window": ("poison_window_ms", True),
}  # fmt: skip


def parse_rules(text: str) -> AlertRules | None:
    """``--alert-rules``: ``on`` (the defaults), ``off`` (``None``), or ``key=value`` pairs
    separated by commas over the defaults — ``every``, ``stranded``, ``lag``, ``queued`` and
    ``poison-window`` take durations (``500ms``, ``30s``, ``10m``), ``poison`` a count.
    ``ValueError`` names the offending pair."""
    from accord.engine.runtime.retention import parse_duration  # noqa: PLC0415

    spec = text.strip().lower()
    if spec in ("off", "none", "no"):
        return None
    values: dict[str, int] = {}
    for part in [] if spec in ("on", "", "default") else spec.split(","):
        key, sep, raw = part.strip().partition("=")
        if not sep or key not in _SPEC:
            raise ValueError(f"{part.strip()!r}: expected key=value with key one of "
                             f"{', '.join(_SPEC)} (or on, off)")  # fmt: skip
        name, duration = _SPEC[key]
        try:
            value = parse_duration(raw) if duration else int(raw)
        except ValueError as exc:
            raise ValueError(f"{key}={raw}: {exc}") from None
        if value <= 0 and key in ("every", "poison"):
            raise ValueError(f"{key}={raw}: must be above 0")
        values[name] = value
    return AlertRules(**values)


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
    owner: str = ""  # the engine process that raised it last (only it resolves it)

    @property
    def since_ms(self) -> int:
        """When the current state began: opened at ``first_at_ms``, resolved at ``last_at_ms``."""
        return self.first_at_ms if self.state == "open" else self.last_at_ms

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"since_ms": self.since_ms, "since": _iso(self.since_ms)}


def _iso(at_ms: int) -> str:
    from datetime import UTC, datetime  # noqa: PLC0415

    return datetime.fromtimestamp(at_ms / 1000, UTC).isoformat(timespec="milliseconds")


def _alert(r: tuple[Any, ...]) -> Alert:
    return Alert(
        alert_id=r[0], rule=r[1], subject=r[2], state=r[3], detail=r[4], runs=json.loads(r[5]),
        count=int(r[6]), first_at_ms=int(r[7]), last_at_ms=int(r[8]), action=r[9],
        owner=r[10] if len(r) > 10 else "",
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
            " NOT NULL, action TEXT NOT NULL DEFAULT '', owner TEXT NOT NULL DEFAULT '')"
        )
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(alerts)")}
        if "owner" not in columns:  # a book written before alerts had owners
            self._db.execute("ALTER TABLE alerts ADD COLUMN owner TEXT NOT NULL DEFAULT ''")

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

    def raise_(
        self, rule: str, subject: str, detail: str, runs: list[str], now_ms: int, *, owner: str = ""
    ) -> Alert:
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
                "INSERT INTO alerts VALUES (?,?,?,?,?,?,?,?,?,'',?) ON CONFLICT(alert_id) DO UPDATE"
                " SET state=excluded.state, detail=excluded.detail, runs=excluded.runs,"
                " count=excluded.count, first_at_ms=excluded.first_at_ms,"
                " last_at_ms=excluded.last_at_ms, owner=excluded.owner",
                (alert_id, rule, subject, "open", detail, json.dumps(kept), count, first, now_ms,
                 owner),
            )  # fmt: skip
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
        metrics: Metrics | None = None,
    ) -> None:
        self.engine, self.book, self.rules = engine, book, rules or AlertRules()
        self._lag = lag_ms
        self._metrics = metrics
        self.open_by_rule: dict[str, int] = dict.fromkeys(RULES, 0)
        self.transitions: list[tuple[str, str, int]] = []  # (alert id, firing|resolved, at)
        if metrics is not None:
            metrics.gauge("accord_alerts_open", self._open_counts)
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
        now, rules, raised, me = self._now(), self.rules, [], str(self.engine.owner)
        open_now = self.book.list(state="open")
        open_ids = {a.alert_id for a in open_now}
        # what this process may resolve: what it raised (several engines may share a book, each
        # seeing only the stages it dispatched; one must not resolve what another still sees),
        # or what its owner has not raised for three evaluations (it stopped, or it sees it no
        # longer)
        stale = now - 3 * rules.every_ms
        mine = {a.alert_id for a in open_now if a.owner in ("", me) or a.last_at_ms < stale}
        firing: set[str] = set()

        def fire(rule: str, subject: str, detail: str, runs: list[str]) -> Alert:
            alert = self.book.raise_(rule, subject, detail, runs, now, owner=me)
            firing.add(alert.alert_id)
            raised.append(alert)
            if alert.alert_id not in open_ids:  # a transition: logged once, counted once
                log.warning("alert firing: %s: %s", alert.alert_id, detail)
                self._transition(alert.alert_id, rule, "firing", now)
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
        for alert_id in sorted(mine - firing):
            if not alert_id.startswith("divergence-found:"):  # divergence stays until looked at
                was = self.book.get(alert_id)
                self.book.resolve(alert_id, now)
                opened = f" (open since {_iso(was.first_at_ms)})" if was is not None else ""
                log.warning("alert resolved: %s%s", alert_id, opened)
                self._transition(alert_id, alert_id.partition(":")[0], "resolved", now)
        counts = dict.fromkeys(RULES, 0)
        kept = {a for a in open_ids - firing if a.startswith("divergence-found:") or a not in mine}
        for alert_id in firing | kept:
            rule = alert_id.partition(":")[0]
            counts[rule] = counts.get(rule, 0) + 1
        self.open_by_rule = counts
        return raised

    def _open_counts(self) -> list[tuple[float, dict[str, str]]]:
        return [(float(n), {"rule": rule}) for rule, n in self.open_by_rule.items()]

    def _transition(self, alert_id: str, rule: str, outcome: str, at_ms: int) -> None:
        self.transitions.append((alert_id, outcome, at_ms))
        del self.transitions[:-1000]
        if self._metrics is not None:
            self._metrics.add("accord_alert_transitions", rule=rule, outcome=outcome)

    async def run(self, stop: asyncio.Event) -> None:
        """Evaluate every ``every_ms`` until ``stop`` is set; a failed evaluation is logged."""
        while not stop.is_set():
            try:
                await self.evaluate()
            except Exception:
                log.warning("alert evaluation failed", exc_info=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.rules.every_ms / 1000)
