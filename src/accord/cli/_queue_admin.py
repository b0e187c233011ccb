"""What ``accord quarantine`` and ``accord dead-letters`` share: the transport, the queues they
look at, and how a refused message is shown with its sensitive values masked.

**Queues.** ``--queue NAME`` (repeatable) names them. Without it, a transport that can list its
queues (embedded, memory, BullMQ) says which hold something; RabbitMQ cannot, so the known
queues are looked at: the engine's outcomes queue (``accord.outcomes``), each worker
capability's queue in the contract catalog, and their control queues.

**Redaction.** A quarantine record was redacted and cut to 4 KiB when it was written; it is
redacted again here by every contract of the catalog, in case its writer knew fewer. A dead
letter is the original job or outcome: its payload is masked by its own contract (a job's
``messageType@contractVersion``), members that contract does not know included. A result's
contract is the one its run's plan pins: with ``--store`` the run is read and its result's
sensitive fields masked as ``accord runs show`` masks them; without it, or when the run, its
plan or a pinned contract is unknown, the result is masked whole, as is any payload whose type
the catalog lacks and every envelope member the envelope does not define.
Members named like a sensitive field are masked anywhere, and every value masked is scrubbed
from the rest (the reason included). A body that is not JSON is cut and scrubbed by name.
Without a catalog every payload is masked whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

import typer

from accord.adapters import open_store, open_transport
from accord.cli._common import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, console, emit_json, refuse
from accord.cli._redaction import redaction_of
from accord.contracts.catalog import Catalog
from accord.contracts.redact import (
    MASK,
    NamedScrubber,
    Redaction,
    redact,
    scrub,
    scrub_pattern,
    sensitive_names,
)
from accord.engine.machine.state import RunState
from accord.engine.ports import QueueAdmin, Transport
from accord.engine.runtime.intake import OUTCOMES_QUEUE
from accord.engine.runtime.outbox import control_queue
from accord.engine.runtime.requests import RUNS_QUEUE
from accord.engine.runtime.wire import (
    ATTEMPT,
    BATCH_TYPE,
    FENCE,
    MESSAGE_ID,
    MESSAGE_TYPE,
    OUTCOMES,
    PAYLOAD,
    RUN_ID,
    STAGE,
    TENANT,
    WORKER_ID,
    UndecodableJson,
    decode_json,
)
from accord.errors import StoreError, TransportError

__all__ = [
    "DEFAULT_TRANSPORT",
    "ContractsOpt",
    "JsonOpt",
    "QueueOpt",
    "Results",
    "TransportOpt",
    "base_queues",
    "iso",
    "pick",
    "print_table",
    "printable",
    "report",
    "result_redactions",
    "result_stages",
    "shown_message",
    "with_admin",
]

DEFAULT_TRANSPORT = "sqlite:///.accord/accord.db"
TransportOpt = Annotated[
    str,
    typer.Option(
        "--transport", envvar="ACCORD_TRANSPORT", help="transport URL (sqlite:///…, bullmq://…)"
    ),
]
QueueOpt = Annotated[
    list[str] | None, typer.Option("--queue", help="look at this queue only (repeatable)")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]
ContractsOpt = Annotated[
    Path | None,
    typer.Option("--contracts", envvar="ACCORD_CONTRACTS", help="contract sources (redaction)"),
]
VIEW_CHARS = 65_536  # what `show` prints at most of a body that is not JSON
T = TypeVar("T")
R = TypeVar("R")  # a record listed: a quarantine record or a dead letter
Admin = Any  # a Transport that is also a QueueAdmin


def _quiet_url(url: str) -> tuple[str, str | None]:
    """``url`` with its password masked, and the password (to mask in messages)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url, None
    if not password:
        return url, None
    return url.replace(f":{password}@", f":{MASK}@", 1), password


def _sqlite_file(url: str) -> Path | None:
    """The file an embedded transport URL names (None for any other URL or ``:memory:``)."""
    scheme, _, rest = url.partition(":")
    if scheme.lower() not in ("sqlite", "embedded+sqlite") or not rest.startswith("///"):
        return None
    path = rest[3:].split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


def with_admin(url: str, body: Callable[[Admin], Awaitable[T]]) -> T:
    """Run ``body`` over the transport of ``url``; a transport that cannot be opened or reached
    is a one-line usage error (exit 2), its password never printed."""
    shown, password = _quiet_url(url)

    def quiet(text: str) -> str:
        text = (text.splitlines() or [""])[0]
        return text.replace(url, shown).replace(password, MASK) if password else text

    for noisy in ("aio_pika", "aiormq"):  # the error below says it once, on one line
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    file = _sqlite_file(url)
    if file is not None and not file.exists():
        refuse(f"transport {shown!r}: no such file {str(file)!r}", EXIT_USAGE)

    async def go() -> T:
        try:
            transport: Transport = open_transport(url)
        except TransportError as exc:
            refuse(quiet(str(exc)), EXIT_USAGE)
        try:
            if not isinstance(transport, QueueAdmin):
                refuse(f"transport {shown!r} cannot be inspected", EXIT_USAGE)
            return await body(transport)
        finally:
            with contextlib.suppress(Exception):
                await transport.close()

    try:
        return asyncio.run(go())
    except (TransportError, OSError) as exc:
        refuse(quiet(f"transport {shown!r}: {exc}"), EXIT_USAGE)


async def base_queues(
    admin: Admin, chosen: Iterable[str] | None, catalog: Catalog | None
) -> tuple[list[str], bool]:
    """The queues to look at, and whether the broker listed them itself (then they include
    the quarantine queues) rather than the caller or the catalog naming them."""
    named = list(dict.fromkeys(chosen or ()))
    if named:
        return named, False
    listed = await admin.queue_names()
    if listed is not None:
        return list(listed), True
    known = {OUTCOMES_QUEUE, RUNS_QUEUE}  # the engines' intake queues
    for capability in catalog.capabilities() if catalog else ():
        if capability.kind == "worker":
            known.add(capability.queue or capability.name)
    intake = (OUTCOMES_QUEUE, RUNS_QUEUE)
    return sorted(known | {control_queue(q) for q in known if q not in intake}), False


def iso(ms: int) -> str:
    """Epoch milliseconds as ISO-8601 UTC (``-`` for 0: the broker did not say)."""
    if ms <= 0:
        return "-"
    return f"{datetime.fromtimestamp(ms // 1000, tz=UTC):%Y-%m-%dT%H:%M:%S}.{ms % 1000:03d}Z"


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with control characters escaped: a hostile body cannot drive the terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


# -- a dead letter's body -----------------------------------------------------------------------

_OUTCOME_KINDS = frozenset({"accepted", "heartbeat", "progress", "failed"})  # payloads we know
_WIRE_NAMES = frozenset(
    {MESSAGE_ID, MESSAGE_TYPE, RUN_ID, STAGE, ATTEMPT, FENCE, TENANT, WORKER_ID, PAYLOAD}
    | {"contractVersion", "seq"}
)


def _whole(value: Any, found: list[Any]) -> Any:
    """``value`` masked whole (an object keeps its member names), its values noted."""
    if isinstance(value, dict):
        found.extend(Redaction([(k,) for k in value]).found(value))
        return {k: MASK for k in value}
    found.extend(Redaction([("v",)]).found({"v": value}))
    return MASK


Results = Mapping[tuple[str, str], Redaction | None]  # (run, stage) -> its result's redaction


@dataclass
class _View:
    """One body's walk: the values masked so far, to scrub from the rest."""

    catalog: Catalog | None
    results: Results
    known: frozenset[str]
    found: list[Any] = field(default_factory=list)

    def envelope(self, doc: Any) -> Any:
        if not isinstance(doc, dict):
            return _whole(doc, self.found)
        batch = doc.get(MESSAGE_TYPE) == BATCH_TYPE
        out: dict[str, Any] = {}
        for name, member in doc.items():
            if batch and name == OUTCOMES and isinstance(member, list):
                out[name] = [self.envelope(m) for m in member]
            elif name == PAYLOAD:
                out[name] = self.payload(doc, member)
            elif name in self.known or name in _WIRE_NAMES:
                out[name] = member
            else:
                out[name] = _whole(member, self.found)
        return out

    def payload(self, doc: dict[str, Any], payload: Any) -> Any:
        kind, version = doc.get(MESSAGE_TYPE), doc.get("contractVersion")
        contract = None
        if self.catalog is not None and isinstance(kind, str) and isinstance(version, int):
            with contextlib.suppress(ValueError, KeyError, TypeError):
                contract = self.catalog.message(f"{kind}@{version}")
        if contract is not None:
            self.found.extend(Redaction.of(contract).found(payload))
            return redact(contract, payload)  # members the contract does not know are masked
        if kind == "succeeded":  # a result: its contract is the one the run's plan pins
            result = self.results.get((str(doc.get(RUN_ID)), str(doc.get(STAGE))))
            if result is not None:
                self.found.extend(result.found(payload))
                return result.mask(payload)
        elif kind in _OUTCOME_KINDS and self.catalog is not None:
            return payload  # codes, counts and messages; scrubbed by name afterwards
        return _whole(payload, self.found)


def result_stages(body: bytes) -> set[tuple[str, str]]:
    """``(run, stage)`` of each result a dead letter's body carries (an outcome or a batch)."""
    try:
        doc = decode_json(body)
    except UndecodableJson:
        return set()
    members = doc.get(OUTCOMES) if isinstance(doc, dict) else None
    out = set()
    for each in [doc, *(members if isinstance(members, list) else [])]:
        if not isinstance(each, dict) or each.get(MESSAGE_TYPE) != "succeeded":
            continue
        if isinstance(each.get(RUN_ID), str) and isinstance(each.get(STAGE), str):
            out.add((each[RUN_ID], each[STAGE]))
    return out


async def result_redactions(
    store_url: str | None, wanted: Iterable[tuple[str, str]], catalog: Catalog | None
) -> dict[tuple[str, str], Redaction | None]:
    """The redaction of each ``(run, stage)`` result, from the run's plan in the store (None
    where the run, its plan or a pinned contract is unknown: that result is masked whole)."""
    wanted = set(wanted)
    if store_url is None or not wanted:
        return {}
    file = _sqlite_file(store_url)
    if file is not None and not file.exists():
        refuse(f"store {store_url!r}: no such file {str(file)!r}", EXIT_USAGE)
    try:
        store = open_store(store_url)
    except StoreError as exc:
        refuse(str(exc).splitlines()[0], EXIT_USAGE)
    out: dict[tuple[str, str], Redaction | None] = {}
    try:
        for run_id in sorted({r for r, _ in wanted}):
            stored = await store.load(run_id)
            if stored is None:
                continue
            run = RunState.from_json(stored.state)
            redaction = await redaction_of(store.get_plan, run, catalog)
            for stage in sorted(s for r, s in wanted if r == run_id):
                out[(run_id, stage)] = None if redaction.opaque else redaction.result(stage)
    except StoreError as exc:
        refuse(f"store: {str(exc).splitlines()[0]}", EXIT_USAGE)
    finally:
        await store.close()
    return out


def shown_message(
    body: bytes, reason: str, catalog: Catalog | None, results: Results | None = None
) -> tuple[str, str]:
    """``(body, reason)`` of a dead letter as an operator may see them (module docstring);
    ``results`` holds the redaction of the results it may carry (:func:`result_redactions`)."""
    contracts = catalog.messages() if catalog else []
    named = NamedScrubber(sensitive_names(contracts))
    found: list[Any] = []
    try:
        doc = decode_json(body)
    except UndecodableJson:
        text = named.text(body.decode("utf-8", errors="replace")[:VIEW_CHARS], found)
        pattern = scrub_pattern(found)
        return scrub(text, pattern), scrub(named.text(reason, found), scrub_pattern(found))
    envelope = catalog.message("envelope@2") if catalog else None  # v2 knows every v1 field
    known = frozenset(envelope.payload) if envelope else frozenset()
    view = _View(catalog, results or {}, known, found)
    masked = named.value(view.envelope(doc), found)
    reason = named.text(reason, found)
    pattern = scrub_pattern(found)
    text = json.dumps(scrub(masked, pattern), sort_keys=True, separators=(",", ":"))
    return text, scrub(reason, pattern)


def report(
    verbs: tuple[str, str],
    done: list[dict[str, Any]],
    refused: list[dict[str, Any]],
    json_out: bool,
) -> None:
    """What was done and what was refused; exit 1 when anything was refused."""
    verb, infinitive = verbs
    ok = not refused
    if json_out:
        doc: dict[str, Any] = {"ok": ok, verb: done, "refused": refused}
        if not ok:
            doc["error"] = f"{len(refused)} refused: {refused[0]['reason']}"
            doc["exit"] = EXIT_REFUSED
        emit_json(doc)
        raise typer.Exit(EXIT_OK if ok else EXIT_REFUSED)
    for d in done:
        if "published_as" in d:
            where = f" to {d['queue']} as {d['published_as']}"
        else:
            where = f" on {d.get('queue') or d.get('quarantine_queue')}"
        console.print(printable(f"{verb} {d['id']}{where}"), markup=False)
    if not done and not refused:
        console.print(f"nothing {verb}", markup=False)
    if refused:
        for r in refused[1:]:
            console.print(printable(f"refused {r['id']}: {r['reason']}"), markup=False)
        first = refused[0]
        refuse(printable(f"cannot {infinitive} {first['id']}: {first['reason']}"))


def pick(
    found: list[R],
    ids: list[str] | None,
    every: bool,
    looked: list[str],
    *,
    id_of: Callable[[R], str],
    queue_of: Callable[[R], str],
    noun: str,
) -> list[R]:
    """The records named (each once), or all with ``every``; an unknown id, or one found on
    several queues, refuses before anything is done (RabbitMQ does not deduplicate, so one id
    may also stand twice on one queue: the first is taken)."""
    if every == bool(ids):
        refuse(f"name {noun} ids or give --all (not both)", EXIT_USAGE)
    if every:
        return found
    out = []
    for wanted in dict.fromkeys(ids or ()):
        hits = [r for r in found if id_of(r) == wanted]
        if not hits:
            refuse(f"no {noun} {wanted!r} (looked in {', '.join(looked) or 'no queue'})")
        queues = sorted({queue_of(r) for r in hits})
        if len(queues) > 1:
            where = ", ".join(queues)
            refuse(f"{noun} {wanted!r} is in several queues ({where}): name one with --queue")
        out.append(hits[0])
    return out


def print_table(views: list[dict[str, Any]], when: str, nouns: str, looked: list[str]) -> None:
    """The text form of ``list``: id, queue, when, delivery count and reason, one row each."""
    if not views:
        console.print(f"no {nouns} (looked in {len(looked)} queue(s))", markup=False)
        return
    console.print(
        f"{'ID':<40} {'QUEUE':<24} {'WHEN':<24} {'DLV':>3}  REASON", markup=False, soft_wrap=True
    )
    for v in views:
        line = f"{v['id']:<40} {v['queue']!s:<24} {v[when]:<24} {v['delivery_count']:>3}"
        console.print(printable(f"{line}  {str(v['reason'])[:100]}"), markup=False, soft_wrap=True)
