"""The acceptance record: which attempts this worker has accepted, and how they ended.

A queue may deliver a job again after the worker accepted it (a BullMQ stalled job, an expired
lease on the embedded queue). After acceptance the engine owns the attempt, so a redelivery must
never start a second run of the handler: the runtime looks the attempt up here first. An attempt
is keyed by run, stage, attempt and fence — a retry is a new attempt with a new fence, so it is a
new key and runs normally.

- not recorded → record ``accepted`` and run the handler;
- ``accepted`` (running here, or the process died mid-run) → re-announce acceptance only; the
  engine's heartbeat deadline decides whether a new attempt is needed;
- ``finished`` → republish the stored final outcome (same message id: harmless if it arrived);
- an acceptance whose ``accepted`` never reached the queue is released (:meth:`release`): the
  handler has not run and the engine does not know of it, so its redelivery runs normally.

It also counts unclassified crashes per (run, stage), which bounds their retries. One SQLite file
(or ``:memory:``) per worker process; writes are tiny, so they run on the caller's thread.

Records are kept for ``retention_s`` after acceptance (a day by default), then pruned, a batch at
a time every ``prune_every`` claims, so the file stays the size of a day's work. A redelivery
comes within seconds or minutes (a lapsed lock, a dropped connection, the outbox sweep's
republish); one that came after its record was pruned would run the handler again, and the
engine would refuse its outcomes as late, as it refuses any outcome of a finished attempt.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["AcceptanceLog", "Prior"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS acceptance (
    key TEXT PRIMARY KEY, run_id TEXT NOT NULL, stage TEXT NOT NULL, attempt INTEGER NOT NULL,
    fence TEXT NOT NULL, state TEXT NOT NULL, outcome BLOB, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS crashes (
    run_id TEXT NOT NULL, stage TEXT NOT NULL, count INTEGER NOT NULL, at REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, stage));
CREATE INDEX IF NOT EXISTS acceptance_at ON acceptance (at);
"""
RETENTION_S = 86_400.0
PRUNE_EVERY = 1_000


@dataclass(frozen=True, slots=True)
class Prior:
    state: str  # accepted | finished
    outcome: bytes | None  # the final outcome body, once finished


class AcceptanceLog:
    def __init__(
        self,
        path: Path | str = ":memory:",
        *,
        retention_s: float = RETENTION_S,
        prune_every: int = PRUNE_EVERY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if retention_s <= 0 or prune_every < 1:
            raise ValueError("retention_s must be > 0 and prune_every >= 1")
        self.retention_s, self._prune_every, self._clock = retention_s, prune_every, clock
        self._claims = 0
        self.pruned = 0  # records removed so far
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            # survives a process crash (what redelivery follows); a power loss can forget an
            # acceptance, and then the engine's heartbeat deadline retries the attempt anyway
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=5000")
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(crashes)")}
            if columns and "at" not in columns:  # a file from before crash counts were dated:
                # its counts are dated now, so they are kept a full retention period
                self._db.execute("ALTER TABLE crashes ADD COLUMN at REAL NOT NULL DEFAULT 0")
                self._db.execute("UPDATE crashes SET at = ?", (clock(),))
            self._db.executescript(_SCHEMA)

    @staticmethod
    def key(run_id: str, stage: str, attempt: int, fence: str) -> str:
        return f"{run_id}\x1f{stage}\x1f{attempt}\x1f{fence}"

    def claim(self, run_id: str, stage: str, attempt: int, fence: str) -> Prior | None:
        """Record acceptance; ``None`` if this call recorded it, else what was recorded before."""
        key = self.key(run_id, stage, attempt, fence)
        with self._lock:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO acceptance VALUES (?, ?, ?, ?, ?, 'accepted', NULL, ?)",
                (key, run_id, stage, attempt, fence, self._clock()),
            )
            if cur.rowcount == 1:
                self._claims += 1
                if self._claims % self._prune_every == 0:
                    self._prune()
                return None
            row = self._db.execute(
                "SELECT state, outcome FROM acceptance WHERE key = ?", (key,)
            ).fetchone()
        return Prior(str(row[0]), bytes(row[1]) if row[1] is not None else None)

    def finish(self, run_id: str, stage: str, attempt: int, fence: str, outcome: bytes) -> None:
        key = self.key(run_id, stage, attempt, fence)
        with self._lock:
            self._db.execute(
                "UPDATE acceptance SET state = 'finished', outcome = ? WHERE key = ?",
                (outcome, key),
            )

    def release(self, run_id: str, stage: str, attempt: int, fence: str) -> bool:
        """Forget an acceptance the engine never heard of (its ``accepted`` could not be
        published, so the handler never ran): the redelivery is then served as a first delivery.
        A finished record is kept (its outcome is what a redelivery republishes). True if a
        record was removed."""
        key = self.key(run_id, stage, attempt, fence)
        with self._lock:
            cur = self._db.execute(
                "DELETE FROM acceptance WHERE key = ? AND state = 'accepted'", (key,)
            )
        return bool(cur.rowcount == 1)

    def count_crash(self, run_id: str, stage: str) -> int:
        """Add one unclassified crash for the stage; the new total."""
        with self._lock:
            self._db.execute(
                "INSERT INTO crashes VALUES (?, ?, 1, ?) ON CONFLICT (run_id, stage) "
                "DO UPDATE SET count = count + 1, at = excluded.at",
                (run_id, stage, self._clock()),
            )
            row = self._db.execute(
                "SELECT count FROM crashes WHERE run_id = ? AND stage = ?", (run_id, stage)
            ).fetchone()
        return int(row[0])

    def prune(self) -> int:
        """Remove the records accepted (and crash counts last bumped) more than
        ``retention_s`` ago; how many were removed."""
        with self._lock:
            return self._prune()

    def _prune(self) -> int:
        cutoff = self._clock() - self.retention_s
        removed = self._db.execute("DELETE FROM acceptance WHERE at < ?", (cutoff,)).rowcount
        removed += self._db.execute("DELETE FROM crashes WHERE at < ?", (cutoff,)).rowcount
        self.pruned += removed
        return int(removed)

    def close(self) -> None:
        with self._lock:
            self._db.close()
