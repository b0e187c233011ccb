"""What an operator sees of a run or in a log, with every sensitive value masked.

**Runs.** A run is pinned to its plan, and the plan to the exact contracts (``ref → digest``) its
context, requests and results are typed by. :meth:`RunRedaction.build` reads the sensitive
fields from those contracts (resolved in the contract catalog and checked against the pinned
digest) and places them in the run's documents:

* the context: the fields of the plan's context contract marked ``sensitive``, and every context
  path an input binding feeds into a sensitive field of a stage's request (a workflow without a
  context contract still knows where its context's secrets go);
* each stage's result: the sensitive fields of its capability's result contract, and every
  result path a later stage's binding feeds into a sensitive request field;

then masks them in ``runs show``/``history``/``explain``/``list`` (both forms), and scrubs every
echo of a value found there from the rest (an error message, a history note). A pinned contract
the catalog cannot supply at its digest fails closed: the context and every result are masked
whole.

**Logs.** :func:`configure_logging` gives the ``accord`` logger a handler on stderr whose
:class:`RedactingFilter` masks, in each record's message, arguments and traceback, the members
named like a sensitive field of any contract of the catalog, and every value seen there or noted
from a run (:meth:`RedactingFilter.note`, fed by :func:`run_observer`).

**Sealing keys.** :func:`sealing_from_env` reads the keyring the engine and workers seal
sensitive fields at rest with (:mod:`accord.contracts.sealing`): ``ACCORD_SEALING_KEY`` is the
current key, ``<key id>:<base64 of 32 random bytes>``; ``ACCORD_SEALING_KEYS`` lists retired
keys in the same form, comma-separated, kept so that values sealed before a rotation still open.
A view never opens a sealed value: it masks the field like any sensitive one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from accord.cli._common import EXIT_USAGE, refuse
from accord.contracts.catalog import Catalog
from accord.contracts.model import MessageContract
from accord.contracts.redact import (
    MASK,
    NamedScrubber,
    Redaction,
    field_paths,
    scrub,
    scrub_pattern,
    sensitive_names,
)
from accord.contracts.sealing import Keyring, SealingError
from accord.engine.machine.state import RunState
from accord.workflow.plan import Binding, CapabilityPin, Plan, TaskStage

__all__ = [
    "SEALING_KEYS_ENV",
    "SEALING_KEY_ENV",
    "RedactingFilter",
    "RunRedaction",
    "configure_logging",
    "load_catalog_quietly",
    "note_requests",
    "redaction_of",
    "run_observer",
    "sealing_from_env",
    "sealing_or_exit",
    "unconfigure_logging",
    "warn_unsealed",
]

SEALING_KEY_ENV = "ACCORD_SEALING_KEY"  # <key id>:<base64 of 32 bytes>: seals and opens
SEALING_KEYS_ENV = "ACCORD_SEALING_KEYS"  # retired keys, comma-separated: open only
LOG_LEVEL_ENV = "ACCORD_LOG_LEVEL"


def load_catalog_quietly(folder: Path | None) -> Catalog | None:
    """The contract catalog of ``folder`` (default: the enclosing repository's
    ``schemas/contracts``), or ``None`` when there is none to read."""
    from accord.contracts.sources import find_root, load_catalog  # noqa: PLC0415
    from accord.errors import AccordError  # noqa: PLC0415

    try:
        if folder is None or (not folder.is_absolute() and not folder.exists()):
            folder = find_root() / (folder or Path("schemas/contracts"))
        return load_catalog(folder)
    except (AccordError, OSError, ValueError):
        return None


# -- runs -------------------------------------------------------------------------------------


@dataclass
class RunRedaction:
    context: Redaction = field(default_factory=Redaction)
    results: dict[str, Redaction] = field(default_factory=dict)
    opaque: bool = False  # a pinned contract is unknown: mask context and results whole

    @classmethod
    def build(cls, plan: Plan | None, catalog: Catalog | None) -> RunRedaction:
        if plan is None or catalog is None:
            return cls(opaque=True)

        def pinned(ref: str | None) -> MessageContract | None:
            if ref is None:
                return None
            found = catalog.message(ref)
            if found is None or plan.contracts.get(ref) not in (None, catalog.digest(found)):
                raise LookupError(ref)
            return found

        try:
            out = cls(context=Redaction.of(pinned(plan.context_contract)))
            for name, pin in _pins(plan):
                out.results[name] = Redaction.of(pinned(pin.result))
            for stage in plan.stages:
                if isinstance(stage, TaskStage):
                    request = pinned(stage.capability.request)
                    out._taint(request, stage.input, ())
        except LookupError:
            return cls(opaque=True)
        return out

    def _taint(self, request: MessageContract | None, value: Any, at: tuple[str, ...]) -> None:
        """Mark what ``value`` (an input at ``at`` of ``request``) binds to as sensitive where
        the request's field at ``at`` is."""
        if request is None:
            return
        if isinstance(value, Binding):
            below = [p[len(at) :] for p in field_paths(request.payload) if p[: len(at)] == at]
            if not below:
                return
            paths = [(*value.path, *rest) for rest in below]
            if value.source == "context":
                self.context = self.context | Redaction(paths)
            elif value.stage is not None:
                known = self.results.get(value.stage, Redaction())
                self.results[value.stage] = known | Redaction(paths)
        elif isinstance(value, Mapping):
            for key, member in value.items():
                self._taint(request, member, (*at, str(key)))
        elif isinstance(value, list | tuple):
            for member in value:
                self._taint(request, member, (*at, "[]"))

    def result(self, stage: str) -> Redaction:
        return self.results.get(stage, Redaction())

    def values(self, run: RunState | None, history: Iterable[Mapping[str, Any]] = ()) -> list[Any]:
        """Every sensitive value of ``run`` and of the events of ``history``."""
        out: list[Any] = []
        if run is not None:
            out += self.context.found(run.context)
            for name, stage in run.stages.items():
                if stage.result is not None:
                    out += self.result(name).found(stage.result)
        for entry in history:
            event = entry.get("event") or {}
            if "context" in event:
                out += self.context.found(event["context"])
            if "result" in event:
                out += self.result(str(event.get("stage", ""))).found(event["result"])
        return out

    def _masked(self, redaction: Redaction, value: Any) -> Any:
        if self.opaque and isinstance(value, Mapping):
            return {k: MASK for k in value}
        return redaction.mask(value)

    def run_json(self, run: RunState, pattern: re.Pattern[str] | None) -> dict[str, Any]:
        doc = run.to_json()
        doc["context"] = self._masked(self.context, doc["context"])
        for name, stage in doc["stages"].items():
            if stage.get("result") is not None:
                stage["result"] = self._masked(self.result(name), stage["result"])
        if self.opaque and doc.get("result") is not None:
            doc["result"] = self._masked(Redaction(), doc["result"])
        out: dict[str, Any] = scrub(doc, pattern)
        return out

    def entry_json(self, entry: Mapping[str, Any], pattern: re.Pattern[str] | None) -> Any:
        doc = dict(entry)
        event = dict(doc.get("event") or {})
        if "context" in event:
            event["context"] = self._masked(self.context, event["context"])
        if "result" in event:
            event["result"] = self._masked(
                self.result(str(event.get("stage", ""))), event["result"]
            )
        doc["event"] = event
        return scrub(doc, pattern)


def _pins(plan: Plan) -> Iterable[tuple[str, CapabilityPin]]:
    """The capability of every stage (and pseudo-stage) whose record may hold a result."""
    for stage in plan.stages:
        if isinstance(stage, TaskStage):
            yield stage.name, stage.capability
            if stage.compensate is not None:
                yield f"@compensate/{stage.name}", stage.compensate
    for i, pin in enumerate(plan.finalisers):
        yield f"@finaliser/{i}", pin


async def redaction_of(
    plan_of: Callable[[str], Any], run: RunState, catalog: Catalog | None
) -> RunRedaction:
    """The redaction of ``run`` (``plan_of`` reads a stored plan document by digest)."""
    doc = await plan_of(run.plan_digest)
    plan = None
    if doc is not None:
        try:
            plan = Plan.from_json(doc)
        except (ValueError, KeyError, TypeError):
            plan = None
    return RunRedaction.build(plan, catalog)


# -- logs -------------------------------------------------------------------------------------

_KEEP = 4096  # the most recent sensitive values a process scrubs from its logs


class RedactingFilter(logging.Filter):
    """Masks sensitive members and values in every record it passes (it never drops one)."""

    def __init__(self, catalog: Catalog | None = None) -> None:
        super().__init__()
        self._named = NamedScrubber(sensitive_names(catalog.messages() if catalog else []))
        self._values: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self._pattern: re.Pattern[str] | None = None

    def note(self, values: Iterable[Any]) -> None:
        """Scrub these values from every later record."""
        with self._lock:
            fresh = False
            for value in values:
                text = str(value)
                if text not in self._values:
                    fresh = True
                self._values[text] = None
                self._values.move_to_end(text)
            while len(self._values) > _KEEP:
                self._values.popitem(last=False)
            if fresh:
                self._pattern = scrub_pattern(self._values)

    def filter(self, record: logging.LogRecord) -> bool:
        found: list[Any] = []
        if record.args:
            args = record.args
            record.args = self._named.value(args, found)
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            message = str(record.msg)
        message = self._named.text(message, found)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        exc_text = self._named.text(record.exc_text, found) if record.exc_text else record.exc_text
        stack = (
            self._named.text(record.stack_info, found) if record.stack_info else record.stack_info
        )
        if found:
            self.note(found)
        pattern = self._pattern
        record.msg, record.args = scrub(message, pattern), None
        record.exc_text = scrub(exc_text, pattern) if exc_text else exc_text
        record.stack_info = scrub(stack, pattern) if stack else stack
        return True


_installed: list[tuple[logging.Handler, RedactingFilter]] = []


class _Stderr(logging.StreamHandler[TextIO]):
    """Writes to ``stream``, or to ``sys.stderr`` as it is when a record comes (a CLI runner
    swaps it between invocations)."""

    def __init__(self, stream: TextIO | None) -> None:
        super().__init__(stream or sys.stderr)
        self._fixed = stream is not None

    def emit(self, record: logging.LogRecord) -> None:
        if not self._fixed:
            self.stream = sys.stderr
        super().emit(record)


def configure_logging(
    catalog: Catalog | None, level: str | None = None, stream: TextIO | None = None
) -> RedactingFilter:
    """Log ``accord``'s records to ``stream`` (stderr) through a :class:`RedactingFilter` built
    from ``catalog``, at ``level`` or ``$ACCORD_LOG_LEVEL`` when one is given (else the root
    logger's, ``WARNING`` by default). A later call replaces the handler and filter an earlier
    one installed. The filter sits on the handler (and on the ``accord`` logger itself), so every
    ``accord.*`` record is redacted in place before any handler sees it, a root handler
    included."""
    logger = logging.getLogger("accord")
    chosen = level or os.environ.get(LOG_LEVEL_ENV)
    if chosen:
        logger.setLevel(chosen.upper())
    unconfigure_logging()
    redacting = RedactingFilter(catalog)
    handler = _Stderr(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(redacting)
    logger.addHandler(handler)
    logger.addFilter(redacting)  # records logged on "accord" itself
    _installed.append((handler, redacting))
    return redacting


def unconfigure_logging() -> None:
    """Take away what :func:`configure_logging` installed (the level is left as it is)."""
    logger = logging.getLogger("accord")
    while _installed:
        old, old_filter = _installed.pop()
        logger.removeHandler(old)
        logger.removeFilter(old_filter)


def run_observer(redacting: RedactingFilter, engine: Any, catalog: Catalog | None) -> Any:
    """An engine observer noting each new run's sensitive values (and each sensitive result)
    in ``redacting``, so that an echo of one in a later record is scrubbed."""
    tasks: set[asyncio.Task[None]] = set()

    async def note(run: RunState, history: list[dict[str, Any]]) -> None:
        try:
            redaction = await redaction_of(engine.store.get_plan, run, catalog)
        except Exception as exc:  # the store is away: the run's own views still mask its fields
            logging.getLogger("accord.cli").warning(
                "run %s: its sensitive values are not noted for log scrubbing (%s)",
                run.run_id, type(exc).__name__,
            )  # fmt: skip
            return
        redacting.note(redaction.values(run, history))

    def observe(delivered: Any) -> None:
        kinds = {h.event.get("kind") for h in delivered.history}
        if delivered.run is None or not kinds & {"run-started", "stage-succeeded"}:
            return
        history = [h.to_json() for h in delivered.history]
        task = asyncio.get_running_loop().create_task(note(delivered.run, history))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    return observe


def sealing_from_env(environ: Mapping[str, str] | None = None) -> Keyring | None:
    """The sealing keyring the environment configures (:data:`SEALING_KEY_ENV`, the current
    key, and :data:`SEALING_KEYS_ENV`, retired keys kept for opening), or ``None`` for none;
    raises :class:`~accord.contracts.sealing.SealingError` naming the bad entry."""
    env = os.environ if environ is None else environ
    current, retired = env.get(SEALING_KEY_ENV, "").strip(), env.get(SEALING_KEYS_ENV, "")
    if not current:
        if retired.strip():
            raise SealingError(f"{SEALING_KEYS_ENV} is set but {SEALING_KEY_ENV} is not")
        return None
    try:
        return Keyring.parse(current, retired)
    except SealingError as exc:
        raise SealingError(f"{SEALING_KEY_ENV}/{SEALING_KEYS_ENV}: {exc}") from None


def sealing_or_exit(
    what: str, catalog: Catalog | None = None, *, needs_catalog: bool = False
) -> Keyring | None:
    """:func:`sealing_from_env` for a command's start-up: a bad key is one line, exit 2. An
    engine seals by the contracts' ``sensitive`` marks: with a key but no catalog
    (``needs_catalog``) it says that it seals nothing."""
    try:
        keys = sealing_from_env()
    except SealingError as exc:
        refuse(f"{what} not started: {exc}", EXIT_USAGE)
    if keys is not None and needs_catalog and catalog is None:
        logging.getLogger("accord.security").warning(
            "%s is set but no contract catalog was found: the %s seals nothing (--contracts)",
            SEALING_KEY_ENV,
            what,
        )
    return keys


_warned: set[str] = set()


def warn_unsealed(store_url: str) -> None:
    """Warn, once per process, that the embedded default keeps sensitive values in clear."""
    if os.environ.get(SEALING_KEY_ENV) or not store_url.startswith("sqlite:") or _warned:
        return
    _warned.add(store_url)
    logging.getLogger("accord.security").warning(
        "no sealing key (%s) is configured: sensitive values are stored in clear at rest in %s",
        SEALING_KEY_ENV,
        store_url,
    )


def note_requests(worker: Any, redacting: RedactingFilter, catalog: Catalog | None) -> None:
    """Wrap each handler of ``worker`` (a :class:`~accord.worker.Worker`) so that the sensitive
    values of every request it is given (by its capability's request contract) are noted in
    ``redacting`` before the handler runs: a worker process logs no echo of them either."""
    import dataclasses  # noqa: PLC0415

    if catalog is None:
        return
    for ref, binding in list(worker.bindings.items()):
        capability = catalog.capability(ref)
        request = catalog.message(capability.request) if capability is not None else None
        redaction = Redaction.of(request)
        if not redaction:
            continue
        worker.bindings[ref] = dataclasses.replace(
            binding, handler=_noting(binding.handler, binding.is_async, redaction, redacting)
        )


def _noting(fn: Any, is_async: bool, redaction: Redaction, redacting: RedactingFilter) -> Any:
    if is_async:

        async def noted_async(payload: Any, ctx: Any) -> Any:
            redacting.note(redaction.found(payload))
            return await fn(payload, ctx)

        return noted_async

    def noted(payload: Any, ctx: Any) -> Any:
        redacting.note(redaction.found(payload))
        return fn(payload, ctx)

    return noted
