"""Triggers and budgets: what may start a run of a workflow, and how many may run.

A definition may declare ``triggers:`` — the ways new runs are proposed — and ``budgets:`` —
the limits admission holds them to (docs/triggers.md). Both are compiled with the rest of the
plan and covered by its digest, so a changed schedule or budget is a new plan.

Three trigger types:

- ``schedule``: ``cron`` (five fields, evaluated with cronsim in ``timezone``, DST-correct),
  ``overlap`` (``skip`` | ``buffer-one`` | ``allow`` | ``cancel-previous``), ``catch_up``
  (``none`` | ``latest`` | ``all``, bounded by ``catch_up_limit``) and a literal ``context``
  that must satisfy the workflow's context contract;
- ``webhook``: ``source`` (a configured sender: its secrets and tenants), ``event`` (the message
  contract the body must satisfy), ``context`` (literals and whole-string ``${event.a.b}``
  bindings, typed against the event and context contracts) and ``dedupe`` (``${event.…}``, a
  string or integer field: one run per key within the retention window);
- ``message``: ``event``, ``queue`` (any transport), ``context`` and ``dedupe`` as above.

Codes (each finding names the trigger as its ``stage`` and the line of the field):
``trigger-type``, ``trigger-duplicate-name``, ``trigger-cron``, ``trigger-timezone``,
``trigger-unknown-event``, ``trigger-no-context-contract``, ``trigger-binding-syntax``,
``trigger-binding-unknown-field``, ``trigger-binding-type``, ``trigger-binding-optional``,
``trigger-context-unknown-field``, ``trigger-context-missing``, ``trigger-context-invalid``,
``trigger-dedupe``, ``trigger-catch-up-limit``, plus the ``schema-*`` codes of the field
readers (unknown, missing, wrongly typed or out-of-bound fields, names, enums).

Pure: the caller supplies the catalog; timezones are read from the interpreter's tz database.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from accord.contracts.model import ContractRef, FieldSpec, MessageContract
from accord.contracts.validate import Validator
from accord.contracts.yamlsource import Node, location_of
from accord.errors import Diagnostic
from accord.workflow.catalog import ContractCatalogLike
from accord.workflow.schema_fields import SchemaReader

__all__ = [
    "CATCH_UP",
    "OVERLAP",
    "TRIGGER_TYPES",
    "Budgets",
    "EventBinding",
    "EventTrigger",
    "ScheduleTrigger",
    "Trigger",
    "budgets_from_json",
    "budgets_to_json",
    "check_intake",
    "event_value",
    "render_context",
    "trigger_from_json",
    "trigger_to_json",
]

TRIGGER_TYPES = ("schedule", "webhook", "message")
OVERLAP = ("skip", "buffer-one", "allow", "cancel-previous")
CATCH_UP = ("none", "latest", "all")
MAX_TRIGGERS = 64
MAX_CATCH_UP = 1_000
DEFAULT_CATCH_UP_LIMIT = 10
MAX_BUDGET = 1_000_000
_EVENT = re.compile(r"^\$\{\s*event((?:\.[A-Za-z_][A-Za-z0-9_]*)+)\s*\}$")
_QUEUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$")

_COMMON = {"name", "type", "context"}
_FIELDS: dict[str, set[str]] = {
    "schedule": _COMMON | {"cron", "timezone", "overlap", "catch_up", "catch_up_limit"},
    "webhook": _COMMON | {"source", "event", "dedupe"},
    "message": _COMMON | {"event", "queue", "dedupe"},
}
_BUDGET_KEYS = (
    "max_concurrent_runs",
    "max_concurrent_runs_per_tenant",
    "max_runs_per_hour",
    "max_attempts_total",
)


@dataclass(frozen=True, slots=True)
class EventBinding:
    """``${event.a.b}``: the value at ``path`` of the event, of ``type`` (the event field's)."""

    path: tuple[str, ...]
    type: str

    @property
    def text(self) -> str:
        return "${event." + ".".join(self.path) + "}"


@dataclass(frozen=True, slots=True)
class ScheduleTrigger:
    name: str
    cron: str
    timezone: str = "UTC"
    overlap: Literal["skip", "buffer-one", "allow", "cancel-previous"] = "skip"
    catch_up: Literal["none", "latest", "all"] = "none"
    catch_up_limit: int = DEFAULT_CATCH_UP_LIMIT
    context: Mapping[str, Any] = field(default_factory=dict)
    line: int = field(default=0, compare=False)
    type: Literal["schedule"] = "schedule"


@dataclass(frozen=True, slots=True)
class EventTrigger:
    """A ``webhook`` (``source`` set) or ``message`` (``queue`` set) trigger."""

    name: str
    type: Literal["webhook", "message"]
    event: str
    context: Mapping[str, Any | EventBinding] = field(default_factory=dict)
    dedupe: EventBinding | None = None
    source: str | None = None
    queue: str | None = None
    line: int = field(default=0, compare=False)


Trigger = ScheduleTrigger | EventTrigger


@dataclass(frozen=True, slots=True)
class Budgets:
    """Admission limits; ``None`` means unlimited."""

    max_concurrent_runs: int | None = None
    max_concurrent_runs_per_tenant: int | None = None
    max_runs_per_hour: int | None = None
    max_attempts_total: int | None = None


# --- values at run time ----------------------------------------------------------------------


class _Absent:
    pass


ABSENT: Any = _Absent()


def event_value(event: Mapping[str, Any], binding: EventBinding) -> Any:
    """The value ``binding`` names in ``event`` (:data:`ABSENT` when a step is missing)."""
    value: Any = event
    for step in binding.path:
        if not isinstance(value, Mapping) or step not in value:
            return ABSENT
        value = value[step]
    return value


def render_context(trigger: Trigger, event: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The context a run started by ``trigger`` gets: literals as written, bindings resolved
    from ``event`` (an absent optional value leaves its key out)."""
    out: dict[str, Any] = {}
    for key, value in trigger.context.items():
        if isinstance(value, EventBinding):
            got = event_value(event or {}, value)
            if got is not ABSENT:
                out[key] = got
        else:
            out[key] = value
    return out


# --- canonical JSON --------------------------------------------------------------------------


def _value_to_json(value: Any) -> Any:
    return (
        {"$event": list(value.path), "type": value.type}
        if isinstance(value, EventBinding)
        else value
    )


def _value_from_json(value: Any) -> Any:
    if isinstance(value, Mapping) and set(value) == {"$event", "type"}:
        return EventBinding(tuple(value["$event"]), str(value["type"]))
    return value


def trigger_to_json(t: Trigger, with_lines: bool = False) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": t.name, "type": t.type}
    if isinstance(t, ScheduleTrigger):
        doc |= {
            "cron": t.cron,
            "timezone": t.timezone,
            "overlap": t.overlap,
            "catch_up": t.catch_up,
            "catch_up_limit": t.catch_up_limit,
            "context": dict(sorted(t.context.items())),
        }
    else:
        doc |= {
            "event": t.event,
            "context": {k: _value_to_json(v) for k, v in sorted(t.context.items())},
            "dedupe": _value_to_json(t.dedupe) if t.dedupe is not None else None,
        }
        if t.source is not None:
            doc["source"] = t.source
        if t.queue is not None:
            doc["queue"] = t.queue
    if with_lines:
        doc["line"] = t.line
    return doc


def trigger_from_json(doc: Mapping[str, Any]) -> Trigger:
    line = int(doc.get("line", 0))
    if doc["type"] == "schedule":
        return ScheduleTrigger(
            name=doc["name"],
            cron=doc["cron"],
            timezone=doc["timezone"],
            overlap=doc["overlap"],
            catch_up=doc["catch_up"],
            catch_up_limit=int(doc["catch_up_limit"]),
            context=dict(doc.get("context") or {}),
            line=line,
        )
    dedupe = doc.get("dedupe")
    return EventTrigger(
        name=doc["name"],
        type=doc["type"],
        event=doc["event"],
        context={k: _value_from_json(v) for k, v in (doc.get("context") or {}).items()},
        dedupe=_value_from_json(dedupe) if dedupe is not None else None,
        source=doc.get("source"),
        queue=doc.get("queue"),
        line=line,
    )


def budgets_to_json(b: Budgets) -> dict[str, Any]:
    return {k: getattr(b, k) for k in _BUDGET_KEYS}


def budgets_from_json(doc: Mapping[str, Any]) -> Budgets:
    return Budgets(**{k: doc.get(k) for k in _BUDGET_KEYS})


# --- compile checks --------------------------------------------------------------------------


def _compatible(have: str, want: str) -> bool:
    return have == want or (have == "integer" and want == "number")


class _Checker:
    def __init__(self, root: Node, catalog: ContractCatalogLike, filename: str) -> None:
        self.root, self.catalog, self.filename = root, catalog, filename
        self.r = SchemaReader()
        self.contracts: dict[str, str] = {}
        self.context: MessageContract | None = None
        self.context_ref: str | None = None

    def diag(self, code: str, message: str, node: Node, key: str | None, trigger: str) -> None:
        self.r.diagnostics.append(
            Diagnostic(code, message, location_of(node, key), path=key or "", stage=trigger)
        )

    def message(self, ref_text: str, node: Node, key: str, trigger: str) -> MessageContract | None:
        try:
            ref = ContractRef.parse(ref_text)
        except ValueError:
            self.diag(
                "trigger-unknown-event", f"{ref_text!r} is not name@version", node, key, trigger
            )
            return None
        found = self.catalog.message(ref)
        if found is None:
            self.diag(
                "trigger-unknown-event",
                f"message contract {ref} is not in the catalog",
                node,
                key,
                trigger,
            )
            return None
        self.contracts[str(ref)] = self.catalog.digest(ref)
        return found

    def run(self) -> tuple[tuple[Trigger, ...], Budgets | None]:
        root = self.root
        ctx = root.get("context")
        if ctx is not None and ctx.kind == "scalar" and isinstance(ctx.value, str):
            try:
                ref = ContractRef.parse(ctx.value)
                self.context = self.catalog.message(ref)
                self.context_ref = str(ref)
            except ValueError:
                self.context = None  # the schema layer reports the reference
        budgets = self.budgets()
        seq = self.r.child(root, "triggers", "", kind="seq", required=False)
        out: list[Trigger] = []
        seen: set[str] = set()
        for item in seq.items if seq is not None else ():
            if len(out) >= MAX_TRIGGERS:
                self.r.error_at(
                    "schema-bound", f"more than {MAX_TRIGGERS} triggers", root, "triggers"
                )
                break
            t = self.trigger(item)
            if t is None:
                continue
            if t.name in seen:
                self.diag(
                    "trigger-duplicate-name",
                    f"trigger {t.name!r} is declared twice",
                    item,
                    "name",
                    t.name,
                )
                continue
            seen.add(t.name)
            out.append(t)
        return tuple(out), budgets

    def budgets(self) -> Budgets | None:
        node = self.r.child(self.root, "budgets", "", kind="map", required=False)
        if node is None:
            return None
        self.r.closed(node, set(_BUDGET_KEYS), "")
        values = {k: self.r.integer(node, k, "", (1, MAX_BUDGET), None) for k in _BUDGET_KEYS}
        return Budgets(**values)

    def trigger(self, node: Node) -> Trigger | None:
        r = self.r
        if node.kind != "map":
            r.error_at("schema-type", "a trigger is a mapping", node)
            return None
        name = r.name(node, "name", "")
        type_ = r.text(node, "type", name)
        if type_ not in TRIGGER_TYPES:
            if type_:
                self.diag(
                    "trigger-type",
                    f"trigger type {type_!r} is not one of {TRIGGER_TYPES}",
                    node,
                    "type",
                    name,
                )
            return None
        r.closed(node, _FIELDS[type_], name)
        before = len(r.diagnostics)
        t = self.schedule(node, name) if type_ == "schedule" else self.event(node, name, type_)
        failed = any(d.severity == "error" for d in r.diagnostics[before:])
        return None if failed else t

    def schedule(self, node: Node, name: str) -> ScheduleTrigger | None:
        r = self.r
        cron = r.text(node, "cron", name)
        tz = r.text(node, "timezone", name, default="UTC")
        overlap = r.choice(node, "overlap", name, OVERLAP, default="skip")
        catch_up = r.choice(node, "catch_up", name, CATCH_UP, default="none")
        limit = r.integer(node, "catch_up_limit", name, (1, MAX_CATCH_UP), None)
        if limit is not None and catch_up != "all":
            self.diag(
                "trigger-catch-up-limit",
                f"catch_up_limit applies only to catch_up: all (this is {catch_up!r})",
                node,
                "catch_up_limit",
                name,
            )
        zone: ZoneInfo | None = None
        if isinstance(tz, str) and tz:
            try:
                zone = ZoneInfo(tz)
            except (ZoneInfoNotFoundError, ValueError):
                self.diag("trigger-timezone", f"unknown timezone {tz!r}", node, "timezone", name)
        if isinstance(cron, str) and cron:
            if len(cron.split()) != 5:
                self.diag(
                    "trigger-cron", f"cron {cron!r} must have five fields", node, "cron", name
                )
            else:
                try:
                    next(CronSim(cron, datetime(2000, 1, 1, tzinfo=zone or ZoneInfo("UTC"))))
                except (CronSimError, StopIteration) as exc:
                    self.diag(
                        "trigger-cron", f"cron {cron!r} is invalid: {exc}", node, "cron", name
                    )
        context = self.literal_context(node, name)
        return ScheduleTrigger(
            name=name,
            cron=cron,
            timezone=tz,
            overlap=overlap or "skip",
            catch_up=catch_up or "none",
            catch_up_limit=limit or DEFAULT_CATCH_UP_LIMIT,
            context=context,
            line=node.location.line,
        )

    def literal_context(self, node: Node, name: str) -> dict[str, Any]:
        ctx_node = self.r.child(node, "context", name, kind="map", required=False)
        context: dict[str, Any] = ctx_node.plain() if ctx_node is not None else {}
        if self.context is not None:
            result = Validator.for_contract(self.context).validate(context)
            if not result.ok:
                said = "; ".join(f"{v.path}: {v.message}" for v in result.violations[:8])
                self.diag(
                    "trigger-context-invalid",
                    f"context breaks {self.context_ref}: {said}",
                    node,
                    "context",
                    name,
                )
        return context

    def binding(
        self, text: str, event: MessageContract, node: Node, key: str, name: str
    ) -> tuple[EventBinding | None, FieldSpec | None]:
        m = _EVENT.match(text)
        if m is None:
            self.diag(
                "trigger-binding-syntax",
                f"{text!r} is not a whole ${{event.a.b}} binding",
                node,
                key,
                name,
            )
            return None, None
        path = tuple(m.group(1)[1:].split("."))
        fields: Mapping[str, FieldSpec] | None = event.payload
        spec: FieldSpec | None = None
        optional = False
        for i, step in enumerate(path):
            spec = fields.get(step) if fields is not None else None
            if spec is None:
                self.diag(
                    "trigger-binding-unknown-field",
                    f"{event.ref} has no field {'.'.join(path[: i + 1])}",
                    node,
                    key,
                    name,
                )
                return None, None
            optional = optional or not spec.required or spec.nullable
            fields = spec.fields
        assert spec is not None
        if optional and key.startswith("dedupe"):
            self.diag(
                "trigger-binding-optional",
                f"{text} is optional in {event.ref}; a dedupe key must always be present",
                node,
                key,
                name,
            )
        return EventBinding(path, spec.type), (spec if not optional else None)

    def event(self, node: Node, name: str, type_: str) -> EventTrigger | None:
        r = self.r
        ref = r.text(node, "event", name)
        source = r.name(node, "source", name) if type_ == "webhook" else None
        queue = r.text(node, "queue", name) if type_ == "message" else None
        if queue and not _QUEUE.match(queue):
            r.error_at(
                "schema-name", f"queue {queue!r} is not a valid queue name", node, "queue", name
            )
        event = self.message(ref, node, "event", name) if ref else None
        context: dict[str, Any] = {}
        ctx_node = r.child(node, "context", name, kind="map", required=False)
        if ctx_node is not None and self.context is None:
            self.diag(
                "trigger-no-context-contract",
                "a trigger with a context needs the workflow's context contract",
                node,
                "context",
                name,
            )
        if ctx_node is not None and event is not None and self.context is not None:
            context = self.event_context(ctx_node, event, name)
        dedupe: EventBinding | None = None
        d_text = r.text(node, "dedupe", name, default=None)
        if d_text is not None and event is not None:
            d_binding, _ = self.binding(str(d_text), event, node, "dedupe", name)
            if d_binding is not None and d_binding.type not in ("string", "integer"):
                self.diag(
                    "trigger-dedupe",
                    f"dedupe {d_text} is a {d_binding.type}; it must be a string or integer",
                    node,
                    "dedupe",
                    name,
                )
            dedupe = d_binding
        return EventTrigger(
            name=name,
            type="webhook" if type_ == "webhook" else "message",
            event=ref,
            context=context,
            dedupe=dedupe,
            source=source,
            queue=queue,
            line=node.location.line,
        )

    def event_context(self, ctx_node: Node, event: MessageContract, name: str) -> dict[str, Any]:
        assert self.context is not None
        want = self.context.payload
        out: dict[str, Any] = {}
        for key, value, _ in ctx_node.entries:
            path = f"context.{key}"
            spec = want.get(key)
            if spec is None:
                self.diag(
                    "trigger-context-unknown-field",
                    f"{self.context_ref} has no field {key!r}",
                    ctx_node,
                    key,
                    name,
                )
                continue
            if value.kind == "scalar" and isinstance(value.value, str) and "${" in value.value:
                binding, bound = self.binding(value.value, event, ctx_node, key, name)
                if binding is None:
                    continue
                if not _compatible(binding.type, spec.type):
                    self.diag(
                        "trigger-binding-type",
                        f"{binding.text} is a {binding.type}; {path} wants a {spec.type}",
                        ctx_node,
                        key,
                        name,
                    )
                    continue
                if bound is None and spec.required:
                    self.diag(
                        "trigger-binding-optional",
                        f"{binding.text} is optional in {event.ref}; {path} is required",
                        ctx_node,
                        key,
                        name,
                    )
                    continue
                out[key] = binding
            else:
                out[key] = value.plain()
        for key, spec in sorted(want.items()):
            written = any(k == key for k, _, _ in ctx_node.entries)
            if spec.required and not spec.has_default and key not in out and not written:
                self.diag(
                    "trigger-context-missing",
                    f"required context field {key!r} is not bound",
                    ctx_node,
                    None,
                    name,
                )
        return out


def check_intake(
    root: Node, catalog: ContractCatalogLike, filename: str = ""
) -> tuple[tuple[Trigger, ...], Budgets | None, dict[str, str], list[Diagnostic]]:
    """Read and check ``triggers:`` and ``budgets:`` of a definition's root node: the triggers,
    the budgets (``None`` when not declared), the event contracts they pin (ref → artefact
    digest) and every finding."""
    checker = _Checker(root, catalog, filename)
    triggers, budgets = checker.run()
    return triggers, budgets, checker.contracts, checker.r.diagnostics
