"""ARGV for ``commit-8.lua``, built from a :class:`~accord.engine.ports.Commit`.

Everything that can be refused on the client side is refused here, before Redis is asked: JSON
that does not serialise (the same :class:`~accord.errors.StoreError` naming the field as the other
stores), index values that are not strings, an ``updated_at`` outside the index's range. The
script checks the shape again (counts, numbers) before its first write.
"""

from __future__ import annotations

from accord.adapters import _store_rules as rules
from accord.adapters.stores.redis.keys import order_key
from accord.engine.ports import Commit
from accord.errors import StoreError

__all__ = ["commit_args"]


def commit_args(commit: Commit, now_ms: int) -> list[str | int]:
    state = rules.dump(commit.state, "state")
    history = [rules.dump(h, f"history[{i}]") for i, h in enumerate(commit.history)]
    outbox: list[str | int] = []
    for i, e in enumerate(commit.outbox):
        payload = rules.dump(e.payload, f"outbox[{i}].payload")
        outbox += [e.entry_id, e.run_id, e.topic, payload, e.created_at_ms or now_ms]
    timers: list[str | int] = []
    for i, t in enumerate(commit.timers_set):
        timers += [t.timer_id, t.due_at_ms, rules.dump([t.run_id, t.due_at_ms, t.payload],
                                                      f"timers_set[{i}]")]  # fmt: skip
    for key, value in commit.index.items():
        if not isinstance(value, str):
            raise StoreError(f"commit of {commit.run_id!r}: index {key}={value!r} is not a string")
    index = {k: v for k, v in commit.index.items() if k != "updated_at"}
    order = order_key(rules.updated_at(commit.index, now_ms))
    counts = [len(history), len(commit.outbox), len(commit.timers_set), len(commit.timers_cancel)]
    return [
        commit.expected_version, state, order, rules.dump(index, "index"), commit.run_id,
        *counts, *history, *outbox, *timers, *commit.timers_cancel,
    ]  # fmt: skip
