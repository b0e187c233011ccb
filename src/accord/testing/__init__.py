"""The public testing API: run the real engine in-process, on a clock you control.

- :class:`EngineHarness` — engine + memory store + memory queue + :class:`FakeClock`; start runs,
  deliver outcomes (duplicates, stale fences, late callbacks, reorderings), fire timers, advance
  time, crash and restart, and read runs, histories, effects and the outbox.
- :func:`run_noop_worker` / :func:`outcome` — a minimal worker loop and outcome envelopes.
- :mod:`accord.testing.invariants` — ``assert_i*`` checks of docs/reliability.md and
  :class:`RunAuditor`, which checks them incrementally after every step.
- :mod:`accord.testing.plans` — hand-built plans of the model-ingest shape;
  :mod:`accord.testing.strategies` — Hypothesis strategies for valid workflows.

Submodules are imported lazily, so ``import accord.testing`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accord.testing.clock import FakeClock
    from accord.testing.harness import EngineHarness
    from accord.testing.invariants import RunAuditor, assert_run_invariants
    from accord.testing.workers import outcome, run_noop_worker

__all__ = [
    "EngineHarness",
    "FakeClock",
    "RunAuditor",
    "assert_run_invariants",
    "outcome",
    "run_noop_worker",
]

_HOMES = {
    "EngineHarness": "accord.testing.harness",
    "FakeClock": "accord.testing.clock",
    "RunAuditor": "accord.testing.invariants",
    "assert_run_invariants": "accord.testing.invariants",
    "outcome": "accord.testing.workers",
    "run_noop_worker": "accord.testing.workers",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'accord.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
