"""One SQLite database file, driven from one dedicated thread, with group commit.

Every store and transport call becomes one job run on the database's own thread: the connection
never crosses threads and calls are serialised without an asyncio lock. Reads (:meth:`read`) run
as they are. Writes (:meth:`write`) run inside ``BEGIN IMMEDIATE … COMMIT``, which takes the write
lock up front, so a writer in another process waits on the busy timeout instead of deadlocking.

Group commit: when several writes are queued, the thread runs them in *one* transaction, each
inside its own ``SAVEPOINT``. A write that raises is rolled back to its savepoint alone (its caller
gets the error, e.g. a :class:`~accord.errors.ConflictError`); the others commit together, and
every caller is answered only after that ``COMMIT`` returned, so each write is still atomic and,
once acknowledged, as durable as ``synchronous`` says. Under concurrency this divides the cost of
an fsync between many commits; a lone writer sees one transaction per write. A group first runs
without savepoints (two statements fewer per write); only if one of its writes fails is it rolled
back and run again, each write in its savepoint — writes are plain functions of the connection,
so running one again after a rollback does the same thing.

Leases need not survive a power cut: a write marked ``durable=False`` (a claim) commits in WAL
mode with ``synchronous=NORMAL`` when nothing else in its group needs more — no fsync of its own.
It survives a crash of the process (its WAL frames are in the operating system already), and the
next durable commit's fsync makes it durable too; a power cut can lose only such trailing
leases, after which the messages or rows are simply offered again.

URL form (shared by the store and the embedded transport)::

    sqlite:///relative/path.db   sqlite:////absolute/path.db   sqlite:///:memory:
    ?synchronous=FULL|NORMAL|OFF  &busy_timeout_ms=5000   (plus adapter options, see each adapter)

``sqlite3`` errors are translated here, at the adapter edge: a lock still held after the busy
timeout becomes a retryable error, anything else a non-retryable one, naming the operation.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, TypeAlias, TypeVar, cast
from urllib.parse import parse_qsl, urlsplit

from accord.errors import AccordError, StoreError, TransportError

__all__ = ["Database", "error", "parse_sqlite_url", "write_transaction"]

T = TypeVar("T")
Kind: TypeAlias = Literal["store", "transport"]
SYNCHRONOUS = ("FULL", "NORMAL", "OFF", "EXTRA")


def parse_sqlite_url(url: str, allowed: set[str]) -> tuple[str, dict[str, str]]:
    """``(path, options)`` from a ``sqlite:///…`` URL; unknown options are refused by name."""
    parts = urlsplit(url)
    if parts.netloc:
        raise ValueError(f"{url!r}: a sqlite URL has no host; write sqlite:///relative/path.db")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path:
        raise ValueError(
            f"{url!r}: no database path; write sqlite:///path.db or sqlite:///:memory:"
        )
    options = dict(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False))
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(f"{url!r}: unknown option(s) {unknown}; known: {sorted(allowed)}")
    return path, options


def write_transaction(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``body`` inside ``BEGIN IMMEDIATE … COMMIT``; roll back on any exception."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = body(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


def error(kind: Kind, message: str, *, retryable: bool = False) -> AccordError:
    if kind == "transport":
        return TransportError(message, retryable=retryable)
    return StoreError(message, retryable=retryable)


def _translate(exc: sqlite3.Error, what: str, kind: Kind) -> AccordError:
    text = str(exc)
    retryable = isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text)
    return error(kind, f"sqlite {what} failed: {type(exc).__name__}: {text}", retryable=retryable)


MAX_GROUP = 128  # writes per group transaction


@dataclass(slots=True)
class _Job:
    fn: Callable[[sqlite3.Connection], Any]
    what: str
    kind: Kind
    write: bool
    done: Callable[[BaseException | None, Any], None]
    outcome: tuple[BaseException | None, Any] = field(default=(None, None))
    durable: bool = True


class Database:
    """A connection on its own thread (see the module docstring)."""

    def __init__(
        self, path: str, *, synchronous: str = "FULL", busy_timeout_ms: int = 5000
    ) -> None:
        sync = synchronous.upper()
        if sync not in SYNCHRONOUS:
            raise ValueError(f"synchronous={synchronous!r}: expected one of {SYNCHRONOUS}")
        self.path = path
        self.synchronous = sync
        self._sync_now = sync
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._schemas: set[str] = set()
        # answers for event loops, gathered on the database thread and handed over with one
        # wake-up per loop per group: a wake-up costs the loop a self-pipe read and a select
        self._answers: list[tuple[asyncio.AbstractEventLoop, Callable[[], None]]] = []
        self._thread = threading.Thread(target=self._serve, name="accord-sqlite", daemon=True)
        self._thread.start()
        self._sync_job(lambda _: self._open(path, sync, busy_timeout_ms), "open", write=False)

    # ---- the database thread ----------------------------------------------------------------

    def _open(self, path: str, sync: str, busy_timeout_ms: int) -> None:
        conn = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, cached_statements=256
        )
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        if path != ":memory:":
            deadline = time.monotonic() + busy_timeout_ms / 1000
            while True:  # switching to WAL needs a moment alone with the file
                try:
                    conn.execute("PRAGMA journal_mode = WAL")
                    break
                except sqlite3.OperationalError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
        conn.execute(f"PRAGMA synchronous = {sync}")
        self._conn = conn

    def _serve(self) -> None:
        pending: deque[_Job | None] = deque()  # taken off the queue while grouping, not yet run
        while True:
            job = pending.popleft() if pending else self._jobs.get()
            if job is None:
                break
            if not job.write:
                conn = cast(sqlite3.Connection, self._conn)  # None only for the opening job
                job.done(*self._guard(job, partial(job.fn, conn)))
                self._wake_callers()
                continue
            group = [job]
            while len(group) < MAX_GROUP:
                try:
                    extra = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if extra is None or not extra.write:
                    pending.append(extra)
                    break
                group.append(extra)
            self._write_group(group)
            self._wake_callers()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _guard(self, job: _Job, run: Callable[[], Any]) -> tuple[BaseException | None, Any]:
        try:
            return None, run()
        except sqlite3.Error as exc:
            return _translate(exc, job.what, job.kind), None
        except Exception as exc:
            return exc, None

    def _write_group(self, group: list[_Job]) -> None:
        conn = self._conn
        assert conn is not None  # opened before any write is queued
        self._durability(conn, any(job.durable for job in group))
        if len(group) == 1:
            job = group[0]
            job.done(*self._guard(job, partial(write_transaction, conn, job.fn)))
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
            for job in group:
                job.outcome = self._guard(job, partial(job.fn, conn))
                if job.outcome[0] is not None:  # undo the lot; again, each in its savepoint
                    conn.execute("ROLLBACK")
                    conn.execute("BEGIN IMMEDIATE")
                    for each in group:
                        each.outcome = self._guard(each, partial(_in_savepoint, conn, each.fn))
                    break
            conn.execute("COMMIT")
        except sqlite3.Error as exc:  # the group as a whole failed: nobody's write landed
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            for job in group:
                job.done(_translate(exc, job.what, job.kind), None)
            return
        for job in group:
            job.done(*job.outcome)

    def _wake_callers(self) -> None:
        answers, self._answers = self._answers, []
        by_loop: dict[asyncio.AbstractEventLoop, list[Callable[[], None]]] = {}
        for loop, answer in answers:
            by_loop.setdefault(loop, []).append(answer)
        for loop, batch in by_loop.items():
            if not loop.is_closed():
                # closed in the meantime: nobody is waiting any more
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_answer_all, batch)

    def _durability(self, conn: sqlite3.Connection, durable: bool) -> None:
        wanted = self.synchronous if durable or self.synchronous in ("NORMAL", "OFF") else "NORMAL"
        if wanted != self._sync_now:
            conn.execute(f"PRAGMA synchronous = {wanted}")
            self._sync_now = wanted

    # ---- the event loop's side --------------------------------------------------------------

    def _submit(self, job: _Job) -> None:
        if self._closed:
            job.done(error(job.kind, f"sqlite {job.what}: database {self.path!r} is closed"), None)
        else:
            self._jobs.put(job)

    def _sync_job(self, fn: Callable[[sqlite3.Connection], T], what: str, *, write: bool) -> T:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def done(exc: BaseException | None, result: Any) -> None:
            future.set_exception(exc) if exc is not None else future.set_result(result)

        self._submit(_Job(fn, what, "store", write, done))
        return future.result()

    async def _async_job(
        self,
        fn: Callable[[sqlite3.Connection], T],
        what: str,
        kind: Kind,
        *,
        write: bool,
        durable: bool = True,
    ) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def settle(exc: BaseException | None, result: Any) -> None:
            if not future.done():
                future.set_exception(exc) if exc is not None else future.set_result(result)

        def done(exc: BaseException | None, result: Any) -> None:
            if threading.get_ident() == self._thread.ident:
                self._answers.append((loop, partial(settle, exc, result)))
            elif not loop.is_closed():
                loop.call_soon_threadsafe(settle, exc, result)

        self._submit(_Job(fn, what, kind, write, done, durable=durable))
        return await future

    async def read(
        self, fn: Callable[[sqlite3.Connection], T], what: str, kind: Kind = "store"
    ) -> T:
        """Run ``fn`` on the database thread, outside any explicit transaction."""
        return await self._async_job(fn, what, kind, write=False)

    async def write(
        self,
        fn: Callable[[sqlite3.Connection], T],
        what: str,
        kind: Kind = "store",
        *,
        durable: bool = True,
    ) -> T:
        """Run ``fn`` atomically in a write transaction (possibly grouped, see above);
        ``durable=False`` for a lease, which may skip its own fsync (see above)."""
        return await self._async_job(fn, what, kind, write=True, durable=durable)

    def ensure_schema(self, schema: str) -> None:
        """Create tables once per connection (idempotent DDL; safe across processes)."""
        if schema not in self._schemas:
            create = lambda c: [c.execute(s) for s in _statements(schema)]  # noqa: E731
            self._sync_job(create, "schema", write=True)
            self._schemas.add(schema)

    def close_sync(self) -> None:
        if not self._closed:
            self._closed = True
            self._jobs.put(None)
            self._thread.join()

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close_sync)


def _answer_all(batch: list[Callable[[], None]]) -> None:
    for answer in batch:
        answer()


def _in_savepoint(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    conn.execute("SAVEPOINT accord_write")
    try:
        result = fn(conn)
    except BaseException:
        conn.execute("ROLLBACK TO accord_write")
        conn.execute("RELEASE accord_write")
        raise
    conn.execute("RELEASE accord_write")
    return result


def _statements(schema: str) -> list[str]:
    return [s.strip() for s in schema.split(";") if s.strip()]
