"""Admission bounds for workflow definitions, in one place so they are reviewed together.

Every bound exists to keep a plan checkable, storable and runnable in predictable time: the
compiler's checks are linear or near-linear in these sizes, and the engine's per-run state is
bounded by them. Durations are milliseconds.
"""

from __future__ import annotations

from accord.workflow.values import TERMINALS

__all__ = [
    "MAX_ATTEMPTS",
    "MAX_BACKOFF_MS",
    "MAX_CACHE_TTL_MS",
    "MAX_DEADLINE_MS",
    "MAX_DECISION_BRANCHES",
    "MAX_EXECUTION_MS",
    "MAX_FAN_OUT",
    "MAX_INPUT_BYTES",
    "MAX_MULTIPLIER",
    "MAX_QUEUE_MS",
    "MAX_STAGES",
    "NAME_PATTERN",
    "TERMINALS",
]

MAX_STAGES = 2_000
MAX_FAN_OUT = 32  # fork branches
MAX_DECISION_BRANCHES = 32
MAX_INPUT_BYTES = 64 * 1024  # canonical JSON of a stage's literal input
MAX_ATTEMPTS = 20
MAX_BACKOFF_MS = 3_600_000  # one hour between attempts
MAX_MULTIPLIER = 10.0
MAX_QUEUE_MS = 86_400_000  # one day waiting for acceptance
MAX_EXECUTION_MS = 7 * 86_400_000  # one week running
MAX_DEADLINE_MS = 30 * 86_400_000  # thirty days for a whole run
MAX_CACHE_TTL_MS = 30 * 86_400_000
NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"
