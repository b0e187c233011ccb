"""Deterministic identities: job, message, timer and telemetry ids, fences, jitter.

Everything the machine names is a pure function of the run and the event that caused it, so a
replay names things identically (I12) and a republished effect collides with its first copy
instead of doubling it (I4, I7). Two kinds of value need more than determinism:

- **Fences** must be unforgeable and never issued twice, even if a store loses a suffix of writes
  and the same attempt number is handed out again. A fence is therefore a sha256 over the
  shell's fresh ``entropy`` (random hex stamped on the event) *and* the run, stage, attempt and
  history position. Knowing every earlier fence does not let anyone predict the next one.
- **Jitter** for retry backoff is drawn from the same entropy, so it is random at run time and
  identical on replay.

Ids are prefixed hashes rather than joined names: stage names may hold ``/`` and ``@``, and queue
backends restrict the characters of custom job ids.
"""

from __future__ import annotations

import time
from functools import lru_cache
from hashlib import sha256

__all__ = [
    "edge_id",
    "fence_for",
    "idempotency_key",
    "iso_ms",
    "job_id",
    "message_id",
    "telemetry_id",
    "timer_id",
    "trace_sampled",
    "traceparent",
    "unit_random",
]

_SEP = "\x1f"


def _h(*parts: object) -> str:
    return sha256(_SEP.join(map(str, parts)).encode("utf-8")).hexdigest()


# ids of one run are asked for again and again (a timer is armed, then cancelled; an envelope is
# rebuilt); they are pure, so a bounded cache is safe and keeps hashing off the hot path
_cached = lru_cache(maxsize=16_384)


def fence_for(entropy: str, run_id: str, stage: str, attempt: int, seq: int) -> str:
    """A fresh fence: 32 hex digits, never a counter; compared exactly."""
    return _h("fence", entropy, run_id, stage, attempt, seq)[:32]


@_cached
def job_id(run_id: str, stage: str, attempt: int) -> str:
    return "job_" + _h("job", run_id, stage, attempt)[:32]


@_cached
def message_id(run_id: str, stage: str, attempt: int) -> str:
    return "msg_" + _h("msg", run_id, stage, attempt)[:32]


@_cached
def idempotency_key(run_id: str, stage: str) -> str:
    """Stable across attempts: a retried side effect is recognisable as the same one."""
    return "idem_" + _h("idem", run_id, stage)[:32]


@_cached
def timer_id(run_id: str, stage: str, attempt: int, kind: str) -> str:
    """Per (stage, attempt, kind), so re-arming a heartbeat replaces the earlier timer."""
    return "tmr_" + _h("timer", run_id, stage, attempt, kind)[:32]


def telemetry_id(run_id: str, seq: int, name: str, subject: str = "") -> str:
    """Unique per (run, history entry, event name, subject): no hashing needed."""
    return f"{run_id}/{seq}/{name}/{subject}"


def edge_id(source: str, target: str) -> str:
    return f"{source}->{target}"


@_cached
def traceparent(run_id: str, stage: str, attempt: int, sampled: bool = True) -> str:
    """W3C trace context: one trace per run, one span per attempt; the trace flags carry the
    engine's sampling decision for the run (``-01`` sampled, ``-00`` not)."""
    flags = "01" if sampled else "00"
    return f"00-{_h('trace', run_id)[:32]}-{_h('span', run_id, stage, attempt)[:16]}-{flags}"


def trace_sampled(run_id: str, ratio: float) -> bool:
    """Whether a run's trace is kept at ``ratio``: OpenTelemetry's ``TraceIdRatioBased`` test
    (the low 64 bits of the trace id under ``round(ratio * 2**64)``) on the run's trace id."""
    if ratio >= 1.0:
        return True
    low = int(_h("trace", run_id)[16:32], 16)
    return low < round(max(ratio, 0.0) * (1 << 64))


def unit_random(entropy: str, *parts: object) -> float:
    """A number in [0, 1) drawn from the event's entropy."""
    return int(_h("unit", entropy, *parts)[:13], 16) / float(16**13)


def iso_ms(at_ms: int) -> str:
    """RFC 3339 UTC with milliseconds; pure arithmetic on a given instant, no clock read."""
    seconds, millis = divmod(at_ms, 1000)
    return f"{_iso_seconds(seconds)}.{millis:03d}Z"


@lru_cache(maxsize=1024)
def _iso_seconds(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
