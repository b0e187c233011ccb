"""Metrics with bounded label sets (docs/observability.md, "Metrics").

One set of OpenTelemetry instruments per process (:func:`metrics`), read two ways: as Prometheus
text for ``GET /metrics`` (:func:`prometheus_text`, the prometheus-client exposition format) and,
when the standard ``OTEL_*`` variables name an OTLP endpoint, exported over OTLP/HTTP by a
periodic reader (``OTEL_METRIC_EXPORT_INTERVAL``).

Labels are only ``workflow``, ``version``, ``stage``, ``capability``, ``outcome`` and ``rule``; a
value is one the deployment declared (a workflow's name and version, a stage of its plan, a pinned
capability) or one of a closed vocabulary (:data:`OUTCOMES`, :data:`ALERT_RULES`), never a tenant,
model, request or
run id, nor anything read from a payload. :meth:`Metrics.add` enforces it: an unknown label name
raises, an outcome outside the vocabulary becomes ``other``, and each label keeps at most
:data:`MAX_VALUES` distinct values (the rest become ``other``), so no input can grow the series.

The engine's figures come from :class:`EngineMetrics`, an engine observer told of every
committed transition (accepted or refused) with the run record after it; the worker's from the
Python worker runtime (:func:`worker_metrics`): queue age and dispatch-to-acceptance as the worker
saw them, validation rejections and quarantined messages.

:func:`serve_metrics` is the ``/metrics`` endpoint of a process without the API (``accord engine
run --metrics [HOST:]PORT``, loopback unless a host is named): a minimal HTTP/1.1 responder on
asyncio that answers ``GET /metrics`` with :func:`prometheus_text` and anything else with 404.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accord.engine.runtime.orchestrator import Delivered, Engine

__all__ = [
    "ALERT_RULES",
    "LABELS",
    "MAX_VALUES",
    "OUTCOMES",
    "EngineMetrics",
    "Metrics",
    "metrics",
    "metrics_address",
    "prometheus_text",
    "serve_metrics",
    "watch_lag",
    "worker_metrics",
]

LABELS = frozenset({"workflow", "version", "stage", "capability", "outcome", "rule"})
OUTCOMES = frozenset({
    "succeeded", "failed", "retryable", "timed-out", "cancelled", "quarantined", "completed",
    "duplicate", "stale", "late", "invalid", "unknown-attempt", "queue", "execution",
    "heartbeat", "run", "retry", "approval", "firing", "resolved", "other",
})  # fmt: skip
# the alert rules (accord.adapters.telemetry.alerts.RULES): a closed vocabulary like OUTCOMES
ALERT_RULES = frozenset({
    "divergence-found", "stranded-outbox", "projector-lag", "poison-growing", "no-live-worker",
    "other",
})  # fmt: skip
MAX_VALUES = 256
# seconds: 5 ms to 10 min, for queue age, acceptance and execution
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

# name -> (kind, description, unit); every instrument a process may record
INSTRUMENTS: dict[str, tuple[str, str]] = {
    "accord_stage_dispatches": ("counter", "Attempts dispatched to a worker queue or an action"),
    "accord_stage_outcomes": ("counter", "Attempts concluded, by outcome class"),
    "accord_stage_retries": ("counter", "Retries scheduled after a retryable failure"),
    "accord_stage_timeouts": ("counter", "Clocks that fired on a live attempt (queue, execution)"),
    "accord_stage_stalls": ("counter", "Heartbeat deadlines missed by a running attempt"),
    "accord_results_refused": (
        "counter", "Results and callbacks refused: duplicate, stale, late, invalid"),
    "accord_validation_rejections": ("counter", "Jobs or results refused by their contract"),
    "accord_quarantined_messages": ("counter", "Messages quarantined as poison"),
    "accord_runs_ended": ("counter", "Runs that reached a terminal status"),
    "accord_divergence_found": ("counter", "Runs reported as needing reconciliation"),
    "accord_queue_age_seconds": ("histogram", "Dispatch to delivery at a worker"),
    "accord_dispatch_acceptance_seconds": ("histogram", "Dispatch to the attempt's acceptance"),
    "accord_execution_seconds": ("histogram", "Acceptance to the attempt's final outcome"),
    "accord_projector_lag_seconds": ("gauge", "How far the search projection trails the store"),
    "accord_alerts_open": ("gauge", "Open alerts, by rule"),
    "accord_alert_transitions": ("counter", "Alerts that started firing or resolved, by rule"),
}  # fmt: skip


def _otlp_on(env: Mapping[str, str]) -> bool:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_METRICS_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(
        env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


class Metrics:
    """The process's instruments behind a label guard (see the module docstring)."""

    def __init__(self, service: str, env: Mapping[str, str] | None = None) -> None:
        from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricReader  # noqa: PLC0415
        from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View  # noqa: PLC0415
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415

        env = os.environ if env is None else env
        self.reader = InMemoryMetricReader()
        readers: list[MetricReader] = [self.reader]
        if _otlp_on(env):
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter  # noqa: PLC0415
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader  # noqa: PLC0415

            readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
        views = [
            View(instrument_name="*_seconds",
                 aggregation=ExplicitBucketHistogramAggregation(BUCKETS)),
        ]  # fmt: skip
        name = env.get("OTEL_SERVICE_NAME") or service
        self.provider = MeterProvider(
            metric_readers=readers, resource=Resource.create({"service.name": name}), views=views
        )
        meter = self.provider.get_meter("accord")
        self._lock = threading.Lock()
        self._seen: dict[str, set[str]] = {k: set() for k in LABELS}
        self._known: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}  # given → guarded
        self._gauges: dict[str, Callable[[], Iterable[tuple[float, dict[str, str]]]]] = {}
        self._instruments: dict[str, Any] = {}
        for metric, (kind, doc) in INSTRUMENTS.items():
            if kind == "counter":
                self._instruments[metric] = meter.create_counter(metric, description=doc)
            elif kind == "histogram":
                self._instruments[metric] = meter.create_histogram(metric, "s", doc)
            else:
                self._instruments[metric] = meter.create_observable_gauge(
                    metric,
                    [self._observer(metric)],
                    "s" if metric.endswith("_seconds") else "1",
                    doc,
                )

    def _observer(self, metric: str) -> Any:
        from opentelemetry.metrics import CallbackOptions, Observation  # noqa: PLC0415

        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            source = self._gauges.get(metric)
            if source is None:
                return []
            try:
                return [Observation(v, self.labels(**labels)) for v, labels in source()]
            except Exception:  # a source that fails (a projector away) reports nothing
                return []

        return observe

    def labels(self, **labels: str) -> dict[str, str]:
        """The guarded label set (see the module docstring); raises on an unknown label."""
        key = tuple(labels.items())
        known = self._known.get(key)
        if known is not None:  # the hot path: a label set seen before
            return known
        out: dict[str, str] = {}
        with self._lock:
            for name, raw in labels.items():
                if name not in LABELS:
                    raise ValueError(f"metric label {name!r} is not one of {sorted(LABELS)}")
                value = str(raw)
                if (name == "outcome" and value not in OUTCOMES) or (
                    name == "rule" and value not in ALERT_RULES
                ):
                    value = "other"
                seen = self._seen[name]
                if value not in seen:
                    if len(seen) >= MAX_VALUES:
                        value = "other"
                    else:
                        seen.add(value)
                out[name] = value
            if len(self._known) < 4 * MAX_VALUES:
                self._known[key] = out
        return out

    def add(self, metric: str, value: float = 1, /, **labels: str) -> None:
        self._instruments[metric].add(value, self.labels(**labels))

    def record(self, metric: str, seconds: float, /, **labels: str) -> None:
        self._instruments[metric].record(max(0.0, seconds), self.labels(**labels))

    def gauge(
        self, metric: str, source: Callable[[], Iterable[tuple[float, dict[str, str]]]]
    ) -> None:
        """Report ``metric`` (a gauge) from ``source`` at every collection: (value, labels)."""
        if INSTRUMENTS.get(metric, ("",))[0] != "gauge":
            raise ValueError(f"{metric!r} is not a gauge")
        self._gauges[metric] = source

    def close(self) -> None:
        self.provider.shutdown()


_PROCESS: dict[str, Metrics] = {}


def metrics(service: str = "accord-engine") -> Metrics:
    """This process's :class:`Metrics` (one per process; ``service`` names it at first use)."""
    if "m" not in _PROCESS:
        _PROCESS["m"] = Metrics(service)
    return _PROCESS["m"]


def reset() -> None:
    """Forget the process's instruments (tests, and after the ``OTEL_*`` variables changed)."""
    _WORKER.clear()
    m = _PROCESS.pop("m", None)
    if m is not None:
        m.close()


def prometheus_text(m: Metrics) -> bytes:
    """The instruments' current values in the Prometheus text exposition format."""
    from prometheus_client import CollectorRegistry, generate_latest  # noqa: PLC0415
    from prometheus_client.core import (  # noqa: PLC0415
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    data = m.reader.get_metrics_data()
    families: list[Any] = []
    for rm in data.resource_metrics if data is not None else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points: list[Any] = list(metric.data.data_points)
                doc = metric.description or metric.name
                keys = sorted(LABELS)
                kind = INSTRUMENTS.get(metric.name, ("gauge",))[0]
                name = metric.name
                if kind == "counter":
                    fam: Any = CounterMetricFamily(name, doc, labels=keys)
                    for p in points:
                        attrs = {k: str(v) for k, v in dict(p.attributes or {}).items()}
                        fam.add_metric([attrs.get(k, "") for k in keys], p.value)
                elif kind == "histogram":
                    fam = HistogramMetricFamily(name, doc, labels=keys)
                    for p in points:
                        attrs = {k: str(v) for k, v in dict(p.attributes or {}).items()}
                        total, buckets = 0, []
                        for bound, count in zip(p.explicit_bounds, p.bucket_counts, strict=False):
                            total += count
                            buckets.append((repr(float(bound)), total))
                        buckets.append(("+Inf", p.count))
                        fam.add_metric([attrs.get(k, "") for k in keys], buckets, p.sum)
                else:
                    fam = GaugeMetricFamily(name, doc, labels=keys)
                    for p in points:
                        attrs = {k: str(v) for k, v in dict(p.attributes or {}).items()}
                        fam.add_metric([attrs.get(k, "") for k in keys], p.value)
                families.append(fam)

    class _Collector:
        def collect(self) -> Iterable[Any]:
            return families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    return bytes(generate_latest(registry))


def watch_lag(lag_ms: Callable[[], int], m: Metrics | None = None) -> None:
    """Report ``accord_projector_lag_seconds`` from ``lag_ms`` (the projector's ``lag_ms``)."""
    (m or metrics()).gauge("accord_projector_lag_seconds", lambda: [(lag_ms() / 1000, {})])


def metrics_address(text: str) -> tuple[str, int]:
    """``--metrics``: ``PORT`` (on 127.0.0.1) or ``HOST:PORT``; ``ValueError`` says what is
    expected. Port 0 takes a free one."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]") if sep else "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535 or (sep and not host):
        raise ValueError(f"{text!r}: expected PORT or HOST:PORT (e.g. 9464, 127.0.0.1:9464)")
    return host, number


async def serve_metrics(host: str, port: int, m: Metrics | None = None) -> asyncio.Server:
    """Serve ``GET /metrics`` (Prometheus text) on ``host:port`` until the server is closed."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            method, path = [*head.split(b"\r\n", 1)[0].split(b" "), b"", b""][:2]
            if method in (b"GET", b"HEAD") and path.split(b"?")[0] == b"/metrics":
                body = await asyncio.to_thread(prometheus_text, m or metrics())
                status, kind = b"200 OK", PROMETHEUS_TEXT
            else:
                body, status, kind = b"not found\n", b"404 Not Found", b"text/plain"
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + kind
                         + b"\r\nContent-Length: " + str(len(body)).encode()
                         + b"\r\nConnection: close\r\n\r\n"
                         + (b"" if method == b"HEAD" else body))  # fmt: skip
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError):  # fmt: skip
            pass
        finally:
            writer.close()

    return await asyncio.start_server(answer, host, port)


PROMETHEUS_TEXT = b"text/plain; version=0.0.4; charset=utf-8"


# -- the engine's figures ------------------------------------------------------------------------


def _class(status: str) -> str:
    return {"completed": "succeeded", "succeeded": "succeeded"}.get(status, status)


class EngineMetrics:
    """An engine observer recording the engine's metrics from each committed transition."""

    def __init__(self, m: Metrics, version_of: Callable[[str], str | None] | None = None) -> None:
        self.m = m
        self._version_of = version_of or (lambda _digest: None)
        self._versions: dict[str, str] = {}

    @classmethod
    def attach(cls, engine: Engine, m: Metrics | None = None) -> EngineMetrics:
        """Record ``engine``'s transitions into ``m`` (the process's metrics by default)."""
        book = engine.plans

        def version_of(digest: str) -> str | None:
            plan = getattr(book, "_plans", {}).get(digest)  # plans the engine loaded already
            return None if plan is None else str(plan.version)

        observer = cls(m or metrics(), version_of)
        engine.observers.append(observer)
        return observer

    def _version(self, digest: str) -> str:
        found = self._versions.get(digest)
        if found is None:
            found = self._version_of(digest)
            if found is None:
                return "unknown"
            self._versions[digest] = found
        return found

    def __call__(self, done: Delivered) -> None:
        run = done.run
        if run is None or not done.history:
            return
        base = {"workflow": run.workflow, "version": self._version(run.plan_digest)}
        m = self.m
        for entry in done.history:
            event = entry.event
            kind = str(event.get("kind", ""))
            stage = str(event.get("stage") or "")
            if not entry.accepted:
                m.add("accord_results_refused", **base, stage=stage,
                      outcome=str(entry.reason or "other"))  # fmt: skip
                if entry.reason == "invalid":
                    m.add("accord_validation_rejections", **base, stage=stage)
                continue
            st = run.stages.get(stage) if stage else None
            attempt = None
            if st is not None:
                number = event.get("attempt")
                attempt = next((a for a in reversed(st.attempts) if a.attempt == number), None)
            if kind == "stage-accepted" and attempt is not None:
                seconds = (entry.at_ms - attempt.dispatched_at_ms) / 1000
                m.record("accord_dispatch_acceptance_seconds", seconds, **base, stage=stage)
            elif kind in ("stage-succeeded", "stage-failed") and attempt is not None:
                began = attempt.accepted_at_ms or attempt.dispatched_at_ms
                m.record("accord_execution_seconds", (entry.at_ms - began) / 1000,
                         **base, stage=stage)  # fmt: skip
                outcome = "succeeded" if kind == "stage-succeeded" else "failed"
                if kind == "stage-failed" and event.get("retryable"):
                    outcome = "retryable"
                m.add("accord_stage_outcomes", **base, stage=stage, outcome=outcome)
            elif kind == "timer-fired" and stage:
                timer = str(event.get("timer", ""))
                if timer == "heartbeat":
                    m.add("accord_stage_stalls", **base, stage=stage)
                elif timer in ("queue", "execution"):
                    m.add("accord_stage_timeouts", **base, stage=stage, outcome=timer)
            elif kind == "poison-reported":
                m.add("accord_quarantined_messages", **base, stage=stage)
        for effect in done.effects:
            name = getattr(effect, "name", "")
            attrs = getattr(effect, "attributes", None) or {}
            if name == "stage.dispatched":
                capability = str(attrs.get("capability", ""))
                m.add("accord_stage_dispatches", **base, stage=str(attrs.get("stage", "")),
                      capability=capability)  # fmt: skip
            elif name == "stage.failed" and attrs.get("status") == "retry-scheduled":
                m.add("accord_stage_retries", **base, stage=str(attrs.get("stage", "")))
            elif name == "run.needs-reconciliation":
                m.add("accord_divergence_found", **base)
            elif name == "run.terminal":
                m.add("accord_runs_ended", **base, outcome=_class(str(attrs.get("status", ""))))


# -- the worker's figures ------------------------------------------------------------------------


def _epoch_ms(iso: object) -> int | None:
    if not isinstance(iso, str) or not iso:
        return None
    try:
        return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None


class WorkerMetrics:
    """What the Python worker runtime records (see the module docstring)."""

    def __init__(self, m: Metrics) -> None:
        self.m = m

    def received(self, envelope: Mapping[str, Any], capability: str) -> None:
        sent = _epoch_ms(envelope.get("occurredAt"))
        if sent is not None:
            self.m.record("accord_queue_age_seconds", time.time() - sent / 1000,
                          capability=capability, stage=str(envelope.get("stage", "")))  # fmt: skip

    def accepted(self, envelope: Mapping[str, Any], capability: str) -> None:
        sent = _epoch_ms(envelope.get("occurredAt"))
        if sent is not None:
            self.m.record("accord_dispatch_acceptance_seconds", time.time() - sent / 1000,
                          capability=capability, stage=str(envelope.get("stage", "")))  # fmt: skip

    def rejected(self, capability: str) -> None:
        self.m.add("accord_validation_rejections", capability=capability)

    def quarantined(self, capability: str) -> None:
        self.m.add("accord_quarantined_messages", capability=capability)


_WORKER: dict[str, WorkerMetrics | None] = {}


def worker_metrics() -> WorkerMetrics | None:
    """The worker's recorder when ``OTEL_*`` names an OTLP endpoint (a worker has no
    ``/metrics`` of its own), else ``None``: nothing is measured."""
    if "w" not in _WORKER:
        _WORKER["w"] = WorkerMetrics(metrics("accord-worker")) if _otlp_on(os.environ) else None
    return _WORKER["w"]
