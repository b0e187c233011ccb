"""Whether a job's attempt is still the one the engine waits for, before its handler runs.

The engine supersedes an attempt when a deadline passes (queue, execution, heartbeat), when the run
is cancelled or ends, and fences it: whatever the attempt reports afterwards is refused as
``stale``. Its job may still reach a worker — RabbitMQ cannot take a message back from the middle
of a queue, a job already taken stays with its worker, and a job republished from the outbox comes
back — and running it would only spend the handler's work on an answer nobody reads, and repeat
its side effects. So the worker runtime looks before it runs:

- :class:`CancelledFences` remembers the fences of the cancellation requests its control queues
  brought (a request can arrive before its job is taken); a request is only ever sent for a
  fenced attempt, so a remembered fence is superseded for certain;
- a :data:`Current` check, when the worker can read the engine's store (``accord worker run
  --store``), reads the run record (:func:`store_current`).

The record is read defensively: only what it positively shows counts as superseded — a later
attempt of the stage, this attempt concluded or fenced, or the run ended. A record that knows
nothing of the attempt yet (a lagging replica, a run pruned long after it ended) or a store that
cannot be read leaves the job to run as before: the engine's own fencing still decides whether
the answer counts, so a wrong "current" costs only the work this check saves, never correctness.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from accord.engine.ports import Store

__all__ = ["CANCELLED_KEPT", "CancelledFences", "Current", "attempt_is_current", "store_current"]

# ``(run_id, stage, attempt, fence) -> whether the attempt is still the stage's current one``
Current = Callable[[str, str, int, str], Awaitable[bool]]

CANCELLED_KEPT = 65_536  # fences of cancellation requests remembered (oldest forgotten first)
_LIVE = frozenset({"queued", "running"})  # an attempt the engine still waits for
_ENDED = frozenset({"completed", "failed", "cancelled"})


class CancelledFences:
    """The fences named by cancellation requests, the latest ``limit`` of them."""

    def __init__(self, limit: int = CANCELLED_KEPT) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self._limit = limit
        self._fences: OrderedDict[tuple[str, str], None] = OrderedDict()

    def add(self, stage: str, fence: str) -> None:
        self._fences[(stage, fence)] = None
        self._fences.move_to_end((stage, fence))
        while len(self._fences) > self._limit:
            self._fences.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        return key in self._fences

    def __len__(self) -> int:
        return len(self._fences)


def attempt_is_current(
    state: Mapping[str, Any] | None, stage: str, attempt: int, fence: str
) -> bool:
    """Whether run record ``state`` (the store's JSON) leaves attempt ``attempt`` with ``fence``
    of ``stage`` live. ``False`` only when the record shows it superseded (module docstring)."""
    if not isinstance(state, Mapping):
        return True  # nothing on record (yet, or any more): not known to be superseded
    if state.get("status") in _ENDED:
        return False
    stages = state.get("stages")
    record = stages.get(stage) if isinstance(stages, Mapping) else None
    if not isinstance(record, Mapping):
        return True
    latest = record.get("attempt")
    if not isinstance(latest, int) or latest < attempt:
        return True  # the record predates this attempt
    if latest > attempt:
        return False  # a later attempt of the stage was issued
    attempts = record.get("attempts")
    mine = attempts[-1] if isinstance(attempts, list) and attempts else None
    if not isinstance(mine, Mapping) or mine.get("attempt") != attempt:
        return True
    if str(mine.get("fence")) != fence:
        return False  # this attempt number was issued under another fence
    return mine.get("status") in _LIVE


def store_current(store: Store) -> Current:
    """A :data:`Current` check reading the run record from the engine's ``store``."""

    async def current(run_id: str, stage: str, attempt: int, fence: str) -> bool:
        stored = await store.load(run_id)
        return attempt_is_current(stored.state if stored else None, stage, attempt, fence)

    return current
