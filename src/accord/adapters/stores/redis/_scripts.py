"""The store's Lua scripts, loaded from their protocol files, and the codes they return.

Each ``*.lua`` file in this package is one script; the number in its name is its key count, and
its header lists KEYS and ARGV. :class:`Scripts` registers them on a client (redis-py runs them
with ``EVALSHA`` and falls back to ``EVAL`` after a restart emptied the script cache). Every script
validates all of its input before its first write, because Redis does not roll back a script that
fails half-way; negative return codes (:class:`ScriptCode`) report refusals without an error.
"""

from __future__ import annotations

from enum import IntEnum
from importlib.resources import files
from typing import Any

__all__ = ["ScriptCode", "Scripts", "script_text"]


class ScriptCode(IntEnum):
    """Negative first element of a script's reply."""

    RUN_EXISTS = -1  # create expected, but the run is there
    VERSION_MISMATCH = -2  # compare-and-set lost: detail is the stored version ("" if none)
    OUTBOX_ID_TWICE = -3  # the same entry id twice in one commit
    OUTBOX_ID_PENDING = -4  # the entry id is still pending from an earlier commit
    MALFORMED = -5  # arguments that the Python side should never have built


def script_text(name: str) -> str:
    return files(__package__).joinpath(name).read_text(encoding="utf-8")


class Scripts:
    """The registered scripts of one client."""

    def __init__(self, client: Any) -> None:
        self.commit = client.register_script(script_text("commit-8.lua"))
        self.claim_outbox = client.register_script(script_text("claim-outbox-2.lua"))
        self.done_outbox = client.register_script(script_text("done-outbox-3.lua"))
        self.claim_timers = client.register_script(script_text("claim-timers-3.lua"))
        self.announce = client.register_script(script_text("announce-2.lua"))
