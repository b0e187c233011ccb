"""`accord dead-letters`: look at and redrive deliveries past their queue's delivery limit.

A transport dead-letters a delivery nacked (or leased and lost) past its queue's delivery limit,
and one its broker cannot make a delivery of at all; it keeps it with the reason, never drops it
and never delivers it again on its own. ``list`` and ``show`` read them without taking them (the
body is the original job or outcome, shown with its sensitive values masked: see
:mod:`accord.cli._queue_admin`); ``redrive`` puts them back on their queue with a fresh delivery
count, each out of the dead letters only once it is back. Ids are message ids; one that is
dead-lettered on several queues needs ``--queue``.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from accord.cli._common import EXIT_OK, console, emit_json
from accord.cli._queue_admin import (
    DEFAULT_TRANSPORT,
    Admin,
    ContractsOpt,
    JsonOpt,
    QueueOpt,
    Results,
    TransportOpt,
    base_queues,
    iso,
    pick,
    print_table,
    printable,
    report,
    result_redactions,
    result_stages,
    shown_message,
    with_admin,
)
from accord.cli._redaction import load_catalog_quietly
from accord.contracts.catalog import Catalog
from accord.engine.ports import DeadLetter

app = typer.Typer(help="Inspect and redrive dead letters.", no_args_is_help=True)

IdsArg = Annotated[list[str] | None, typer.Argument(help="message ids (see `list`)")]
AllOpt = Annotated[bool, typer.Option("--all", help="every dead letter of the queues looked at")]


StoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store", help="store URL: results are masked by their run's pinned contracts, not whole"
    ),
]


async def _found(
    admin: Admin, queues: list[str] | None, catalog: Catalog | None
) -> tuple[list[str], list[DeadLetter]]:
    looked, _ = await base_queues(admin, queues, catalog)
    out: list[DeadLetter] = []
    for name in looked:
        out += await admin.dead_letter_records(name)
    return looked, out


async def _with_results(
    admin: Admin, queues: list[str] | None, catalog: Catalog | None, store: str | None
) -> tuple[list[str], list[DeadLetter], Results]:
    looked, found = await _found(admin, queues, catalog)
    wanted = {key for dead in found for key in result_stages(dead.body)}
    return looked, found, await result_redactions(store, wanted, catalog)


def _view(
    dead: DeadLetter, catalog: Catalog | None, *, body: bool, results: Results | None = None
) -> dict[str, Any]:
    text, reason = shown_message(dead.body, dead.reason, catalog, results)
    out: dict[str, Any] = {
        "id": dead.message_id,
        "queue": dead.queue,
        "reason": reason,
        "dead_at_ms": dead.dead_at_ms,
        "dead_at": iso(dead.dead_at_ms),
        "delivery_count": dead.delivery_count,
        "body_bytes": len(dead.body),
    }
    if body:
        out["body"] = text
    return out


def _pick(
    found: list[DeadLetter], ids: list[str] | None, every: bool, looked: list[str]
) -> list[DeadLetter]:
    return pick(found, ids, every, looked, id_of=lambda d: d.message_id,
                queue_of=lambda d: d.queue, noun="dead letter")  # fmt: skip


@app.command("list")
def list_dead(
    transport: TransportOpt = DEFAULT_TRANSPORT,
    queue: QueueOpt = None,
    json_out: JsonOpt = False,
    contracts: ContractsOpt = None,
) -> None:
    """List dead letters: id, queue, reason, when, delivery count."""
    catalog = load_catalog_quietly(contracts)
    looked, found = with_admin(transport, lambda a: _found(a, queue, catalog))
    views = [_view(d, catalog, body=False) for d in found]
    if json_out:
        emit_json({"ok": True, "queues": looked, "dead_letters": views})
        raise typer.Exit(EXIT_OK)
    print_table(views, "dead_at", "dead letters", looked)


@app.command("show")
def show(  # noqa: PLR0917 - typer maps each option to a parameter
    message_id: Annotated[str, typer.Argument(help="the message id (see `list`)")],
    transport: TransportOpt = DEFAULT_TRANSPORT,
    queue: QueueOpt = None,
    json_out: JsonOpt = False,
    contracts: ContractsOpt = None,
    store: StoreOpt = None,
) -> None:
    """Show one dead letter, its body with sensitive values masked."""
    catalog = load_catalog_quietly(contracts)
    looked, found, results = with_admin(
        transport, lambda a: _with_results(a, queue, catalog, store)
    )
    (chosen,) = _pick(found, [message_id], False, looked)
    view = _view(chosen, catalog, body=True, results=results)
    if json_out:
        emit_json({"ok": True, "dead_letter": view})
        raise typer.Exit(EXIT_OK)
    for key in ("id", "queue", "reason", "dead_at", "delivery_count", "body_bytes"):
        console.print(printable(f"{key}: {view[key]}"), markup=False)
    console.print("body:", markup=False)
    console.print(printable(str(view["body"])), markup=False, soft_wrap=True)


@app.command("redrive")
def redrive(  # noqa: PLR0917 - typer maps each option to a parameter
    message_ids: IdsArg = None,
    every: AllOpt = False,
    transport: TransportOpt = DEFAULT_TRANSPORT,
    queue: QueueOpt = None,
    json_out: JsonOpt = False,
    contracts: ContractsOpt = None,
) -> None:
    """Put dead letters back on their queues with a fresh delivery count."""
    catalog = load_catalog_quietly(contracts)

    async def go(admin: Admin) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        looked, found = await _found(admin, queue, catalog)
        chosen = _pick(found, message_ids, every, looked)
        by_queue: dict[str, list[str]] = {}
        for dead in chosen:
            by_queue.setdefault(dead.queue, []).append(dead.message_id)
        done, refused = [], []
        for name, ids in by_queue.items():
            back = set(await admin.redrive_dead(name, list(dict.fromkeys(ids))))
            for message_id in dict.fromkeys(ids):
                if message_id in back:
                    done.append({"id": message_id, "queue": name})
                else:
                    refused.append({"id": message_id, "reason": "left the dead letters meanwhile"})
        return done, refused

    done, refused = with_admin(transport, go)
    report(("redriven", "redrive"), done, refused, json_out)
