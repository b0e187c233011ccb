"""The acceptance record (accord.worker.acceptance): claims, finishes, crash counts, and the
retention that keeps the file the size of a day's work."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from accord.worker.acceptance import AcceptanceLog


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_claim_then_redelivery_sees_the_record(tmp_path: Path) -> None:
    log = AcceptanceLog(tmp_path / "a.db")
    assert log.claim("r1", "render", 1, "f1") is None
    prior = log.claim("r1", "render", 1, "f1")
    assert prior is not None and prior.state == "accepted" and prior.outcome is None
    log.finish("r1", "render", 1, "f1", b'{"messageId":"m"}')
    prior = log.claim("r1", "render", 1, "f1")
    assert prior is not None and prior.state == "finished" and prior.outcome == b'{"messageId":"m"}'
    assert log.claim("r1", "render", 2, "f2") is None  # a retry is a new attempt
    log.close()


def test_records_older_than_the_retention_are_pruned_as_claims_go_by(tmp_path: Path) -> None:
    clock = _Clock()
    log = AcceptanceLog(tmp_path / "a.db", retention_s=3600, prune_every=2, clock=clock)
    assert log.claim("old", "render", 1, "f") is None
    log.finish("old", "render", 1, "f", b"{}")
    assert log.count_crash("old", "analyse") == 1
    clock.now += 1800
    assert log.claim("mid", "render", 1, "f") is None  # second claim: prunes, nothing is old yet
    assert log.pruned == 0
    clock.now += 1801  # "old" (and its crash count) is now past the retention, "mid" is not
    assert log.claim("new", "render", 1, "f") is None
    assert log.claim("new2", "render", 1, "f") is None  # fourth claim: prunes
    assert log.pruned == 2
    assert log.claim("mid", "render", 1, "f") is not None  # kept
    assert log.claim("old", "render", 1, "f") is None  # forgotten: taken as new
    assert log.count_crash("old", "analyse") == 1  # counting starts again
    log.close()


def test_prune_on_demand_and_bad_settings(tmp_path: Path) -> None:
    clock = _Clock()
    log = AcceptanceLog(":memory:", retention_s=10, clock=clock)
    for n in range(5):
        log.claim(f"r{n}", "s", 1, "f")
    clock.now += 11
    assert log.prune() == 5 and log.prune() == 0
    with pytest.raises(ValueError, match="retention_s"):
        AcceptanceLog(":memory:", retention_s=0)
    with pytest.raises(ValueError, match="prune_every"):
        AcceptanceLog(":memory:", prune_every=0)


def test_a_file_from_before_dated_crash_counts_is_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE acceptance (key TEXT PRIMARY KEY, run_id TEXT NOT NULL,"
        " stage TEXT NOT NULL, attempt INTEGER NOT NULL, fence TEXT NOT NULL,"
        " state TEXT NOT NULL, outcome BLOB, at REAL NOT NULL);"
        "CREATE TABLE crashes (run_id TEXT NOT NULL, stage TEXT NOT NULL,"
        " count INTEGER NOT NULL, PRIMARY KEY (run_id, stage));"
        "INSERT INTO crashes VALUES ('r', 's', 2);"
    )
    db.commit()
    db.close()
    clock = _Clock()
    log = AcceptanceLog(path, retention_s=60, clock=clock)
    assert log.prune() == 0  # the old count is dated now, not at the epoch
    assert log.count_crash("r", "s") == 3
    clock.now += 61
    assert log.prune() == 1
    log.close()
