"""Telemetry sinks: where the engine's telemetry outbox goes (docs/observability.md).

An engine has one :class:`~accord.engine.ports.Sink`; :class:`FanoutSink` hands each batch to
every sink registered in it — the search projector, the OpenTelemetry span builder
(:mod:`accord.adapters.telemetry.otel`) — one after the other, in registration order.

A sink registered as ``required`` (the projector) must take the batch: if it raises, the fan-out
raises after every other sink had its turn, and the dispatcher leaves the events in the outbox
for the sweep to offer again (every required sink must therefore take a batch twice without
harm; the projector's guarded upserts do). A ``best_effort`` sink (spans, which are lossy by
nature) is logged and counted when it fails, never retried through the outbox.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from accord.engine.ports import JsonValue, Sink

__all__ = ["FanoutSink"]

log = logging.getLogger("accord.adapters.telemetry")


@dataclass(slots=True)
class _Entry:
    name: str
    sink: Sink
    required: bool
    failures: int = 0


@dataclass(slots=True)
class FanoutSink:
    """One sink in front of several (see the module docstring)."""

    _sinks: list[_Entry] = field(default_factory=list)

    def register(self, name: str, sink: Sink, *, required: bool = False) -> None:
        """Add ``sink`` under ``name`` (unique); ``required`` sinks keep failed batches in the
        outbox, the others only log their failures."""
        if any(e.name == name for e in self._sinks):
            raise ValueError(f"a telemetry sink named {name!r} is registered already")
        self._sinks.append(_Entry(name, sink, required))

    @property
    def names(self) -> list[str]:
        return [e.name for e in self._sinks]

    def __len__(self) -> int:
        return len(self._sinks)

    def failures(self) -> dict[str, int]:
        """Batches each sink failed to take, by name."""
        return {e.name: e.failures for e in self._sinks}

    def get(self, name: str) -> Sink | None:
        return next((e.sink for e in self._sinks if e.name == name), None)

    async def emit(self, events: Sequence[Mapping[str, JsonValue]]) -> None:
        first: Exception | None = None
        for entry in self._sinks:
            try:
                await entry.sink.emit(events)
            except Exception as exc:
                entry.failures += 1
                if entry.required:
                    first = first or exc
                else:
                    log.warning("telemetry sink %s failed for %d event(s): %s",
                                entry.name, len(events), exc)  # fmt: skip
        if first is not None:
            raise first
