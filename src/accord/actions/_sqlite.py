"""The one way a platform action opens its SQLite file (the catalogue, the audit log).

The actions call their tables from :func:`asyncio.to_thread`, so a connection is shared across
threads (``check_same_thread=False``) behind a lock that every use takes; it is in autocommit mode
(``isolation_level=None``: a caller that needs a transaction says ``BEGIN IMMEDIATE``), in WAL mode,
and waits up to five seconds for another process's write lock.

The actions keep their own opener rather than :class:`accord.adapters._sqlite.Database`: the
adapters are the actions' sibling layer, which they may not import, and these small tables need
none of that store's write grouping.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

__all__ = ["open_table_file"]


def open_table_file(path: Path, schema: str) -> tuple[sqlite3.Connection, threading.Lock]:
    """Open (creating its folder) the SQLite file at ``path``, apply ``schema`` (idempotent DDL),
    and return the connection with the lock that guards it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    lock = threading.Lock()
    with lock:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA busy_timeout=5000")
        db.executescript(schema)
    return db, lock
