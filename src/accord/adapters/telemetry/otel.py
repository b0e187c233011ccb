"""OpenTelemetry traces: engine spans built from the telemetry outbox, worker spans continuing the
envelope's ``traceparent`` (docs/observability.md, "Traces").

Off unless an OTLP endpoint is configured by the standard variables
(``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``;
``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` turn it off again). When off,
:func:`tracing` returns ``None``, :func:`worker_span` is a shared no-op context manager and nothing
of the SDK is imported.

One trace per run, with ids the engine already derives (``accord.engine.machine.ids.traceparent``):

    accord.run <workflow>                 span id from the run id; from run.started to run.terminal
      accord.attempt <stage>#<n>          span id = the envelope's traceparent span id
        accord.dispatch <stage>           the hand-off of the job (commit to sink)
        accord.execute <stage>            in the worker (Python SDK, TypeScript worker)
        accord.outcome <stage>            the outcome the engine accepted or refused

Attributes name the run, stage, attempt, capability and contract version, never a payload value.
Spans are built from the events the engine commits, so their times are the engine's commit times;
an engine restarted mid-run still closes the spans (a start it no longer remembers becomes the end).

**Sampling** keeps or drops a run's trace whole. The ratio is ``--trace-sample RATIO`` (``accord
engine run``, ``accord serve``, :func:`register`) or the standard ``OTEL_TRACES_SAMPLER`` and
``OTEL_TRACES_SAMPLER_ARG`` (``always_on``, ``always_off``, ``traceidratio``, ``parentbased_*``;
default 1.0); the SDK's sampler is ``ParentBased(TraceIdRatioBased(ratio))``. The engine decides
once per run, when it starts it: ``TraceIdRatioBased``'s test on the run's trace id
(:func:`accord.engine.machine.ids.trace_sampled`, the ratio being ``EngineOptions.trace_sample``,
which :func:`accord.adapters.open_engine` takes from :func:`engine_ratio`). The decision is recorded
on the run (``RunState.sampled``), so replay and a rebuilt dispatch say the same, and the pure core
writes it into the trace flags of every job's ``traceparent``: ``-01`` kept, ``-00`` dropped. A
worker follows those flags, not its own ratio (parent-based sampling): ``-00`` builds nothing,
``-01`` is traced, unless the worker's ratio is 0 (``always_off``), which turns its spans off. An
unsampled run costs a dictionary look-up per telemetry event in the engine and one parse of the
``traceparent`` in the worker: no span, attribute or context object is built. A ratio of 0
registers no span builder at all.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from accord.engine.machine import ids
from accord.engine.ports import JsonValue, Sink

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

__all__ = [
    "OtelSink", "Tracing", "enabled", "engine_ratio", "register", "run_span_id", "sample_ratio",
    "tracing", "worker_span",
]  # fmt: skip

# the span id the next span started in this context takes (the engine's deterministic ids)
_NEXT_SPAN: contextvars.ContextVar[int | None] = contextvars.ContextVar("accord_span", default=None)
_NEXT_TRACE: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "accord_trace", default=None
)
_MEMORY = 50_000  # remembered starts (runs and attempts) before the oldest are forgotten


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether the standard ``OTEL_*`` variables configure an OTLP trace endpoint."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


_SAMPLERS = {
    "always_on": 1.0, "always_off": 0.0, "parentbased_always_on": 1.0,
    "parentbased_always_off": 0.0,
}  # fmt: skip


def sample_ratio(env: Mapping[str, str] | None = None) -> float:
    """The trace ratio the standard ``OTEL_TRACES_SAMPLER`` (and ``…_ARG``) variables name;
    1.0 when unset, as the SDK's default; an unknown sampler or a bad argument is 1.0 too (the
    SDK warns and samples everything as well)."""
    env = os.environ if env is None else env
    name = env.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if name in _SAMPLERS:
        return _SAMPLERS[name]
    if name in ("traceidratio", "parentbased_traceidratio"):
        try:
            ratio = float(env.get("OTEL_TRACES_SAMPLER_ARG", "1.0"))
        except ValueError:
            return 1.0
        return ratio if 0.0 <= ratio <= 1.0 else 1.0
    return 1.0


def parse_ratio(text: str) -> float:
    """``--trace-sample``: a number from 0 to 1 (``0.1``, ``1``, or ``10%``)."""
    raw = text.strip()
    try:
        ratio = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"{text!r}: expected a ratio from 0 to 1 (0.1, 1) or a percentage (10%)")
    return ratio


def run_span_id(run_id: str) -> str:
    """The run span's id (16 hex digits), derived from the run id like the attempt spans'."""
    return hashlib.sha256(f"accord-run-span\x1f{run_id}".encode()).hexdigest()[:16]


def _parse(traceparent: str) -> tuple[int, int] | None:
    parts = traceparent.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        return int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None


_LOW64 = (1 << 64) - 1


class Tracing:
    """A tracer provider exporting OTLP over HTTP (protobuf), configured from ``OTEL_*``;
    ``ratio`` (else :func:`sample_ratio`) is the share of traces kept."""

    def __init__(self, service: str, ratio: float | None = None) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: PLC0415
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
        from opentelemetry.sdk.trace.id_generator import IdGenerator  # noqa: PLC0415
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased  # noqa: PLC0415

        class _Ids(IdGenerator):
            """Random ids, except a span id set for the next span (:data:`_NEXT_SPAN`)."""

            def generate_span_id(self) -> int:
                chosen = _NEXT_SPAN.get()
                return chosen if chosen is not None else random.getrandbits(64) or 1

            def generate_trace_id(self) -> int:
                chosen = _NEXT_TRACE.get()
                return chosen if chosen is not None else random.getrandbits(128) or 1

        name = os.environ.get("OTEL_SERVICE_NAME") or service
        self.ratio = sample_ratio() if ratio is None else ratio
        root = TraceIdRatioBased(self.ratio)
        self._bound = root.bound  # the SDK's own test: low 64 bits of the trace id < bound
        self.provider: TracerProvider = TracerProvider(
            resource=Resource.create({"service.name": name}), id_generator=_Ids(),
            sampler=ParentBased(root),
        )  # fmt: skip
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self.tracer: Tracer = self.provider.get_tracer("accord")

    def sampled(self, trace_id: int) -> bool:
        """Whether the trace is kept: ``TraceIdRatioBased``'s decision, made here first so that
        a dropped run builds nothing."""
        return (trace_id & _LOW64) < self._bound

    def span(
        self,
        name: str,
        traceparent: str,
        *,
        span_id: int | None = None,
        parent: int | None = None,
        start_ms: int | None = None,
        end_ms: int | None = None,
        attributes: Mapping[str, str | int] | None = None,
        kind: str = "internal",
        error: str = "",
    ) -> None:
        """Record one finished span in the trace of ``traceparent``: its parent is ``parent``
        (a span id; 0 for a root span) or the traceparent's span; its own id ``span_id`` or a
        random one."""
        from opentelemetry import context as otel_context  # noqa: PLC0415
        from opentelemetry import trace  # noqa: PLC0415
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags  # noqa: PLC0415

        ctx = _parse(traceparent)
        if ctx is None:
            return
        trace_id, tp_span = ctx
        if not self.sampled(trace_id):
            return
        parent_ctx = SpanContext(
            trace_id, parent if parent is not None else tp_span, is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )  # fmt: skip
        if parent == 0:
            context = otel_context.Context()
        else:
            context = trace.set_span_in_context(trace.NonRecordingSpan(parent_ctx))
        token, trace_token = _NEXT_SPAN.set(span_id), _NEXT_TRACE.set(trace_id)
        try:
            span = self.tracer.start_span(
                name, context=context, kind=SpanKind[kind.upper()],
                attributes=dict(attributes or {}),
                start_time=None if start_ms is None else start_ms * 1_000_000,
            )  # fmt: skip
        finally:
            _NEXT_SPAN.reset(token)
            _NEXT_TRACE.reset(trace_token)
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=None if end_ms is None else end_ms * 1_000_000)

    @contextlib.contextmanager
    def active(
        self, name: str, traceparent: str, attributes: Mapping[str, str | int], kind: str
    ) -> Iterator[Any]:
        """A span live around a block (a worker's handler), child of ``traceparent``."""
        from opentelemetry import trace  # noqa: PLC0415
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags  # noqa: PLC0415

        ctx = _parse(traceparent)
        if ctx is None or traceparent.endswith("-00"):  # the parent's decision, not our ratio
            yield None
            return
        parent = SpanContext(
            ctx[0], ctx[1], is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED)
        )
        context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
        with self.tracer.start_as_current_span(
            name, context=context, kind=SpanKind[kind.upper()], attributes=dict(attributes),
            record_exception=False, set_status_on_exception=False,
        ) as span:  # fmt: skip
            try:
                yield span
            except BaseException as exc:
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                raise

    def flush(self) -> None:
        self.provider.force_flush()

    def close(self) -> None:
        self.provider.shutdown()


_TRACING: dict[str, Tracing | None] = {}


def tracing(service: str, ratio: float | None = None) -> Tracing | None:
    """The process's tracing for ``service`` when ``OTEL_*`` configures it, else ``None``;
    ``ratio`` (at first use) overrides the ``OTEL_TRACES_SAMPLER`` variables."""
    if service not in _TRACING:
        _TRACING[service] = Tracing(service, ratio) if enabled() else None
    return _TRACING[service]


def engine_ratio(service: str = "accord-engine") -> float | None:
    """The trace ratio of the engine's tracing configured in this process (:func:`register`),
    or ``None`` when there is none: then every run's jobs say sampled (``-01``)."""
    t = _TRACING.get(service)
    return None if t is None else t.ratio


def reset() -> None:
    """Forget configured tracing (after the ``OTEL_*`` variables changed), flushing it first."""
    for t in _TRACING.values():
        if t is not None:
            t.close()
    _TRACING.clear()


_OFF = contextlib.nullcontext()


def worker_span(
    envelope: Mapping[str, Any], capability: str
) -> contextlib.AbstractContextManager[Any]:
    """The worker's ``accord.execute`` span around a handler, continuing the envelope's
    ``traceparent``; a shared no-op when tracing is off."""
    t = tracing("accord-worker")
    if t is None:
        return _OFF
    traceparent = str(envelope.get("traceparent", ""))
    parsed = _parse(traceparent)
    if parsed is None or traceparent.endswith("-00") or t.ratio == 0.0:
        return _OFF  # the engine dropped this run's trace (or this worker traces nothing)
    attrs: dict[str, str | int] = {
        "accord.run_id": str(envelope.get("runId", "")),
        "accord.stage": str(envelope.get("stage", "")),
        "accord.attempt": int(envelope.get("attempt") or 0),
        "accord.capability": capability,
        "accord.contract": f"{envelope.get('messageType')}@{envelope.get('contractVersion')}",
    }
    name = f"accord.execute {attrs['accord.stage']}"
    return t.active(name, traceparent, attrs, "consumer")


def _s(value: JsonValue | None) -> str:
    return "" if value is None else str(value)


def _trim(memory: dict[Any, Any]) -> None:
    while len(memory) > _MEMORY:
        del memory[next(iter(memory))]


_SPANNED = frozenset({
    "run.started", "run.terminal", "stage.dispatched", "stage.completed", "stage.failed",
    "callback.rejected",
})  # fmt: skip


class OtelSink:
    """The engine's telemetry :class:`~accord.engine.ports.Sink` as OpenTelemetry spans."""

    def __init__(self, tracing: Tracing, clock_ms: Any = None) -> None:
        self.tracing = tracing
        self._now = clock_ms or (lambda: int(time.time() * 1000))
        self._runs: dict[str, int] = {}  # run id -> run.started at
        self._attempts: dict[tuple[str, str], tuple[int, int, str]] = {}  # -> attempt, at, cap
        self._kept: dict[str, bool] = {}  # run id -> its trace is sampled
        self.spans = 0
        self.dropped = 0  # telemetry events of unsampled runs, skipped

    def _forget(self) -> None:
        for memory in (self._runs, self._attempts, self._kept):
            _trim(memory)

    def _sampled(self, run_id: str) -> bool:
        kept = self._kept.get(run_id)
        if kept is None:
            trace_id = int(ids.traceparent(run_id, "", 0)[3:35], 16)
            kept = self._kept[run_id] = self.tracing.sampled(trace_id)
        return kept

    async def emit(self, events: Sequence[Mapping[str, JsonValue]]) -> None:
        for event in events:
            self._one(event)
        self._forget()

    def _one(self, event: Mapping[str, JsonValue]) -> None:
        name = event.get("name")
        if name not in _SPANNED:
            return
        raw = event.get("attributes")
        attrs: Mapping[str, JsonValue] = raw if isinstance(raw, Mapping) else {}
        run_id = _s(event.get("run_id") or attrs.get("runId"))
        if not self._sampled(run_id):  # the whole trace is dropped: build nothing
            self.dropped += 1
            if name == "run.terminal":
                self._kept.pop(run_id, None)
            return
        at = event.get("at_ms")
        at_ms = at if isinstance(at, int) else self._now()
        workflow, stage = _s(attrs.get("workflow")), _s(attrs.get("stage"))
        trace_tp = ids.traceparent(run_id, "", 0)
        run_span = int(run_span_id(run_id), 16)
        base: dict[str, str | int] = {"accord.run_id": run_id, "accord.workflow": workflow}
        t = self.tracing
        if name == "run.started":
            self._runs[run_id] = at_ms
        elif name == "run.terminal":
            self._kept.pop(run_id, None)
            start = self._runs.pop(run_id, at_ms)
            status = _s(attrs.get("status"))
            t.span(
                f"accord.run {workflow}", trace_tp, span_id=run_span, parent=0, start_ms=start,
                end_ms=at_ms, attributes=base | {"accord.status": status},
                error="" if status == "completed" else status,
            )  # fmt: skip
            self.spans += 1
        elif name == "stage.dispatched":
            attempt = attrs.get("attempt")
            number = attempt if isinstance(attempt, int) else 1
            cap = _s(attrs.get("capability"))
            self._attempts[(run_id, stage)] = (number, at_ms, cap)
            tp = ids.traceparent(run_id, stage, number)
            a = base | {"accord.stage": stage, "accord.attempt": number, "accord.capability": cap}
            t.span(f"accord.dispatch {stage}", tp, start_ms=at_ms, end_ms=max(at_ms, self._now()),
                   attributes=a, kind="producer")  # fmt: skip
            self.spans += 1
        elif name in ("stage.completed", "stage.failed", "callback.rejected"):
            self._outcome(
                str(name), run_id, stage, at_ms, attrs=attrs, base=base, run_span=run_span
            )

    def _outcome(
        self, name: str, run_id: str, stage: str, at_ms: int, *,
        attrs: Mapping[str, JsonValue], base: dict[str, str | int], run_span: int,
    ) -> None:  # fmt: skip
        known = self._attempts.get((run_id, stage))
        given = attrs.get("attempt")
        number = given if isinstance(given, int) else (known[0] if known else 1)
        start, cap = (known[1], known[2]) if known and known[0] == number else (at_ms, "")
        tp = ids.traceparent(run_id, stage, number)
        own = int(tp.split("-")[2], 16)
        a = base | {"accord.stage": stage, "accord.attempt": number}
        if cap:
            a["accord.capability"] = cap
        if name == "callback.rejected":
            reason = _s(attrs.get("reason"))
            self.tracing.span(f"accord.outcome {stage}", tp, start_ms=at_ms, end_ms=at_ms,
                              attributes=a | {"accord.outcome": f"rejected-{reason}"})  # fmt: skip
            self.spans += 1
            return
        status = "succeeded" if name == "stage.completed" else _s(attrs.get("status"))
        self.tracing.span(f"accord.outcome {stage}", tp, start_ms=at_ms, end_ms=at_ms,
                          attributes=a | {"accord.outcome": status}, kind="consumer")  # fmt: skip
        self.tracing.span(
            f"accord.attempt {stage}#{number}", tp, span_id=own, parent=run_span,
            start_ms=start, end_ms=at_ms, attributes=a | {"accord.outcome": status},
            error="" if status == "succeeded" else status,
        )  # fmt: skip
        self._attempts.pop((run_id, stage), None)
        self.spans += 2


def register(
    sink: Sink | None, service: str = "accord-engine", *, ratio: float | None = None
) -> Sink | None:
    """The engine's sink with spans added when ``OTEL_*`` configures tracing: ``sink`` itself
    when tracing is off or samples nothing (``ratio``, else the ``OTEL_TRACES_SAMPLER``
    variables, is 0); else the :class:`~accord.adapters.telemetry.FanoutSink` given (or a new
    one in front of ``sink``) with an :class:`OtelSink` registered as a best-effort ``otel``."""
    t = tracing(service, ratio)
    if t is None or t.ratio == 0.0:
        return sink
    from accord.adapters.telemetry import FanoutSink  # noqa: PLC0415

    fanout = sink if isinstance(sink, FanoutSink) else FanoutSink()
    if sink is not None and fanout is not sink:
        fanout.register("sink", sink, required=True)
    if fanout.get("otel") is None:
        fanout.register("otel", OtelSink(t))
    return fanout
