"""The CloudEvents 1.0 form of the envelope (``envelope@2``, and so ``envelope@1``), both ways,
without loss.

The envelope contract says it maps onto a CloudEvents 1.0 event; this module is that mapping,
so an Accord message can cross any CloudEvents transport (HTTP, Kafka, an event router) and come
back as the very envelope it was: ``from_cloudevent(*to_cloudevent(e)) == e`` for every envelope
``to_cloudevent`` accepts, nulls, integers and timestamp texts included. It is pure (no I/O):
the caller checks the envelope against its contract before and after, as ``accord events`` does.
The TypeScript binding (``bindings/typescript/src/cloudevents.ts``) implements the same mapping
and the cross-language test holds the two to the same output. ``docs/cloudevents.md`` is the
reader's version of this table.

Attributes (CloudEvents names: lower-case ``a-z0-9``, at most 20 characters):

=================== ===================== ==============================================
envelope            attribute             rule
=================== ===================== ==============================================
(constant)          ``specversion``       ``"1.0"``
messageId           ``id``                as is
producer            ``source``            ``urn:accord:producer:`` + percent-encoded UTF-8
                                          (everything but ``A-Za-z0-9-._~`` is ``%XX``), so
                                          any producer text is a valid URI and comes back
messageType,        ``type``              ``accord.<messageType>.v<contractVersion>``; the
contractVersion                           message type has no ``.``, so it splits back
(derived)           ``dataschema``        the published schema's ``$id`` of
                                          messageType@contractVersion,
                                          ``urn:accord:contract:<name>:<version>``; checked
                                          on the way back, never a source of truth
occurredAt          ``time`` and          ``time`` for CloudEvents consumers; the SDKs
                    ``accordtime``        re-render it (the npm package as milliseconds,
                                          the Python one through ``datetime``), so the exact
                                          text also travels as ``accordtime``, which wins;
                                          the two must name the same instant (to the
                                          millisecond)
runId, stage        ``subject``           derived: ``runs/<runId>`` or
                                          ``runs/<runId>/stages/<stage>`` (each
                                          percent-encoded) when there is a runId; checked
payload             data                  ``datacontenttype`` ``application/json``; no data
                                          when the envelope has no payload
traceparent         ``traceparent``       the distributed-tracing extension, as is
correlationId ...   ``accord*``           the extensions of ``EXTENSIONS`` below
payloadRef          ``accordrefdigest``,  the claim check's three fields, all or none
                    ``accordrefkey``,
                    ``accordrefsize``
explicit nulls      ``accordnulls``       the space-separated names of the extensions whose
                                          envelope value is ``null``
=================== ===================== ==============================================

Why these choices:

- **Nulls.** CloudEvents has no null attribute value (the JSON format reads a null as absent),
  yet ``causationId: null`` (a root message) differs from no ``causationId``. An absent field
  is an absent attribute; a null one is an absent attribute *named in* ``accordnulls``. No
  string can collide with a marker, since there is no marker value.
- **Integers.** ``attempt``, ``resultSchemaVersion`` and ``payloadRef.sizeBytes`` are
  CloudEvents Integers (32-bit signed) when they fit, and the decimal digits as a String
  otherwise (an object of 3 GB has a size above ``2**31 - 1``). Binary headers are strings in
  any case: the reader types every attribute by the envelope contract, never by its look.
- **Time.** CloudEvents ``time`` is RFC 3339, as is the envelope's ``date-time``, but a
  timestamp is text in Accord (it is hashed and compared as written): ``accordtime`` keeps it.
- **payloadRef** is a claim check, not data: the event's data stays the inline payload (or is
  absent), and the reference travels beside it as three extensions.
- **Strictness.** Anything the mapping cannot carry back is refused with a
  :class:`CloudEventError` naming the field or attribute: an unknown envelope field, an unknown
  attribute (another extension would be lost on the way back), a wrong type, a derived attribute
  that disagrees, a non-JSON content type.

Binary mode (the HTTP binding): every attribute is a ``ce-<name>`` header, percent-encoded as
the binding's section 3.1.3.2 says (printable ASCII stays, except space, ``"`` and ``%``);
``datacontenttype`` is the ``Content-Type`` header and the body is the payload's JSON text in
UTF-8 (empty without a payload). Header names are read case-insensitively; headers that are
neither ``ce-*`` nor ``content-type`` (``host``, ``content-length`` ...) are the transport's and
are ignored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple

from accord.contracts.jsonschema import schema_id
from accord.contracts.strictjson import JsonRejected, loads_strict
from accord.errors import ContractError

__all__ = [
    "EXTENSIONS",
    "SPECVERSION",
    "BinaryMessage",
    "CloudEvent",
    "CloudEventError",
    "Extension",
    "from_binary",
    "from_cloudevent",
    "from_structured",
    "to_binary",
    "to_cloudevent",
    "to_structured",
]

SPECVERSION: Final = "1.0"
JSON_CONTENT_TYPE: Final = "application/json"
SOURCE_PREFIX: Final = "urn:accord:producer:"
TYPE_PREFIX: Final = "accord."
NULLS: Final = "accordnulls"
TIME_TEXT: Final = "accordtime"
INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1

_TYPE = re.compile(r"accord\.([a-z][a-z0-9-]*)\.v([1-9][0-9]*)", re.ASCII)
_MESSAGE_TYPE = re.compile(r"[a-z][a-z0-9-]*", re.ASCII)
_DECIMAL = re.compile(r"-?(?:0|[1-9][0-9]*)", re.ASCII)
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# the HTTP binding's safe set: printable ASCII (U+0021..U+007E) except '"' and '%'
_HEADER_SAFE = frozenset(range(0x21, 0x7F)) - {0x22, 0x25}
_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_DATE_TIME = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?"
    r"(?:[Zz]|([+-])([0-9]{2}):([0-9]{2}))",
    re.ASCII,
)


class CloudEventError(ContractError):
    """An envelope the mapping cannot carry, or an event that is not one it made; ``name`` is
    the envelope field (on the way out) or the CloudEvents attribute (on the way back)."""

    code = "cloudevent-invalid"

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        super().__init__(f"{name}: {reason}")


@dataclass(frozen=True, slots=True)
class Extension:
    """One envelope field carried as one attribute: ``kind`` types it back (binary headers are
    all strings), ``nullable`` says whether ``accordnulls`` may name it."""

    field: str
    attribute: str
    kind: type[str] | type[int]
    nullable: bool = False


EXTENSIONS: Final[tuple[Extension, ...]] = (
    Extension("correlationId", "accordcorrelation", str),
    Extension("causationId", "accordcausation", str, nullable=True),
    Extension("tenant", "accordtenant", str),
    Extension("workflow", "accordworkflow", str),
    Extension("runId", "accordrun", str),
    Extension("stage", "accordstage", str),
    Extension("branch", "accordbranch", str, nullable=True),
    Extension("attempt", "accordattempt", int),
    Extension("fence", "accordfence", str),
    Extension("definitionDigest", "accorddefdigest", str),
    Extension("idempotencyKey", "accordidempotency", str),
    Extension("deadline", "accorddeadline", str),
    Extension("resultSchemaVersion", "accordresultver", int),
    Extension("traceparent", "traceparent", str),
    Extension("replyTo", "accordreplyto", str),  # envelope@2: where the job's outcomes go
)
PAYLOAD_REF: Final[tuple[Extension, ...]] = (
    Extension("digest", "accordrefdigest", str),
    Extension("objectKey", "accordrefkey", str),
    Extension("sizeBytes", "accordrefsize", int),
)
_BY_ATTRIBUTE: Final = {x.attribute: x for x in EXTENSIONS}
_REQUIRED: Final = ("messageId", "messageType", "contractVersion", "producer", "occurredAt")
_CORE: Final = frozenset(
    {"specversion", "id", "source", "type", "time", "dataschema", "subject", "datacontenttype"}
)
_ENVELOPE_FIELDS: Final = frozenset(
    {*_REQUIRED, *(x.field for x in EXTENSIONS), "payload", "payloadRef"}
)
_KNOWN: Final = frozenset(
    {*_CORE, *_BY_ATTRIBUTE, *(x.attribute for x in PAYLOAD_REF), NULLS, TIME_TEXT}
)

Attributes = dict[str, str | int]


class CloudEvent(NamedTuple):
    """An event as attributes and data (``None``: no data; a payload is never ``null``)."""

    attributes: Attributes
    data: dict[str, Any] | None


class BinaryMessage(NamedTuple):
    """Binary mode over HTTP: ``ce-*`` headers (and ``content-type``) and the body's bytes."""

    headers: dict[str, str]
    body: bytes


# -- envelope -> event -------------------------------------------------------------------------


def to_cloudevent(envelope: Mapping[str, Any]) -> CloudEvent:
    """The event of ``envelope``; :class:`CloudEventError` names the first field it cannot
    carry (unknown, missing, of the wrong type, or null where the contract has no null)."""
    if not isinstance(envelope, Mapping):
        raise CloudEventError("$", "the envelope is not a JSON object")
    for name in sorted(set(envelope) - _ENVELOPE_FIELDS):
        raise CloudEventError(name, "not an envelope field")
    for name in _REQUIRED:
        if name not in envelope:
            raise CloudEventError(name, "missing")
    message_type = _string(envelope, "messageType")
    if not _MESSAGE_TYPE.fullmatch(message_type):
        raise CloudEventError("messageType", "does not match ^[a-z][a-z0-9-]*$")
    version = _integer(envelope, "contractVersion")
    if version < 1:
        raise CloudEventError("contractVersion", "must be at least 1")
    occurred = _string(envelope, "occurredAt")
    if _instant(occurred) is None:
        raise CloudEventError("occurredAt", "not an RFC 3339 date-time")
    attrs: Attributes = {
        "specversion": SPECVERSION,
        "id": _string(envelope, "messageId"),
        "source": SOURCE_PREFIX + _percent(_string(envelope, "producer"), "producer"),
        "type": f"{TYPE_PREFIX}{message_type}.v{version}",
        "time": occurred,
        TIME_TEXT: occurred,
        "dataschema": schema_id(message_type, version),
    }
    nulls: list[str] = []
    for ext in EXTENSIONS:
        if ext.field not in envelope:
            continue
        if envelope[ext.field] is None:
            if not ext.nullable:
                raise CloudEventError(ext.field, "null, and the envelope has no null here")
            nulls.append(ext.attribute)
            continue
        attrs[ext.attribute] = _out(envelope, ext)
    if nulls:
        attrs[NULLS] = " ".join(sorted(nulls))
    subject = _subject(envelope.get("runId"), envelope.get("stage"))
    if subject is not None:
        attrs["subject"] = subject
    if "payloadRef" in envelope:
        ref = envelope["payloadRef"]
        if not isinstance(ref, Mapping):
            raise CloudEventError("payloadRef", "not a JSON object")
        for name in sorted(set(ref) - {x.field for x in PAYLOAD_REF}):
            raise CloudEventError(f"payloadRef.{name}", "not a payloadRef field")
        for ext in PAYLOAD_REF:
            if ext.field not in ref:
                raise CloudEventError(f"payloadRef.{ext.field}", "missing")
            attrs[ext.attribute] = _out(ref, ext, "payloadRef.")
    data: dict[str, Any] | None = None
    if "payload" in envelope:
        payload = envelope["payload"]
        if not isinstance(payload, dict):
            raise CloudEventError("payload", "not a JSON object")
        data = payload
        attrs["datacontenttype"] = JSON_CONTENT_TYPE
    return CloudEvent(attrs, data)


def to_structured(envelope: Mapping[str, Any]) -> dict[str, Any]:
    """Structured mode: the event as one JSON object (``application/cloudevents+json``)."""
    event = to_cloudevent(envelope)
    doc: dict[str, Any] = dict(event.attributes)
    if event.data is not None:
        doc["data"] = event.data
    return doc


def to_binary(envelope: Mapping[str, Any]) -> BinaryMessage:
    """Binary mode: ``ce-*`` headers, ``content-type`` and the payload's JSON text as body."""
    event = to_cloudevent(envelope)
    headers: dict[str, str] = {}
    for name, value in event.attributes.items():
        text = _header_encode(str(value), name)
        headers["content-type" if name == "datacontenttype" else f"ce-{name}"] = text
    body = b"" if event.data is None else json_bytes(event.data)
    return BinaryMessage(headers, body)


def json_bytes(value: Any) -> bytes:
    """Compact JSON in UTF-8, keys in their order: the body of a binary-mode event."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


# -- event -> envelope -------------------------------------------------------------------------


def from_cloudevent(attributes: Mapping[str, Any], data: Any = None) -> dict[str, Any]:
    """The envelope of an event ``to_cloudevent`` made (or an equal one an SDK re-encoded;
    ``time`` may be the aware ``datetime`` the Python SDK parses it into);
    :class:`CloudEventError` names the first attribute that is unknown, missing, of the wrong
    type or not the one the mapping derives."""
    attrs = dict(attributes)
    for name in sorted(attrs):
        if name not in _KNOWN:
            raise CloudEventError(name, "not an attribute of the Accord mapping")
    if _text(attrs, "specversion") != SPECVERSION:
        raise CloudEventError("specversion", f"must be {SPECVERSION!r}")
    kind = _TYPE.fullmatch(_text(attrs, "type"))
    if kind is None:
        raise CloudEventError("type", "not accord.<messageType>.v<contractVersion>")
    message_type, version = kind.group(1), int(kind.group(2))
    source = _text(attrs, "source")
    if not source.startswith(SOURCE_PREFIX):
        raise CloudEventError("source", f"does not start with {SOURCE_PREFIX!r}")
    envelope: dict[str, Any] = {
        "messageId": _text(attrs, "id"),
        "messageType": message_type,
        "contractVersion": version,
        "producer": _unpercent(source[len(SOURCE_PREFIX) :], "source", uri=True),
        "occurredAt": _occurred(attrs),
    }
    if "dataschema" in attrs and _text(attrs, "dataschema") != schema_id(message_type, version):
        raise CloudEventError("dataschema", f"is not {schema_id(message_type, version)!r}")
    nulls = _nulls(attrs)
    for ext in EXTENSIONS:
        if ext.attribute in nulls:
            envelope[ext.field] = None
        elif ext.attribute in attrs:
            envelope[ext.field] = _in(attrs, ext)
    present = [x for x in PAYLOAD_REF if x.attribute in attrs]
    if present:
        if len(present) != len(PAYLOAD_REF):
            missing = next(x for x in PAYLOAD_REF if x.attribute not in attrs)
            raise CloudEventError(missing.attribute, "missing beside the other payloadRef ones")
        envelope["payloadRef"] = {x.field: _in(attrs, x) for x in PAYLOAD_REF}
    subject = _subject(envelope.get("runId"), envelope.get("stage"))
    if attrs.get("subject") != subject:
        want = "absent without accordrun" if subject is None else f"{subject!r}"
        raise CloudEventError("subject", f"must be {want}, from accordrun and accordstage")
    content_type = attrs.get("datacontenttype")
    if data is not None:
        if content_type is not None and not _is_json(content_type):
            raise CloudEventError("datacontenttype", f"must be {JSON_CONTENT_TYPE!r}")
        if not isinstance(data, dict):
            raise CloudEventError("data", "the payload must be a JSON object")
        envelope["payload"] = data
    return envelope


def from_structured(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The envelope of a structured-mode event (one JSON object)."""
    if not isinstance(doc, Mapping):
        raise CloudEventError("$", "a structured event is a JSON object")
    if "data_base64" in doc:
        raise CloudEventError("data_base64", "the payload travels as JSON data")
    attrs = {k: v for k, v in doc.items() if k != "data" and v is not None}
    return from_cloudevent(attrs, doc.get("data"))


def from_binary(headers: Mapping[str, str | int], body: bytes) -> dict[str, Any]:
    """The envelope of a binary-mode event: ``ce-*`` headers, ``content-type`` and the body."""
    attrs: dict[str, Any] = {}
    for raw_name, raw in headers.items():
        name = raw_name.lower()
        # the SDK's v1 API hands integer attributes over unrendered
        value = str(raw) if isinstance(raw, int) and not isinstance(raw, bool) else raw
        if not isinstance(value, str):
            raise CloudEventError(name, "a header value is a string")
        if name == "content-type":
            attrs["datacontenttype"] = value
        elif name.startswith("ce-"):
            if name[3:] in attrs:
                raise CloudEventError(name, "repeated")
            attrs[name[3:]] = _unpercent(value, name, uri=False)
    data: Any = None
    if body:
        if not _is_json(attrs.get("datacontenttype", "")):
            raise CloudEventError("content-type", f"must be {JSON_CONTENT_TYPE!r} for a body")
        try:
            data = loads_strict(bytes(body))
        except JsonRejected as exc:
            raise CloudEventError("body", f"not strict JSON ({exc.code}): {exc}") from exc
        if data is None:
            raise CloudEventError("body", "the payload must be a JSON object")
    return from_cloudevent(attrs, data)


# -- the pieces --------------------------------------------------------------------------------


def _string(envelope: Mapping[str, Any], name: str, prefix: str = "") -> str:
    value = envelope[name]
    if not isinstance(value, str):
        raise CloudEventError(prefix + name, "not a string")
    return value


def _integer(envelope: Mapping[str, Any], name: str, prefix: str = "") -> int:
    value = envelope[name]
    if not isinstance(value, int) or isinstance(value, bool):
        raise CloudEventError(prefix + name, "not an integer")
    return value


def _out(source: Mapping[str, Any], ext: Extension, prefix: str = "") -> str | int:
    """An envelope value as its attribute value: integers outside CloudEvents' 32-bit Integer
    travel as their decimal digits."""
    if ext.kind is str:
        return _string(source, ext.field, prefix)
    value = _integer(source, ext.field, prefix)
    return value if INT32_MIN <= value <= INT32_MAX else str(value)


def _text(attrs: Mapping[str, Any], name: str) -> str:
    if name not in attrs:
        raise CloudEventError(name, "missing")
    value = attrs[name]
    if not isinstance(value, str):
        raise CloudEventError(name, "not a string")
    return value


def _in(attrs: Mapping[str, Any], ext: Extension) -> str | int:
    """An attribute value back as its envelope value, typed by the contract."""
    value = attrs[ext.attribute]
    if ext.kind is str:
        if not isinstance(value, str):
            raise CloudEventError(ext.attribute, "not a string")
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and _DECIMAL.fullmatch(value):
        return int(value)
    raise CloudEventError(ext.attribute, "not an integer")


def _nulls(attrs: Mapping[str, Any]) -> set[str]:
    if NULLS not in attrs:
        return set()
    names = _text(attrs, NULLS).split(" ")
    for name in names:
        ext = _BY_ATTRIBUTE.get(name)
        if ext is None or not ext.nullable:
            raise CloudEventError(NULLS, f"{name!r} is not a nullable Accord attribute")
        if name in attrs:
            raise CloudEventError(NULLS, f"{name!r} is named null and also has a value")
    if len(set(names)) != len(names):
        raise CloudEventError(NULLS, "names an attribute twice")
    return set(names)


def _occurred(attrs: Mapping[str, Any]) -> str:
    stamp = attrs.get("time")
    if isinstance(stamp, datetime) and stamp.tzinfo is not None:  # an SDK's parsed time
        utc = stamp.astimezone(UTC)
        attrs = {**attrs, "time": utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
    time = _text(attrs, "time")
    when = _instant(time)
    if when is None:
        raise CloudEventError("time", "not an RFC 3339 date-time")
    if TIME_TEXT not in attrs:
        return time
    text = _text(attrs, TIME_TEXT)
    exact = _instant(text)
    if exact is None:
        raise CloudEventError(TIME_TEXT, "not an RFC 3339 date-time")
    if exact != when:
        raise CloudEventError("time", f"is not the instant of {TIME_TEXT} {text!r}")
    return text


def _instant(text: str) -> tuple[int, int] | None:
    """An RFC 3339 date-time as (seconds since the epoch, milliseconds), the precision every SDK
    keeps; ``None`` when ``text`` is not one. Plain arithmetic, as in the TypeScript binding, so
    a leap second (``:60``) is the next second in both."""
    found = _DATE_TIME.fullmatch(text)
    if found is None:
        return None
    y, mo, d, h, mi, s = (int(found.group(i)) for i in range(1, 7))
    if not (1 <= mo <= 12 and 1 <= d <= 31 and h <= 23 and mi <= 59 and s <= 60):
        return None
    seconds = _days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + s
    if found.group(8):
        offset = int(found.group(9)) * 3600 + int(found.group(10)) * 60
        seconds -= offset if found.group(8) == "+" else -offset
    millis = int((found.group(7) or "").ljust(3, "0")[:3])
    return seconds, millis


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date, any year (H. Hinnant's algorithm;
    the standard library stops at year 1, the RFC 3339 grammar starts at year 0)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468


def _subject(run: Any, stage: Any) -> str | None:
    if not isinstance(run, str):
        return None
    subject = "runs/" + _percent(run, "runId")
    if isinstance(stage, str):
        subject += "/stages/" + _percent(stage, "stage")
    return subject


def _percent(text: str, name: str) -> str:
    """Every UTF-8 byte outside the URI unreserved set as ``%XX`` (upper-case hex)."""
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CloudEventError(name, "not encodable as UTF-8 (a lone surrogate)") from exc
    return "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in raw)


def _header_encode(text: str, name: str) -> str:
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CloudEventError(name, "not encodable as UTF-8 (a lone surrogate)") from exc
    return "".join(chr(b) if b in _HEADER_SAFE else f"%{b:02X}" for b in raw)


def _unpercent(text: str, name: str, *, uri: bool) -> str:
    """Strict percent-decoding: every ``%`` starts two hex digits and the bytes are UTF-8; in a
    URI (``uri``) only unreserved characters may stand for themselves."""
    if _PERCENT.search(text):
        raise CloudEventError(name, "a '%' not followed by two hex digits")
    out = bytearray()
    i = 0
    while i < len(text):
        char = text[i]
        if char == "%":
            out.append(int(text[i + 1 : i + 3], 16))
            i += 3
            continue
        if uri and ord(char) not in _UNRESERVED:
            raise CloudEventError(name, f"{char!r} must be percent-encoded")
        out.extend(char.encode("utf-8", "replace"))
        i += 1
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CloudEventError(name, "percent-encoded bytes are not UTF-8") from exc


def _is_json(content_type: Any) -> bool:
    """``application/json``, with parameters (``; charset=utf-8``) or not."""
    if not isinstance(content_type, str):
        return False
    return content_type.split(";", 1)[0].strip().lower() == JSON_CONTENT_TYPE
