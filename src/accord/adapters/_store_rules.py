"""Rules every store adapter applies the same way, kept in one place so they cannot drift.

- JSON crosses the store as canonical text; a value that is not JSON is refused before anything
  is written (:class:`~accord.errors.StoreError` naming the field). :func:`encode_commit` is that
  encoding for a whole commit, as the SQLite and in-memory stores hold it; a state handed over as
  an :class:`~accord.engine.machine.encoding.EncodedDoc` keeps the text it carries
  (:func:`state_text`).
- ``Commit.index`` maps to searchable columns: ``status``, ``workflow`` and ``tenant`` are
  columns, ``updated_at`` (epoch ms as a string; the store's clock when absent) orders
  :meth:`list_runs`, and any other key is a label. A key absent from a commit keeps its value.
- Retention (:meth:`~accord.engine.ports.Store.prune`): a run is *ended* when its ``status``
  column is one of :data:`ENDED`; it may be removed once its ``updated_at`` (its last commit, so
  never before it ended) is older than the cutoff. Stores remove at most :data:`PRUNE_STEP` runs
  per transaction or script, so a large prune never holds the store for long.
- Filter and label names are identifiers (``[A-Za-z_][A-Za-z0-9_]*``), never free text, so no
  caller-supplied string is ever spliced into SQL or a key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from accord.canonical import canonical_json
from accord.engine.machine.encoding import EncodedDoc
from accord.engine.machine.state import RUN_TERMINAL
from accord.engine.ports import Commit
from accord.errors import StoreError

__all__ = [
    "COLUMNS",
    "ENDED",
    "PRUNE_STEP",
    "SHARED_OPTS",
    "EncodedCommit",
    "activation_rows",
    "check_commit",
    "dump",
    "encode_commit",
    "int_option",
    "plan_changed",
    "prefix_option",
    "redis_db",
    "run_filters_sql",
    "split_index",
    "state_text",
    "unknown_plan",
    "updated_at",
]

COLUMNS = ("status", "workflow", "tenant")
ENDED = tuple(sorted(RUN_TERMINAL))  # the statuses a run ends in: only these are ever pruned
PRUNE_STEP = 100  # runs removed per transaction (or per pipelined round of scripts)
# A store URL may carry the embedded transport's options, so one URL opens both.
MAX_SHARDS = 1024  # a store's shard count is from 1 to this, fixed when it is created


def check_shards(shards: Sequence[int], count: int) -> list[int]:
    """``shards`` as a list of distinct shard numbers of a store with ``count`` shards; a number
    out of range is refused by name (a caller's bug, never silently ignored)."""
    out = list(dict.fromkeys(shards))
    bad = [s for s in out if not isinstance(s, int) or not 0 <= s < count]
    if bad:
        raise ValueError(f"shard(s) {bad} out of range: the store has shards 0 to {count - 1}")
    return out


def shard_count_option(options: Mapping[str, str], default: int) -> int:
    """The ``shards`` URL option: how many shards a store is created with (see ports.Shards)."""
    count = int_option(options, "shards", default)
    if not 1 <= count <= MAX_SHARDS:
        raise ValueError(f"shards={count}: a store has from 1 to {MAX_SHARDS} shards")
    return count


SHARED_OPTS = frozenset({"visibility_ms", "max_deliveries", "dedup_ms", "poll_ms"})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def dump(value: Any, what: str) -> str:
    try:
        return canonical_json(value).decode("utf-8")
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{what} is not JSON-serialisable: {exc}") from exc


def load(text: str) -> Any:
    return json.loads(text)


def check_commit(commit: Commit) -> None:
    if commit.expected_version < 0:
        raise StoreError(f"commit of {commit.run_id!r}: expected_version must be >= 0")
    if not commit.run_id:
        raise StoreError("commit: run_id is empty")
    for key in commit.index:
        _check_name(key, "index key")


def state_text(state: dict[str, Any]) -> str:
    """The state's canonical text: the one it carries (see EncodedDoc), else encoded here."""
    return state.canonical if isinstance(state, EncodedDoc) else dump(state, "state")


@dataclass(frozen=True, slots=True)
class EncodedCommit:
    """A checked commit as canonical text, every field that is not JSON already refused."""

    state: str
    history: list[str]
    outbox: list[tuple[str, str, str, str, int]]  # entry_id, run_id, topic, payload, created_at
    timers: list[tuple[str, str, int, str]]  # timer_id, run_id, due_at, payload
    columns: tuple[str | None, ...]  # the values of COLUMNS, None where the index has none
    labels: dict[str, str]
    updated_at: int


def encode_commit(commit: Commit, now_ms: int) -> EncodedCommit:
    """Check ``commit`` (:func:`check_commit`) and encode it; an outbox entry without its own
    ``created_at_ms`` and an index without ``updated_at`` take ``now_ms``."""
    check_commit(commit)
    state = state_text(commit.state)
    history = [dump(h, f"history[{i}]") for i, h in enumerate(commit.history)]
    outbox = [
        (e.entry_id, e.run_id, e.topic, dump(e.payload, f"outbox[{i}].payload"),
         e.created_at_ms or now_ms)
        for i, e in enumerate(commit.outbox)
    ]  # fmt: skip
    timers = [
        (t.timer_id, t.run_id, t.due_at_ms, dump(t.payload, f"timers_set[{i}]"))
        for i, t in enumerate(commit.timers_set)
    ]  # fmt: skip
    columns, labels = split_index(commit.index)
    return EncodedCommit(
        state, history, outbox, timers, columns, labels, updated_at(commit.index, now_ms)
    )


def _check_name(name: str, what: str) -> None:
    if not _NAME.match(name):
        raise StoreError(f"{what} {name!r} is not an identifier ([A-Za-z_][A-Za-z0-9_]*)")


def split_index(index: Mapping[str, str]) -> tuple[tuple[str | None, ...], dict[str, str]]:
    columns = tuple(index.get(c) for c in COLUMNS)
    labels = {k: v for k, v in index.items() if k not in COLUMNS and k != "updated_at"}
    return columns, labels


def updated_at(index: Mapping[str, str], now_ms: int) -> int:
    raw = index.get("updated_at")
    if raw is None:
        return now_ms
    try:
        return int(raw)
    except ValueError:
        raise StoreError(f"index updated_at={raw!r}: expected epoch milliseconds") from None


def run_filters_sql(filters: Mapping[str, str]) -> tuple[str, list[str]]:
    """``WHERE`` clause and parameters for :meth:`Store.list_runs` filters."""
    clauses, params = [], []
    for key, value in sorted(filters.items()):
        _check_name(key, "list_runs filter")
        if key in COLUMNS:
            clauses.append(f"{key} = ?")
        else:
            clauses.append(f"json_extract(labels, '$.{key}') = ?")
        params.append(value)
    return ("WHERE " + " AND ".join(clauses)) if clauses else "", params


def matches(columns: Mapping[str, str | None], labels: Mapping[str, str], **filters: str) -> bool:
    for key, value in filters.items():
        _check_name(key, "list_runs filter")
        have = columns.get(key) if key in COLUMNS else labels.get(key)
        if have != value:
            return False
    return True


def int_option(options: Mapping[str, str], name: str, default: int) -> int:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"option {name}={raw!r}: expected an integer") from None


# A prefix in a URL is a key or queue-name namespace: ':' is the key separator, '*' and '?' are
# glob patterns to SCAN and topic bindings, braces pick a Redis Cluster hash slot.
_PREFIX = re.compile(r"[A-Za-z0-9._@/+=-]{1,200}\Z")


def prefix_option(options: Mapping[str, str], default: str, *, empty: bool = False) -> str:
    """The ``prefix`` option of a URL, refused (``ValueError`` naming it) unless it is 1-200
    characters from ``[A-Za-z0-9._@/+=-]`` (or empty, where ``empty`` allows it)."""
    value = options.get("prefix", default)
    if (value == "" and empty) or (_PREFIX.match(value) and ".." not in value.split("/")):
        return value
    raise ValueError(
        f"option prefix={value!r}: a prefix is a key namespace, expected 1-200 characters from"
        " [A-Za-z0-9._@/+=-] (no ':', '*', braces, spaces or newlines)"
    )


def redis_db(path: str) -> int:
    """The database number of a ``redis://host:port/N`` URL's path (``/`` or none: 0)."""
    name = path.removeprefix("/")
    if not name:
        return 0
    if not name.isascii() or not name.isdigit() or len(name) > 5:
        raise ValueError(f"database {name!r}: expected a number, as in redis://host:6379/0")
    return int(name)


def plan_changed(digest: str) -> str:
    return f"plan {digest} is already stored with different content; plans are immutable"


def unknown_plan(workflow: str, digest: str) -> str:
    return f"cannot activate {digest} for workflow {workflow!r}: no plan stored under that digest"


def activation_rows(rows: list[tuple[str, int]]) -> list[dict[str, Any]]:
    last = len(rows) - 1
    return [
        {"digest": d, "activated_at_ms": at, "active": i == last} for i, (d, at) in enumerate(rows)
    ]
