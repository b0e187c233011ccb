"""`accord quarantine`: look at and act on deliveries nobody could read.

A worker that cannot read a job, and the engine's intake that cannot read an outcome, keep it as
a record on ``<queue>.quarantine`` (``{queue, message_id, reason, body}``, the body redacted and
cut to 4 KiB when it was written) and acknowledge the delivery, so the record is the only copy.
``list`` and ``show`` read the records without taking them; ``redrive`` publishes a record's body
to its queue again (under a fresh message id, so a queue that still knows the original id does
not drop it) and then removes the record: only a record that kept the whole body, unmasked and
as text, can be redriven, any other is refused with the reason. ``purge`` removes records for
good and asks for ``--yes``. Sensitive values are masked in both forms (see
:mod:`accord.cli._queue_admin`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from accord.cli._common import EXIT_OK, EXIT_USAGE, console, emit_json, refuse
from accord.cli._queue_admin import (
    DEFAULT_TRANSPORT,
    Admin,
    ContractsOpt,
    JsonOpt,
    QueueOpt,
    TransportOpt,
    base_queues,
    iso,
    pick,
    print_table,
    printable,
    report,
    with_admin,
)
from accord.cli._redaction import load_catalog_quietly
from accord.contracts.catalog import Catalog
from accord.contracts.redact import MASK, redact_quarantine_record
from accord.engine.ports import Waiting
from accord.engine.runtime.wire import QUARANTINE_BODY_CHARS, quarantine_queue, read_quarantine

app = typer.Typer(help="Inspect, redrive and purge quarantined deliveries.", no_args_is_help=True)

SUFFIX = ".quarantine"
REDRIVE_MARK = "#redrive-"
LIMIT = 10_000  # records read per quarantine queue
IdsArg = Annotated[list[str] | None, typer.Argument(help="record ids (see `list`)")]
AllOpt = Annotated[bool, typer.Option("--all", help="every record of the queues looked at")]


@dataclass(frozen=True, slots=True)
class Found:
    """One quarantine record as stored (unredacted: never printed as it is)."""

    quarantine_queue: str
    waiting: Waiting
    record: dict[str, Any]

    @property
    def id(self) -> str:
        return self.waiting.message_id


def _record(message: Waiting) -> dict[str, Any]:
    try:
        record = read_quarantine(message.body)
    except (ValueError, TypeError):
        record = None
    if isinstance(record, dict):
        return record
    origin = message.queue.removesuffix(SUFFIX)
    text = message.body.decode("utf-8", errors="replace")
    return {"queue": origin, "message_id": "", "reason": "not a quarantine record", "body": text}


async def _found(
    admin: Admin, queues: list[str] | None, catalog: Catalog | None
) -> tuple[list[str], list[Found]]:
    names, listed = await base_queues(admin, queues, catalog)
    if listed:
        looked = [n for n in names if n.endswith(SUFFIX)]
    else:
        looked = [n if n.endswith(SUFFIX) else quarantine_queue(n) for n in names]
    out = []
    for name in looked:
        out += [Found(name, w, _record(w)) for w in await admin.waiting(name, LIMIT)]
    return looked, out


def not_redrivable(record: dict[str, Any]) -> str | None:
    """Why a record cannot be redriven (its original is not all there), or None."""
    body, queue = record.get("body"), record.get("queue")
    if not isinstance(body, str) or not isinstance(queue, str) or not queue:
        return "the record does not carry a queue and a body"
    if len(body) >= QUARANTINE_BODY_CHARS:
        return f"its body was cut to {QUARANTINE_BODY_CHARS} characters when it was recorded"
    if MASK in body:
        return f"its body was recorded with sensitive values masked ({MASK})"
    if "\ufffd" in body:
        return "its body was not UTF-8 text and lost bytes when it was recorded"
    return None


def redrive_id(found: Found) -> str:
    """The message id a redriven record is published under: fresh (the queue may still know
    the original id and drop a republish), and the same for the same record (a redrive
    repeated after a crash is deduplicated where the transport deduplicates)."""
    original = str(found.record.get("message_id") or found.id)
    digest = hashlib.sha256(f"{found.quarantine_queue}\0{found.id}".encode()).hexdigest()[:12]
    return f"{original.split(REDRIVE_MARK, 1)[0]}{REDRIVE_MARK}{digest}"


def _view(found: Found, catalog: Catalog | None, *, body: bool) -> dict[str, Any]:
    shown = redact_quarantine_record(found.record, catalog.messages() if catalog else ())
    why = not_redrivable(found.record)
    out: dict[str, Any] = {
        "id": found.id,
        "quarantine_queue": found.quarantine_queue,
        "queue": shown.get("queue"),
        "message_id": shown.get("message_id"),
        "reason": shown.get("reason"),
        "recorded_at_ms": found.waiting.published_at_ms,
        "recorded_at": iso(found.waiting.published_at_ms),
        "delivery_count": found.waiting.delivery_count,
        "redrivable": why is None,
        "not_redrivable": why,
    }
    for extra in ("delivery", "member"):  # a batch member's record names where it came from
        if extra in shown:
            out[extra] = shown[extra]
    if body:
        out["body"] = shown.get("body")
    return out


def _pick(found: list[Found], ids: list[str] | None, every: bool, looked: list[str]) -> list[Found]:
    return pick(found, ids, every, looked, id_of=lambda f: f.id,
                queue_of=lambda f: f.quarantine_queue, noun="quarantine record")  # fmt: skip


@app.command("list")
def list_records(
    transport: TransportOpt = DEFAULT_TRANSPORT,
    queue: QueueOpt = None,
    json_out: JsonOpt = False,
    contracts: ContractsOpt = None,
) -> None:
    """List quarantine records: id, queue, reason, when, delivery count."""
    catalog = load_catalog_quietly(contracts)
    looked, found = with_admin(transport, lambda a: _found(a, queue, catalog))
    views = [_view(f, catalog, body=False) for f in found]
    if json_out:
        emit_json({"ok": True, "queues": looked, "records": views})
        raise typer.Exit(EXIT_OK)
    print_table(views, "recorded_at", "quarantine records", looked)


@app.command("show")
def show(
    record_id: Annotated[str, typer.Argument(help="the record's id (see `list`)")],
    transport: TransportOpt = DEFAULT_TRANSPORT,
    queue: QueueOpt = None,
    json_out: JsonOpt = False,
    contracts: ContractsOpt = None,
) -> None:
    """Show one quarantine record, its body with sensitive values masked."""
    catalog = load_catalog_quietly(contracts)
    looked, found = with_admin(transport, lambda a: _found(a, queue, catalog))
    (chosen,) = _pick(found, [record_id], False, looked)
    view = _view(chosen, catalog, body=True)
    if json_out:
        emit_json({"ok": True, "record": view})
        raise typer.Exit(EXIT_OK)
    for key in ("id", "quarantine_queue", "queue", "message_id", "reason", "recorded_at",
                "delivery_count", "delivery", "member"):  # fmt: skip
        if key in view:
            console.print(printable(f"{key}: {view[key]}"), markup=False)
    why = view["not_redrivable"]
    console.print(f"redrivable: {'yes' if why is None else f'no ({why})'}", markup=False)
    console.print("body:", markup=False)
    console.print(printable(str(view["body"])), markup=False, soft_wrap=True)


@app.command("redrive")
def redrive(  # noqa: PLR0917 - typer maps each option to a parameter
    record_ids: IdsArg = None,
    every: AllOpt = False,
    transport: TransportOpt = DEFAULT_TRANSPORT,
    queue: QueueOpt = None,
    json_out: JsonOpt = False,
    contracts: ContractsOpt = None,
) -> None:
    """Publish records' bodies to their queues again, then remove the records."""
    catalog = load_catalog_quietly(contracts)

    async def go(admin: Admin) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        looked, found = await _found(admin, queue, catalog)
        done, refused = [], []
        for f in _pick(found, record_ids, every, looked):
            why = not_redrivable(f.record)
            if why is not None:
                refused.append({"id": f.id, "reason": why})
                continue
            target, new_id = str(f.record["queue"]), redrive_id(f)
            # looked up first: a broker that fixes a queue's arguments when it is declared
            # (RabbitMQ) then takes the queue as it is, whatever this URL's options say
            await admin.waiting(target, 0)
            # publish first, then remove: a crash between leaves the record, never a loss
            await admin.publish(target, new_id, str(f.record["body"]).encode("utf-8"))
            if await admin.remove(f.quarantine_queue, [f.id]):
                done.append({"id": f.id, "queue": target, "published_as": new_id})
            else:
                refused.append({"id": f.id, "reason": "published, but the record was gone"})
        return done, refused

    done, refused = with_admin(transport, go)
    report(("redriven", "redrive"), done, refused, json_out)


@app.command("purge")
def purge(  # noqa: PLR0917 - typer maps each option to a parameter
    record_ids: IdsArg = None,
    every: AllOpt = False,
    yes: Annotated[bool, typer.Option("--yes", help="really remove them, for good")] = False,
    transport: TransportOpt = DEFAULT_TRANSPORT,
    queue: QueueOpt = None,
    json_out: JsonOpt = False,
    contracts: ContractsOpt = None,
) -> None:
    """Remove quarantine records for good (asks for --yes)."""
    catalog = load_catalog_quietly(contracts)

    async def go(admin: Admin) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        looked, found = await _found(admin, queue, catalog)
        chosen = _pick(found, record_ids, every, looked)
        if chosen and not yes:
            refuse(f"purge removes {len(chosen)} record(s) for good: add --yes", EXIT_USAGE)
        done, refused = [], []
        for f in chosen:
            if await admin.remove(f.quarantine_queue, [f.id]):
                done.append({"id": f.id, "quarantine_queue": f.quarantine_queue})
            else:
                refused.append({"id": f.id, "reason": "gone meanwhile"})
        return done, refused

    done, refused = with_admin(transport, go)
    report(("purged", "purge"), done, refused, json_out)
