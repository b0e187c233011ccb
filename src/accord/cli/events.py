"""`accord events to-cloudevent|from-cloudevent`: the envelope as a CloudEvents 1.0 event and back.

Thin commands over :mod:`accord.contracts.cloudevents`. The envelope is checked against its contract
(``envelope@2`` of the workspace, which every ``envelope@1`` satisfies) on the way out and the
envelope read back is checked on the way in, so neither command lets through a message the engine
would refuse.

Modes: ``structured`` (default) is one JSON object, the ``application/cloudevents+json`` form.
``binary`` is the HTTP binding, written and read as one JSON document
``{"headers": {"ce-id": "...", "content-type": "application/json", ...}, "body": "<text>"}``,
the body being the payload's JSON text (``""`` without a payload).

Exit codes: 0 ok, 1 the input is refused (not strict JSON, not a valid envelope, not an event
of the Accord mapping), 2 usage error (unreadable file, bad option). Output is the event (or
the envelope) as JSON on stdout; with ``--json`` it is wrapped as ``{"ok": true, ...}`` and a
refusal is one JSON document too.
"""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from accord.cli._common import emit_json, refuse, usage
from accord.cli._registry import workspace
from accord.contracts import cloudevents
from accord.contracts.model import MessageContract
from accord.contracts.paths import join
from accord.contracts.strictjson import JsonRejected, loads_strict
from accord.errors import FieldViolation

app = typer.Typer(help="Map envelopes to CloudEvents 1.0 events and back.", no_args_is_help=True)

ENVELOPE = "envelope@2"  # the current envelope; every envelope@1 document is valid under it


class Mode(StrEnum):
    structured = "structured"
    binary = "binary"


FileArg = Annotated[str, typer.Argument(help="JSON file, or - for stdin.")]
ModeOpt = Annotated[
    Mode, typer.Option("--mode", help="structured (one JSON event) or binary (headers + body).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document for scripts.")]


def _read(file: str) -> Any:
    """The strict JSON document in ``file`` (``-``: stdin); unreadable is a usage error."""
    try:
        data = sys.stdin.buffer.read() if file == "-" else Path(file).read_bytes()
    except OSError as exc:
        usage(f"cannot read {file}: {exc.strerror}")
    try:
        return loads_strict(data)
    except JsonRejected as exc:
        where = f" at {exc.path}" if exc.path else ""
        refuse(f"{file}: not strict JSON ({exc.code}){where}: {exc}")


def _envelope_contract() -> MessageContract:
    try:
        contract = workspace().resolve(ENVELOPE)
    except LookupError as exc:
        usage(str(exc))
    if not isinstance(contract, MessageContract):
        usage(f"{ENVELOPE} is not a message contract")
    return contract


def _check(envelope: Any, what: str) -> None:
    """Refuse ``envelope`` unless ``envelope@2`` accepts it as it stands (no default added)."""
    from accord.contracts.validate import Validator  # noqa: PLC0415 - compiles schemas on import

    result = Validator.for_contract(_envelope_contract()).validate(envelope)
    if not result.ok:
        first: FieldViolation = result.violations[0]
        more = f" (and {len(result.violations) - 1} more)" if len(result.violations) > 1 else ""
        refuse(f"{what} is not a valid {ENVELOPE}: {first.path or '$'}: {first.message}{more}")
    if result.value != envelope:
        refuse(f"{what} is not a valid {ENVELOPE} as it stands: its defaults would change it")


@app.command("to-cloudevent")
def to_cloudevent(file: FileArg, mode: ModeOpt = Mode.structured, json: JsonOpt = False) -> None:
    """Print the CloudEvents 1.0 event of one envelope."""
    envelope = _read(file)
    _check(envelope, file)
    try:
        if mode is Mode.structured:
            event: Any = cloudevents.to_structured(envelope)
        else:
            message = cloudevents.to_binary(envelope)
            event = {"headers": message.headers, "body": message.body.decode("utf-8")}
    except cloudevents.CloudEventError as exc:
        refuse(f"{file}: {exc}")
    emit_json({"ok": True, "mode": mode.value, "event": event} if json else event)


@app.command("from-cloudevent")
def from_cloudevent(file: FileArg, mode: ModeOpt = Mode.structured, json: JsonOpt = False) -> None:
    """Print the envelope of one CloudEvents 1.0 event made by the Accord mapping."""
    doc = _read(file)
    try:
        if mode is Mode.structured:
            envelope = cloudevents.from_structured(doc)
        else:
            headers, body = _binary_parts(doc, file)
            envelope = cloudevents.from_binary(headers, body)
    except cloudevents.CloudEventError as exc:
        refuse(f"{file}: {exc}")
    _check(envelope, f"the envelope of {file}")
    emit_json({"ok": True, "mode": mode.value, "envelope": envelope} if json else envelope)


def _binary_parts(doc: Any, file: str) -> tuple[dict[str, str], bytes]:
    """``{"headers": {name: text}, "body": text}``, the binary mode's JSON spelling."""
    if not isinstance(doc, dict) or set(doc) - {"headers", "body"} or "headers" not in doc:
        refuse(f'{file}: binary mode reads {{"headers": {{...}}, "body": "..."}}')
    headers, body = doc["headers"], doc.get("body", "")
    if not isinstance(headers, dict):
        refuse(f"{file}: headers: not a JSON object")
    for name, value in headers.items():
        if not isinstance(value, str):
            refuse(f"{file}: {join('headers', name)}: not a string")
    if not isinstance(body, str):
        refuse(f"{file}: body: not a string (the payload's JSON text)")
    return headers, body.encode("utf-8")
