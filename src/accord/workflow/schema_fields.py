"""Typed field readers for the schema layer: each reads one key and records what is wrong.

A :class:`SchemaReader` is the shared source reader of :mod:`accord.contracts.yamlsource`, worded
with the ``schema-*`` codes. It never raises: a wrong field becomes a
:class:`~accord.errors.Diagnostic` at the field's own line and column, and the reader returns a
harmless placeholder so checking continues and every problem in a file is reported at once.
"""

from __future__ import annotations

import re
from typing import Any

from accord.contracts.yamlsource import Node, Reader, holds
from accord.workflow import limits
from accord.workflow.values import RetryPolicy, Timeouts

__all__ = ["SchemaReader"]

_REQUIRED: Any = object()
_NAME = re.compile(limits.NAME_PATTERN)
_REF = re.compile(r"^[a-z][a-z0-9._-]*@[1-9][0-9]*$")
_ERROR_CLASS = re.compile(r"^[a-z][a-z0-9-]*$")


def _written(node: Node, key: str) -> bool:
    """``key`` holds a string (possibly empty), so its format is worth checking."""
    value = node.get(key)
    return value is not None and value.kind == "scalar" and isinstance(value.value, str)


class SchemaReader(Reader):
    """Reads workflow definitions: each problem is a ``schema-*`` finding at the key it names."""

    def closed(self, node: Node, allowed: set[str], stage: str) -> None:
        for key, _, key_loc in node.entries:
            if key not in allowed:
                self.error(
                    "schema-unknown-field",
                    f"unknown field {key!r} (allowed: {', '.join(sorted(allowed))})",
                    key_loc,
                    key,
                    stage,
                )

    def child(
        self, node: Node, key: str, stage: str, *, kind: str, required: bool = True
    ) -> Node | None:
        value = node.get(key)
        if value is None:
            if required:
                self.error_at(
                    "schema-missing-field", f"missing required field {key!r}", node, None, stage
                )
            return None
        if value.kind != kind:
            want = {"map": "a mapping", "seq": "a list", "scalar": "a value"}[kind]
            self.error_at("schema-type", f"{key!r} must be {want}", node, key, stage)
            return None
        return value

    def _scalar(self, node: Node, key: str, stage: str, default: Any) -> Any:
        value = node.get(key)
        if value is None or (value.kind == "scalar" and value.value is None):
            if default is _REQUIRED:
                self.error_at(
                    "schema-missing-field", f"missing required field {key!r}", node, None, stage
                )
                return None
            return default
        if value.kind != "scalar":
            self.error_at("schema-type", f"{key!r} must be a single value", node, key, stage)
            return None
        return value.value

    def text(self, node: Node, key: str, stage: str, default: Any = _REQUIRED) -> Any:
        value = self._scalar(node, key, stage, default)
        if value is None or value is default:
            return value if value is not None else ("" if default is _REQUIRED else default)
        if not holds(value, str):
            self.error_at(
                "schema-type", f"{key!r} must be a string, got {value!r}", node, key, stage
            )
            return ""
        return value

    def name(self, node: Node, key: str, stage: str) -> str:
        value: str = self.text(node, key, stage)
        if _written(node, key) and not _NAME.match(value):
            self.error_at(
                "schema-name",
                f"{value!r} is not a valid name ({limits.NAME_PATTERN})",
                node,
                key,
                stage or value,
            )
        return value

    def choice(
        self, node: Node, key: str, stage: str, options: tuple[str, ...], default: Any
    ) -> Any:
        value = self.text(node, key, stage, _REQUIRED if default is None else default)
        if value not in options:
            if value:
                self.error_at(
                    "schema-enum", f"{key} {value!r} is not one of {options}", node, key, stage
                )
            return None
        return value

    def names(self, node: Node, key: str, stage: str, required: bool = True) -> tuple[str, ...]:
        seq = self.child(node, key, stage, kind="seq", required=required)
        if seq is None:
            return ()
        out: list[str] = []
        for item in seq.items:
            if item.kind != "scalar" or not isinstance(item.value, str):
                self.error_at("schema-type", f"{key!r} holds names (strings)", item, None, stage)
                continue
            out.append(item.value)
        return tuple(out)

    def capability_ref(self, node: Node, key: str, stage: str) -> str:
        value: str = self.text(node, key, stage)
        if _written(node, key) and not _REF.match(value):
            self.error_at(
                "schema-capability-ref", f"{value!r} is not name@version", node, key, stage
            )
        return value

    def capability_refs(self, node: Node, key: str) -> tuple[str, ...]:
        """A list of ``name@version`` references (workflow ``finalisers``)."""
        refs = self.names(node, key, "", required=False)
        for ref in refs:
            if not _REF.match(ref):
                self.error_at("schema-capability-ref", f"{ref!r} is not name@version", node, key)
        return refs

    def optional_ref(self, node: Node, key: str, stage: str) -> str | None:
        value: str | None = self.text(node, key, stage, default=None)
        if value and not _REF.match(value):
            self.error_at(
                "schema-capability-ref", f"{value!r} is not name@version", node, key, stage
            )
        return value or None

    def integer(
        self, node: Node, key: str, stage: str, bounds: tuple[int, int], default: int | None
    ) -> int | None:
        value = self._scalar(node, key, stage, default)
        if value is None or value is default:
            return default
        if not holds(value, int):
            self.error_at(
                "schema-type", f"{key!r} must be an integer, got {value!r}", node, key, stage
            )
            return default
        lo, hi = bounds
        if not lo <= value <= hi:
            self.error_at(
                "schema-bound", f"{key} {value} is outside [{lo}, {hi}]", node, key, stage
            )
            return default
        return value

    def number(
        self, node: Node, key: str, stage: str, bounds: tuple[float, float], default: float
    ) -> float:
        value = self._scalar(node, key, stage, default)
        if not holds(value, float):
            self.error_at(
                "schema-type", f"{key!r} must be a number, got {value!r}", node, key, stage
            )
            return default
        lo, hi = bounds
        if not lo <= value <= hi:
            self.error_at(
                "schema-bound", f"{key} {value} is outside [{lo}, {hi}]", node, key, stage
            )
            return default
        return float(value)

    def boolean(self, node: Node, key: str, stage: str, default: bool) -> bool:
        value = self._scalar(node, key, stage, default)
        if not holds(value, bool):
            self.error_at("schema-type", f"{key!r} must be true or false", node, key, stage)
            return default
        return value

    def retry(self, node: Node, stage: str) -> RetryPolicy:
        d = RetryPolicy()
        n = self.child(node, "retry", stage, kind="map", required=False)
        if n is None:
            return d
        self.closed(n, set(RetryPolicy.__dataclass_fields__), stage)
        retry_on = self.names(n, "retry_on", stage, required=False) if n.get("retry_on") else None
        for cls in retry_on or ():
            if not _ERROR_CLASS.match(cls):
                self.error_at("schema-enum", f"{cls!r} is not an error class", n, "retry_on", stage)
        backoff = (0, limits.MAX_BACKOFF_MS)
        attempts = self.integer(n, "max_attempts", stage, (1, limits.MAX_ATTEMPTS), d.max_attempts)
        initial = self.integer(n, "initial_backoff_ms", stage, backoff, d.initial_backoff_ms)
        longest = self.integer(n, "max_backoff_ms", stage, backoff, d.max_backoff_ms)
        policy = RetryPolicy(
            max_attempts=attempts or 1,
            initial_backoff_ms=initial or 0,
            max_backoff_ms=longest or 0,
            multiplier=self.number(n, "multiplier", stage, (1.0, limits.MAX_MULTIPLIER), 2.0),
            jitter=self.number(n, "jitter", stage, (0.0, 1.0), d.jitter),
            retry_on=tuple(retry_on) if retry_on is not None else d.retry_on,
        )
        if policy.max_backoff_ms < policy.initial_backoff_ms:
            self.error_at(
                "schema-bound",
                "max_backoff_ms is below initial_backoff_ms",
                n,
                "max_backoff_ms",
                stage,
            )
        return policy

    def timeouts(self, node: Node, stage: str) -> Timeouts:
        d = Timeouts()
        run = (1, limits.MAX_EXECUTION_MS)
        n = self.child(node, "timeouts", stage, kind="map", required=False)
        top = self.integer(node, "execution_deadline_ms", stage, run, None)
        if n is None:
            return Timeouts(execution_deadline_ms=top) if top else d
        self.closed(n, set(Timeouts.__dataclass_fields__), stage)
        if top is not None and n.get("execution_deadline_ms") is not None:
            message = "execution_deadline_ms is given twice (stage and timeouts)"
            self.error_at(
                "schema-duplicate-deadline", message, node, "execution_deadline_ms", stage
            )
        execution = self.integer(
            n, "execution_deadline_ms", stage, run, top or d.execution_deadline_ms
        )
        execution = execution or d.execution_deadline_ms
        heartbeat = self.integer(n, "heartbeat_timeout_ms", stage, run, None)
        if heartbeat is not None and heartbeat > execution:
            message = "heartbeat_timeout_ms exceeds execution_deadline_ms"
            self.error_at("schema-bound", message, n, "heartbeat_timeout_ms", stage)
        queue = self.integer(
            n, "queue_deadline_ms", stage, (1, limits.MAX_QUEUE_MS), d.queue_deadline_ms
        )
        return Timeouts(
            queue_deadline_ms=queue or d.queue_deadline_ms,
            execution_deadline_ms=execution,
            heartbeat_timeout_ms=heartbeat,
        )
