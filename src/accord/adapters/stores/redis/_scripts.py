"""The store's Lua scripts, loaded from their protocol files, and the codes they return.

Each ``*.lua`` file in this package is one script; the number in its name is its key count, and
its header lists KEYS and ARGV. :class:`Scripts` registers them on a client; the store sends them
with ``EVALSHA`` through its call group (``_redis_group.py``), which loads a script again after a
restart emptied the script cache (``announce`` goes through redis-py's own loader). Every script
validates all of its input before its first write, because Redis does not roll back a script that
fails half-way; negative return codes (:class:`ScriptCode`) report refusals without an error.

:func:`commit_args` builds the commit script's ARGV. Everything that can be refused on the client
side is refused there, before Redis is asked: JSON that does not serialise (the same
:class:`~accord.errors.StoreError` naming the field as the other stores), index values that are
not strings, an ``updated_at`` outside the index's range. A state handed over as an
:class:`~accord.engine.machine.encoding.EncodedDoc` is stored as the text it carries; the other
documents are encoded with the shared canonical encoder, and only when one fails are they encoded
again one by one to name the field. A commit's :class:`~accord.engine.ports.Fence` travels as two
arguments (owner, epoch), empty when there is none; the script checks it against the shard's
lease before the version (``commit-9.lua``, code :attr:`ScriptCode.OWNERSHIP_LOST`).
"""

from __future__ import annotations

from enum import IntEnum
from importlib.resources import files
from typing import Any

from accord.adapters import _store_rules as rules
from accord.adapters.stores.redis.keys import order_key
from accord.engine.machine.encoding import canonical_text as _text
from accord.engine.ports import Commit
from accord.errors import StoreError

__all__ = ["ScriptCode", "Scripts", "commit_args", "script_text"]


class ScriptCode(IntEnum):
    """Negative first element of a script's reply."""

    RUN_EXISTS = -1  # create expected, but the run is there
    VERSION_MISMATCH = -2  # compare-and-set lost: detail is the stored version ("" if none)
    OUTBOX_ID_TWICE = -3  # the same entry id twice in one commit
    OUTBOX_ID_PENDING = -4  # the entry id is still pending from an earlier commit
    MALFORMED = -5  # arguments that the Python side should never have built
    OWNERSHIP_LOST = -6  # the commit's fence no longer holds: detail is the lease's owner, epoch


def script_text(name: str) -> str:
    return files(__package__).joinpath(name).read_text(encoding="utf-8")


class Scripts:
    """The registered scripts of one client."""

    def __init__(self, client: Any) -> None:
        self.commit = client.register_script(script_text("commit-9.lua"))
        self.claim_outbox = client.register_script(script_text("claim-outbox-2.lua"))
        self.done_outbox = client.register_script(script_text("done-outbox-3.lua"))
        self.claim_timers = client.register_script(script_text("claim-timers-3.lua"))
        self.announce = client.register_script(script_text("announce-2.lua"))
        self.prune = client.register_script(script_text("prune-3.lua"))
        self.hold_lease = client.register_script(script_text("hold-lease-1.lua"))
        self.release_lease = client.register_script(script_text("release-lease-1.lua"))
        self.beat = client.register_script(script_text("beat-1.lua"))


def commit_args(commit: Commit, now_ms: int) -> list[str | int]:
    state_text = rules.state_text(commit.state)
    for key, value in commit.index.items():
        if not isinstance(value, str):
            raise StoreError(f"commit of {commit.run_id!r}: index {key}={value!r} is not a string")
    index = {k: v for k, v in commit.index.items() if k != "updated_at"}
    order = order_key(rules.updated_at(commit.index, now_ms))
    outbox, timers = commit.outbox, commit.timers_set
    try:
        history = [_text(h) for h in commit.history]
        boxes: list[str | int] = []
        for e in outbox:
            boxes += (e.entry_id, e.run_id, e.topic, _text(e.payload), e.created_at_ms or now_ms)
        marks = [
            value
            for t in timers
            for value in (t.timer_id, t.due_at_ms, _text([t.run_id, t.due_at_ms, t.payload]))
        ]
        index_text = _text(index)
    except (TypeError, ValueError):
        _name_the_culprit(commit)
        raise
    fence = commit.fence
    owner, epoch = ("", "") if fence is None else (fence.owner, str(fence.epoch))
    return [
        commit.expected_version, state_text, order, index_text, commit.run_id,
        len(history), len(outbox), len(timers), len(commit.timers_cancel), owner, epoch,
        *history, *boxes, *marks, *commit.timers_cancel,
    ]  # fmt: skip


def _name_the_culprit(commit: Commit) -> None:
    """Raise the :class:`StoreError` naming the first field of ``commit`` that is not JSON."""
    for i, h in enumerate(commit.history):
        rules.dump(h, f"history[{i}]")
    for i, e in enumerate(commit.outbox):
        rules.dump(e.payload, f"outbox[{i}].payload")
    for i, t in enumerate(commit.timers_set):
        rules.dump([t.run_id, t.due_at_ms, t.payload], f"timers_set[{i}]")
    rules.dump(commit.index, "index")
