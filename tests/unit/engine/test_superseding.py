"""Superseding an attempt names its job: what the shell withdraws from the broker.

The dispatcher takes back the job of every attempt the machine fences (queue, execution and
heartbeat deadlines, a cancelled run, a run deadline) from its cancellation request alone, so the
request must name exactly the job the attempt was dispatched as and the queue it went to —
including an attempt still ``queued``, never accepted by any worker.
"""

from __future__ import annotations

from accord.engine.machine.core import Transition
from accord.engine.machine.effects import DispatchJob, RequestCancellation
from accord.engine.machine.events import CancelRequested
from accord.engine.runtime.outbox import cancelled_job, control_queue, entry_for, withdrawal
from accord.workflow.plan import RetryPolicy, Timeouts
from tests.unit.engine import plans
from tests.unit.engine.sim import Sim

RETRY = RetryPolicy(max_attempts=3, initial_backoff_ms=1_000, max_backoff_ms=10_000)


def _sim() -> Sim:
    timeouts = Timeouts(execution_deadline_ms=10_000, heartbeat_timeout_ms=2_000)
    sim = Sim(plans.linear(retry=RETRY, timeouts=timeouts, deadline_ms=3_600_000))
    sim.start()
    return sim


def _withdrawn(sim: Sim, tr: Transition) -> tuple[str, str]:
    """The job the transition's one cancellation request withdraws, checked against the job
    the attempt was dispatched as."""
    (cancel,) = [e for e in tr.effects if isinstance(e, RequestCancellation)]
    (job,) = [d for d in sim.dispatched if isinstance(d, DispatchJob) and d.job_id == cancel.job_id]
    assert job.envelope["fence"] == cancel.fence and job.envelope["attempt"] == cancel.attempt
    entry = entry_for(sim.run_id, cancel, 0)
    assert entry is not None
    found = withdrawal(entry)
    assert found == (job.queue, job.job_id)
    # the same job, from the control message a joint commit turns the entry into
    assert cancelled_job(control_queue(job.queue), entry.entry_id) == found
    return found


def test_rule_every_superseded_attempt_names_its_job_for_withdrawal() -> None:
    sim = _sim()  # attempt 1 of "a" queued: its queue deadline passes, nobody accepted it
    _withdrawn(sim, sim.fire(sim.timer("queue", "a")))
    sim.fire(sim.timer("retry", "a"))
    sim.accept("a")  # attempt 2 running: silent past its heartbeat timeout
    _withdrawn(sim, sim.fire(sim.timer("heartbeat", "a")))
    sim.fire(sim.timer("retry", "a"))
    sim.accept("a")  # attempt 3, beating, past its execution deadline
    sim.now += 1_500
    sim.heartbeat("a")
    for _ in range(6):
        sim.now += 1_500
        sim.heartbeat("a")
    assert sim.state.stages["a"].attempt == 3
    _withdrawn(sim, sim.fire(sim.timer("execution", "a")))
    other = _sim()  # an operator's cancel fences the queued attempt
    _withdrawn(other, other.apply(CancelRequested(run_id=other.run_id, reason="no longer needed")))
    late = _sim()  # the run deadline passes with the attempt queued
    _withdrawn(late, late.fire(late.timer("run")))


def test_an_action_or_another_entry_withdraws_nothing() -> None:
    cancel = RequestCancellation(job_id="job_x", queue=None, stage="@finaliser/0", attempt=1,
                                 fence="f" * 32)  # fmt: skip
    entry = entry_for("run-1", cancel, 0)
    assert entry is not None and withdrawal(entry) is None
    job = DispatchJob(job_id="job_y", queue="alpha", capability="alpha@1", envelope={})
    entry = entry_for("run-1", job, 0)
    assert entry is not None and withdrawal(entry) is None
    assert cancelled_job("alpha", "job_y:cancel") is None  # not a control queue
    assert cancelled_job(control_queue("alpha"), "job_y") is None  # not a cancel
    assert cancelled_job(control_queue(None), "job_y:cancel") is None  # an action's
