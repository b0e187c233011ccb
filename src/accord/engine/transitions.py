"""The rules of a run, and the table of legal state changes.

The engine is a sans-I/O state machine: :func:`accord.engine.machine.apply` takes a compiled plan,
a run record and one event, and returns the next record, the effects the shell must carry out and
the history entry that records the event. It reads no clock, draws no random numbers and does no
I/O; time and entropy arrive *on* the event. Folding a run's history from empty therefore rebuilds
its record exactly (I12), and the shell can commit record, history, outbox and timers in one
compare-and-set step (I7) without the machine knowing how.

**Attempts and fences.** Every dispatch of a stage is an attempt with a number and a fence: a
sha256 over the event's entropy and the attempt's identity, never a counter (I3). A callback
(accepted, heartbeat, progress, succeeded, failed, poison) counts only when stage, attempt and
fence all equal the current attempt and that attempt is live. Otherwise it is *recorded* and
refused: ``stale`` (an earlier attempt, a wrong fence, or an attempt already fenced by a timeout
or cancellation), ``duplicate`` (the current attempt already concluded: acknowledged, nothing is
released twice, I2), ``unknown-attempt`` (an attempt or stage never issued) or ``late`` (the run
already has a terminal intent, I5 — finaliser and compensation callbacks excepted, they are how
the run ends). A refusal changes nothing but ``seq``.

**Edges.** Success, failure, decision branches, fork branches and join successors are edges
``source->target``. An edge is released at most once, recorded in ``released`` (I4). Decisions,
forks and joins are instantaneous: they are resolved inside the transition that reaches them. A
fork records each branch it releases; a join records each branch that *arrives*, with the state
it arrived in, in the run record itself, and releases its successor once, when every required
branch has arrived — along ``on_success`` if all arrived in acceptable states, else
``on_failure``. Nothing is gathered in memory.

**Clocks.** Three durable timers bound every attempt and run (I6): the queue deadline (dispatch
→ acceptance), the execution deadline and heartbeat (acceptance → result), and the run deadline.
Timer ids are deterministic per (stage, attempt, kind), so re-arming replaces. A timer that fires
for an attempt that is no longer live, or before its due time, is a recorded no-op. An expired
attempt is fenced first (cooperative cancellation requested) and only then retried or failed.

**Retries.** A failure is retried when it is retryable, its class is in ``retry_on`` and attempts
are left; the retry is a new attempt with a new fence after ``RetryPolicy.backoff_ms`` with
jitter drawn from the event's entropy. Terminal failures, exhausted retries, binding errors and
poison reports (``quarantined``, with reconcile metadata) follow ``on_failure``.

**Intent and the end of a run.** Reaching a terminal (``completed``/``failed``), the run deadline
or an operator cancel sets the terminal *intent* once. Setting it fences every live attempt and
requests its cancellation — remote work is never assumed to have stopped. A failed intent then
compensates completed stages that declare ``compensate``, newest first, one at a time; then the
plan's finalisers run once each, in declared order, all attempted even if one fails. The run ends
``completed`` only if the intent was completed and every finaliser succeeded; ``cancelled`` if an
operator cancelled it; otherwise ``failed`` (``finaliser_failure_terminal``).

**Re-drive.** An operator may re-drive a failed, timed-out, quarantined or cancelled task stage
only while the run has no terminal intent: compensations and finalisers start in the same
transition that sets the intent, so there is no moment at which clearing it would be safe. A
failed run is repaired by starting a new run. The re-driven stage gets a new fenced attempt and a
fresh retry budget; edges it already released are never released again.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "ATTEMPT_TRANSITIONS",
    "RUN_TRANSITIONS",
    "STAGE_TRANSITIONS",
    "IllegalTransition",
    "check_stage",
]

_FAILED_LIKE = frozenset({"failed", "timed-out", "quarantined", "cancelled"})

STAGE_TRANSITIONS: Mapping[str, frozenset[str]] = {
    # decision/fork/join resolve instantly; a binding error fails a task before dispatch
    "pending": frozenset({"queued", "running", "completed", "failed", "cancelled"}),
    "queued": frozenset({"running", "completed", "failed", "retry-scheduled"} | _FAILED_LIKE),
    "running": frozenset({"completed", "retry-scheduled"} | _FAILED_LIKE),
    "retry-scheduled": frozenset({"queued", "running", "cancelled"}),
    "completed": frozenset(),
    # operator re-drive: a new fenced attempt (or a new binding error)
    "failed": frozenset({"queued", "running", "failed"}),
    "timed-out": frozenset({"queued", "running", "failed"}),
    "quarantined": frozenset({"queued", "running", "failed"}),
    "cancelled": frozenset({"queued", "running", "failed"}),
    "skipped": frozenset(),
}

ATTEMPT_TRANSITIONS: Mapping[str, frozenset[str]] = {
    "queued": frozenset(
        {"running", "succeeded", "failed", "timed-out", "cancelled", "quarantined"}
    ),
    "running": frozenset({"succeeded", "failed", "timed-out", "cancelled", "quarantined"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "timed-out": frozenset(),
    "cancelled": frozenset(),
    "quarantined": frozenset(),
}

RUN_TRANSITIONS: Mapping[str, frozenset[str]] = {
    "running": frozenset({"finalising"}),
    "finalising": frozenset({"completed", "failed", "cancelled"}),
    "completed": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}


class IllegalTransition(AssertionError):
    """The machine tried a change the table forbids: a bug in the machine, never a domain
    outcome (those come back as recorded rejections)."""


def check_stage(name: str, old: str, new: str) -> None:
    if old != new and new not in STAGE_TRANSITIONS[old]:
        raise IllegalTransition(f"stage {name!r}: {old} -> {new} is not a legal transition")


def check_attempt(name: str, old: str, new: str) -> None:
    if old != new and new not in ATTEMPT_TRANSITIONS[old]:
        raise IllegalTransition(f"attempt of {name!r}: {old} -> {new} is not a legal transition")


def check_run(run_id: str, old: str, new: str) -> None:
    if old != new and new not in RUN_TRANSITIONS[old]:
        raise IllegalTransition(f"run {run_id!r}: {old} -> {new} is not a legal transition")
