"""The pure state machine of a run: events in, the next record, effects and history out.

This package does no I/O (the import-linter layers contract holds it to that); the async shell
that loads, commits and hands off is :mod:`accord.engine.runtime`.

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

from accord.engine.machine.core import ENGINE_VERSION, Transition, apply

__all__ = ["ENGINE_VERSION", "Transition", "apply"]
