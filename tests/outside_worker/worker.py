"""A `metadata.extract@2` worker written from `docs/protocol.md` and the published artefacts alone.

It imports nothing from Accord: the contracts are read from `schemas/published/`, the format
patterns from the TypeScript binding's generated table, and everything else follows the protocol
document (queue names, ids, the acceptance handshake, heartbeats, cancellation, inputs).

    python worker.py --transport bullmq://127.0.0.1:6379/15?prefix=bull \
        --storage local=/srv/models --state /var/lib/worker/acceptance.sqlite

The transport URL chooses BullMQ (`bullmq://`) or RabbitMQ (`amqp://`). The process prints one
JSON object per line on stdout for each thing it does (`ready`, `measured`, `redelivery`, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import collections
import contextlib
import json
import math
import os
import re
import signal
import sqlite3
import sys
import threading
import time
import unicodedata
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

import jsonschema  # type: ignore[import-untyped]

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parent.parent
SCHEMAS = REPOSITORY / "schemas" / "published"
FORMATS = REPOSITORY / "schemas" / "published" / "formats.json"

CAPABILITY = ("metadata.extract", 2)
OUTCOMES_QUEUE = "accord.outcomes"
# protocol §3: envelope@2's replyTo, the queue every outcome of the job goes to (a value that breaks
# the contract's pattern is refused as invalid-envelope and answered on the shared queue)
REPLY_TO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")
MAX_BODY_BYTES = 1_048_576
QUARANTINE_BODY_CHARS = 4096
CANCELLED_REMEMBERED = 65_536
SEALED_PREFIX = "accord:sealed:v1:"
MODEL_SUFFIXES = ("stl", "obj", "ply", "off", "glb", "gltf", "3mf")
TENANT = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
KEY_SEGMENT = re.compile(r"^[A-Za-z0-9._~+=@-]+$")

Settle = Literal["ack", "poison", "retry"]
JsonObject = dict[str, Any]


def emit(event: str, **fields: Any) -> None:
    """One JSON line on stdout: what the worker did."""
    print(json.dumps({"event": event, **fields}, sort_keys=True), flush=True)


def canonical(value: Any) -> bytes:
    """Canonical JSON (protocol §1): sorted keys, no whitespace, no NaN, non-ASCII as itself."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def now_rfc3339() -> str:
    """RFC 3339 UTC with milliseconds (protocol §4)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --------------------------------------------------------------------------- contracts


def _format_patterns() -> dict[str, re.Pattern[str]]:
    """The published format table (schemas/published/formats.json)."""
    table: dict[str, str] = json.loads(FORMATS.read_text(encoding="utf-8"))["formats"]
    return {name: re.compile(pattern) for name, pattern in table.items()}


class Contracts:
    """The published contracts: JSON Schema 2020-12 validators with Accord's formats."""

    def __init__(self, root: Path = SCHEMAS) -> None:
        self.root = root
        checker = jsonschema.FormatChecker(formats=())
        for name, pattern in _format_patterns().items():
            checker.checks(name)(
                lambda value, p=pattern: not isinstance(value, str) or bool(p.search(value))
            )
        self.checker = checker
        self._documents: dict[tuple[str, int], JsonObject] = {}
        self._validators: dict[tuple[str, int], jsonschema.Draft202012Validator] = {}

    def document(self, name: str, version: int) -> JsonObject:
        key = (name, version)
        if key not in self._documents:
            path = self.root / name / f"{version}.json"
            self._documents[key] = json.loads(path.read_text(encoding="utf-8"))
        return self._documents[key]

    def schema(self, name: str, version: int) -> JsonObject:
        schema: JsonObject = self.document(name, version)["jsonSchema"]
        return schema

    def violations(self, name: str, version: int, value: Any) -> list[str]:
        """Every violation as `path: message`, sorted; [] when valid."""
        key = (name, version)
        if key not in self._validators:
            self._validators[key] = jsonschema.Draft202012Validator(
                self.schema(name, version), format_checker=self.checker
            )
        found = {
            f"{_path(error.absolute_path) or '<root>'}: {error.message}"
            for error in self._validators[key].iter_errors(value)
        }
        return sorted(found)

    def sensitive_fields(self) -> set[str]:
        """Member names any published message contract marks sensitive (for masking)."""
        names: set[str] = set()
        index = json.loads((self.root / "index.json").read_text(encoding="utf-8"))
        for entry in index["contracts"]:
            if entry["kind"] != "message":
                continue
            schema = self.schema(entry["name"], entry["version"])
            _collect_sensitive(schema, names)
        return names


def _collect_sensitive(node: Any, into: set[str]) -> None:
    if isinstance(node, dict):
        for name, member in (node.get("properties") or {}).items():
            if isinstance(member, dict) and member.get("x-accord-sensitive") is True:
                into.add(name)
        for value in node.values():
            _collect_sensitive(value, into)
    elif isinstance(node, list):
        for item in node:
            _collect_sensitive(item, into)


def _path(parts: Any) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def apply_defaults(schema: JsonObject, value: Any) -> Any:
    """Fill a `default` only where a member is missing (protocol: defaults never replace)."""
    if not isinstance(value, dict):
        return value
    filled = dict(value)
    for name, member in (schema.get("properties") or {}).items():
        if not isinstance(member, dict):
            continue
        if name not in filled and "default" in member:
            filled[name] = member["default"]
        elif name in filled:
            filled[name] = apply_defaults(member, filled[name])
    return filled


# --------------------------------------------------------------------------- ids and records


def bullmq_job_id(message_id: str) -> str:
    """protocol §2: `m-` + the message id, `%` → `%25` first, then `:` → `%3A`."""
    return "m-" + message_id.replace("%", "%25").replace(":", "%3A")


def bullmq_message_id(job_id: str) -> str:
    return job_id[2:].replace("%3A", ":").replace("%25", "%")


@dataclass(frozen=True)
class Attempt:
    """The identity of a job: what every outcome echoes."""

    message_id: str
    run_id: str
    stage: str
    attempt: int
    fence: str
    tenant: str
    result_version: int
    reply_to: str = OUTCOMES_QUEUE  # where its outcomes go: replyTo, else the shared queue

    @property
    def key(self) -> str:
        return json.dumps([self.run_id, self.stage, self.attempt, self.fence])


def identity_of(envelope: Any) -> Attempt | str:
    """protocol §3 step 2: without these no outcome could name the attempt (poison)."""
    if not isinstance(envelope, dict):
        return "the job is not a JSON object"
    for name in ("runId", "stage", "fence"):
        if not isinstance(envelope.get(name), str) or not envelope[name]:
            return f"field {name!r} must be a non-empty string"
    attempt = envelope.get("attempt")
    if not isinstance(attempt, int) or isinstance(attempt, bool):
        return "field 'attempt' must be an integer"
    message_id = envelope.get("messageId")
    if not isinstance(message_id, str) or not message_id:
        return "field 'messageId' must be a non-empty string"
    tenant = envelope.get("tenant")
    version = envelope.get("resultSchemaVersion")
    reply_to = envelope.get("replyTo")
    return Attempt(
        message_id=message_id,
        run_id=envelope["runId"],
        stage=envelope["stage"],
        attempt=attempt,
        fence=envelope["fence"],
        tenant=tenant if isinstance(tenant, str) else "",
        result_version=version if isinstance(version, int) and version >= 1 else 1,
        reply_to=reply_to
        if isinstance(reply_to, str) and REPLY_TO.fullmatch(reply_to)
        else OUTCOMES_QUEUE,
    )


class AcceptanceRecords:
    """protocol §5: one durable record per (runId, stage, attempt, fence), kept a day."""

    KEEP_S = 86_400.0

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS acceptance (key TEXT PRIMARY KEY, accepted TEXT NOT NULL,"
            " final TEXT, at REAL NOT NULL)"
        )
        self.db.execute("DELETE FROM acceptance WHERE at < ?", (time.time() - self.KEEP_S,))
        self.lock = threading.Lock()

    def claim(self, key: str, accepted: bytes) -> bool:
        with self.lock:
            cursor = self.db.execute(
                "INSERT OR IGNORE INTO acceptance (key, accepted, at) VALUES (?, ?, ?)",
                (key, accepted.decode("utf-8"), time.time()),
            )
            return cursor.rowcount == 1

    def get(self, key: str) -> tuple[bytes, bytes | None] | None:
        with self.lock:
            row = self.db.execute(
                "SELECT accepted, final FROM acceptance WHERE key = ?", (key,)
            ).fetchone()
        if row is None:
            return None
        return row[0].encode("utf-8"), (row[1].encode("utf-8") if row[1] is not None else None)

    def finish(self, key: str, final: bytes) -> None:
        with self.lock:
            self.db.execute(
                "UPDATE acceptance SET final = ? WHERE key = ?", (final.decode("utf-8"), key)
            )

    def release(self, key: str) -> None:
        with self.lock:
            self.db.execute("DELETE FROM acceptance WHERE key = ? AND final IS NULL", (key,))


# --------------------------------------------------------------------------- the handler


class Failure(Exception):
    """A classified failure: a `failed` outcome with this code."""

    def __init__(self, code: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable


class Cancelled(Exception):
    """The engine asked the attempt to stop (protocol §7)."""


def check_object_key(key: str) -> None:
    """protocol §9: refuse, never clean up."""
    problem = None
    if not 1 <= len(key) <= 1024:
        problem = "must be 1 to 1024 characters"
    elif key.startswith("/") or "\\" in key or "%" in key:
        problem = "must be relative, without backslash or %"
    elif any(ord(c) < 32 or ord(c) == 127 for c in key):
        problem = "must not contain control characters"
    elif unicodedata.normalize("NFKC", key) != key:
        problem = "must be unchanged by Unicode NFKC"
    else:
        for segment in key.split("/"):
            if segment in ("", ".", "..") or not KEY_SEGMENT.match(segment):
                problem = f"has an invalid segment {segment!r}"
                break
    if problem is not None:
        raise Failure("invalid-object-key", f"objectKey {problem}")


def resolve_input(storage: dict[str, Path], tenant: str, request: JsonObject) -> Path:
    """The model file the request names, under `<root>/<tenant>` (protocol §9)."""
    ref = str(request.get("storageConnectionRef", "local"))
    if not TENANT.match(tenant):
        raise Failure("invalid-object-key", "the job's tenant is not a valid tenant name")
    root = storage.get(ref)
    if root is None:
        raise Failure(
            "storage-unavailable", "the request names a storage this worker does not know"
        )
    base = (root / tenant).resolve()
    if "objectKey" in request:
        keys = [str(request["objectKey"])]
    else:
        keys = [f"models/{request['modelId']}.{suffix}" for suffix in MODEL_SUFFIXES]
    for key in keys:
        check_object_key(key)
        path: Path = (base / key).resolve()
        if not path.is_relative_to(base):
            raise Failure("invalid-object-key", "objectKey resolves outside the tenant's storage")
        if path.is_file():
            return path
    raise Failure("object-not-found", f"no object for model {request['modelId']!r}")


def measure(
    path: Path, request: JsonObject, limits: JsonObject, cancel: threading.Event
) -> JsonObject:
    """technical-metadata@1 for one model file, computed with trimesh."""
    import trimesh  # heavy; only the handler needs it

    suffix = path.suffix.lower().lstrip(".")
    if suffix not in MODEL_SUFFIXES:
        raise Failure("unsupported-format", f"models ending .{suffix} are not supported")
    size = path.stat().st_size
    if size > int(limits.get("inputBytes", 1 << 62)):
        raise Failure("input-too-large", f"the model is {size} bytes, over {limits['inputBytes']}")
    try:
        mesh: Any = trimesh.load(str(path), file_type=suffix, force="mesh", process=True)
    except Exception as error:
        raise Failure(
            "malformed-model", f"the model cannot be parsed: {type(error).__name__}"
        ) from None
    if cancel.is_set():
        raise Cancelled
    vertices = len(mesh.vertices)
    faces = len(mesh.faces)
    if vertices == 0 or faces == 0:
        raise Failure("malformed-model", "the model has no faces")
    low, high = (list(map(float, corner)) for corner in mesh.bounds)
    if not all(math.isfinite(v) for v in low + high):
        raise Failure("malformed-model", "the model has non-finite coordinates")
    watertight = bool(mesh.is_watertight)
    winding = bool(mesh.is_winding_consistent)
    volume: float | None = None
    reason: str | None = None
    if request.get("computeVolume", True) is not True:
        reason = "not-requested"
    elif not watertight:
        reason = "not-watertight"
    elif not winding:
        reason = "inconsistent-winding"
    else:
        volume = abs(float(mesh.volume))
    components = len(mesh.split(only_watertight=False))
    units = mesh.units if mesh.units in ("mm", "cm", "m", "in") else "unknown"
    axes = ("x", "y", "z")
    return {
        "modelId": request["modelId"],
        "format": suffix,
        "units": units,
        "vertexCount": vertices,
        "faceCount": faces,
        "components": components,
        "bounds": {
            "min": dict(zip(axes, low, strict=True)),
            "max": dict(zip(axes, high, strict=True)),
        },
        "extents": {a: max(0.0, h - lo) for a, lo, h in zip(axes, low, high, strict=True)},
        "surfaceArea": abs(float(mesh.area)),
        "volume": volume,
        "volumeUnavailableReason": reason,
        "watertight": watertight,
        "windingConsistent": winding,
    }


def has_sealed(value: Any) -> bool:
    if isinstance(value, str):
        return value.startswith(SEALED_PREFIX)
    if isinstance(value, dict):
        return any(has_sealed(v) for v in value.values())
    if isinstance(value, list):
        return any(has_sealed(v) for v in value)
    return False


# --------------------------------------------------------------------------- transports


class Transport(Protocol):
    async def start(self) -> None: ...

    async def publish(self, queue: str, message_id: str, body: bytes) -> None: ...

    async def consume(
        self, queue: str, on_message: Callable[[str | None, bytes | None], Awaitable[Settle]]
    ) -> None: ...

    async def close(self) -> None: ...


def _options(url: str) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_qs(urlsplit(url).query).items()}


class BullmqTransport:
    """protocol §2, BullMQ on Redis, with the Python `bullmq` package."""

    def __init__(self, url: str, concurrency: int) -> None:
        parts = urlsplit(url)
        options = _options(url)
        db = parts.path.strip("/") or "0"
        self.redis_url = f"redis://{parts.hostname or '127.0.0.1'}:{parts.port or 6379}/{db}"
        self.prefix = options.get("prefix", "bull")
        self.visibility_ms = int(options.get("visibility_ms", "30000"))
        self.max_deliveries = int(options.get("max_deliveries", "5"))
        self.dedup_ms = int(options.get("dedup_ms", "600000"))
        self.stalled_ms = int(options.get("stalled_ms", "30000"))
        self.concurrency = concurrency
        self.queues: dict[str, Any] = {}
        self.workers: list[Any] = []

    async def start(self) -> None:
        return None

    def _queue(self, name: str) -> Any:
        from bullmq import Queue  # type: ignore[import-untyped]

        if name not in self.queues:
            self.queues[name] = Queue(name, {"connection": self.redis_url, "prefix": self.prefix})
        return self.queues[name]

    async def publish(self, queue: str, message_id: str, body: bytes) -> None:
        try:
            data: JsonObject = {"message_id": message_id, "body": body.decode("utf-8")}
        except UnicodeDecodeError:
            data = {"message_id": message_id, "body_b64": base64.b64encode(body).decode("ascii")}
        await self._queue(queue).add(
            "accord",
            data,
            {
                "jobId": bullmq_job_id(message_id),
                "attempts": self.max_deliveries,
                "backoff": {"type": "accord-nack"},
                "removeOnComplete": {"age": math.ceil(self.dedup_ms / 1000), "count": 1000},
                "removeOnFail": {"age": 3600, "count": 1000},
            },
        )

    async def consume(
        self, queue: str, on_message: Callable[[str | None, bytes | None], Awaitable[Settle]]
    ) -> None:
        from bullmq import UnrecoverableError, Worker

        async def process(job: Any, token: str) -> None:
            message_id, body = _read_job(job)
            settle = await on_message(message_id, body)
            if settle == "poison":
                raise UnrecoverableError("accord: poison job, quarantined")
            if settle == "retry":
                raise RuntimeError("accord: returned to the queue")

        worker = Worker(
            queue,
            process,
            {
                "connection": self.redis_url,
                "prefix": self.prefix,
                "concurrency": self.concurrency,
                "lockDuration": self.visibility_ms,
                "stalledInterval": self.stalled_ms,
                "maxStalledCount": self.max_deliveries,
                "settings": {"backoffStrategy": lambda *_: 1000},
            },
        )
        self.workers.append(worker)

    async def close(self) -> None:
        for worker in self.workers:
            await worker.close()
        for queue in self.queues.values():
            await queue.close()


def _read_job(job: Any) -> tuple[str | None, bytes | None]:
    data = job.data
    message_id = bullmq_message_id(str(job.id)) if str(job.id).startswith("m-") else None
    if not isinstance(data, dict):
        return message_id, None
    if isinstance(data.get("message_id"), str):
        message_id = data["message_id"]
    if isinstance(data.get("body_b64"), str):
        try:
            return message_id, base64.b64decode(data["body_b64"], validate=True)
        except (binascii.Error, ValueError):
            return message_id, None
    if isinstance(data.get("body"), str):
        return message_id, data["body"].encode("utf-8")
    return message_id, None


class RabbitmqTransport:
    """protocol §2, RabbitMQ, with `aio_pika`: quorum queues, confirms, manual acks."""

    def __init__(self, url: str, concurrency: int) -> None:
        options = _options(url)
        parts = urlsplit(url)
        self.url = parts._replace(query="").geturl()
        if parts.path in ("", "/"):
            self.url = parts._replace(query="", path="/").geturl()
        self.vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
        self.prefix = options.get("prefix", "")
        self.max_deliveries = int(options.get("max_deliveries", "5"))
        self.confirm_s = int(options.get("confirm_ms", "5000")) / 1000
        self.concurrency = concurrency
        self.connection: Any = None
        self.channel: Any = None
        self.declared: set[str] = set()

    async def start(self) -> None:
        import aio_pika

        self.connection = await aio_pika.connect(self.url)
        self.channel = await self.connection.channel(publisher_confirms=True, on_return_raises=True)
        await self.channel.set_qos(prefetch_count=self.concurrency)

    async def declare(self, queue: str) -> str:
        import aio_pika

        name = self.prefix + queue
        if name in self.declared:
            return name
        dead = await self.channel.declare_exchange(
            "accord.dead", aio_pika.ExchangeType.DIRECT, durable=True
        )
        arguments = {
            "x-queue-type": "quorum",
            "x-delivery-limit": self.max_deliveries - 1,
            "x-dead-letter-exchange": "accord.dead",
            "x-dead-letter-routing-key": name,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        }
        await self.channel.declare_queue(name, durable=True, arguments=arguments)
        letters = await self.channel.declare_queue(
            name + ".dead", durable=True, arguments={"x-queue-type": "quorum"}
        )
        await letters.bind(dead, routing_key=name)
        self.declared.add(name)
        return name

    async def publish(self, queue: str, message_id: str, body: bytes) -> None:
        import aio_pika

        name = await self.declare(queue)
        message = aio_pika.Message(
            body, message_id=message_id, delivery_mode=aio_pika.DeliveryMode.PERSISTENT
        )
        await asyncio.wait_for(
            self.channel.default_exchange.publish(message, routing_key=name, mandatory=True),
            timeout=self.confirm_s,
        )

    async def consume(
        self, queue: str, on_message: Callable[[str | None, bytes | None], Awaitable[Settle]]
    ) -> None:
        name = await self.declare(queue)
        broker_queue = await self.channel.get_queue(name)

        async def deliver(message: Any) -> None:
            if not message.message_id:
                await message.reject(requeue=False)  # protocol §2: dead-lettered at once
                return
            try:
                settle = await on_message(message.message_id, bytes(message.body))
            except Exception:
                settle = "retry"
            if settle == "retry":
                await message.nack(requeue=True)
            else:
                await message.ack()

        await broker_queue.consume(deliver, no_ack=False)

    async def close(self) -> None:
        if self.connection is not None:
            await self.connection.close()


def transport_for(url: str, concurrency: int) -> Transport:
    scheme = urlsplit(url).scheme
    if scheme == "bullmq":
        return BullmqTransport(url, concurrency)
    if scheme in ("amqp", "amqps"):
        return RabbitmqTransport(url, concurrency)
    raise SystemExit(f"worker: --transport must be bullmq:// or amqp://, not {scheme or url!r}")


# --------------------------------------------------------------------------- the worker


@dataclass
class Running:
    attempt: Attempt
    cancel: threading.Event = field(default_factory=threading.Event)


class OutsideWorker:
    def __init__(
        self,
        transport: Transport,
        contracts: Contracts,
        records: AcceptanceRecords,
        storage: dict[str, Path],
        *,
        queue: str,
        worker_id: str,
        heartbeat_ms: int,
        exit_after_record: bool = False,
        stall_first_attempt_s: float = 0.0,
    ) -> None:
        self.transport = transport
        self.contracts = contracts
        self.records = records
        self.storage = storage
        self.queue = queue
        self.worker_id = worker_id
        self.heartbeat_s = heartbeat_ms / 1000
        self.exit_after_record = exit_after_record
        self.stall_first_attempt_s = stall_first_attempt_s
        capability = contracts.document(*CAPABILITY)["contract"]
        self.request_name, request_version = capability["request"].split("@")
        self.request_version = int(request_version)
        self.result_name, result_version = capability["result"].split("@")
        self.result_version = int(result_version)
        self.limits: JsonObject = capability.get("limits", {})
        self.sensitive = contracts.sensitive_fields()
        self.cancelled: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.running: dict[str, Running] = {}

    # ---- outcomes

    def outcome(
        self, job: Attempt, kind: str, payload: JsonObject, seq: int = 0
    ) -> tuple[str, bytes]:
        """One outcome@1 answering `job`, validated with its payload contract before it leaves."""
        message_id = f"{job.message_id}:{kind}" + (f":{seq}" if seq else "")
        contract = {
            "accepted": ("stage-accepted", 1),
            "heartbeat": ("stage-heartbeat", 1),
            "progress": ("progress", 1),
            "failed": ("stage-failed", 1),
            "succeeded": (self.result_name, job.result_version),
        }[kind]
        document: JsonObject = {
            "messageId": message_id,
            "messageType": kind,
            "contractVersion": contract[1],
            "correlationId": job.run_id,
            "causationId": job.message_id,
            "producer": self.worker_id,
            "occurredAt": now_rfc3339(),
            "tenant": job.tenant,
            "runId": job.run_id,
            "stage": job.stage,
            "attempt": job.attempt,
            "fence": job.fence,
            "payload": payload,
        }
        if kind == "accepted":
            document["workerId"] = self.worker_id
        problems = self.contracts.violations("outcome", 1, document)
        problems += [f"payload.{p}" for p in self.contracts.violations(*contract, payload)]
        if problems:
            raise ValueError(f"refusing to send an invalid {kind} outcome: {'; '.join(problems)}")
        return message_id, canonical(document)

    async def send(self, job: Attempt, message: tuple[str, bytes]) -> None:
        """protocol §3/§4: every outcome of `job` goes to its replyTo queue, else the shared one."""
        await self.transport.publish(job.reply_to, message[0], message[1])

    async def quarantine(
        self, queue: str, message_id: str | None, reason: str, body: bytes | None
    ) -> None:
        """protocol §3 step 2: `{queue, message_id, reason, body}` on `<queue>.quarantine`."""
        text = "" if body is None else body.decode("utf-8", errors="replace")
        with contextlib.suppress(ValueError, RecursionError):
            text = json.dumps(self._masked(json.loads(text)), ensure_ascii=False, sort_keys=True)
        record = {
            "queue": queue,
            "message_id": message_id,
            "reason": reason,
            "body": text[:QUARANTINE_BODY_CHARS],
        }
        record_id = f"quarantine:{message_id or 'unknown'}"
        await self.transport.publish(f"{queue}.quarantine", record_id, canonical(record))
        emit("quarantined", queue=queue, message_id=message_id, reason=reason)

    def _masked(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: "***" if k in self.sensitive else self._masked(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._masked(v) for v in value]
        return value

    # ---- jobs

    async def on_job(self, message_id: str | None, body: bytes | None) -> Settle:
        if body is None:
            await self.quarantine(self.queue, message_id, "the delivery carries no body", body)
            return "poison"
        if len(body) > MAX_BODY_BYTES:
            await self.quarantine(
                self.queue, message_id, f"the job is {len(body)} bytes, over 1 MiB", body
            )
            return "poison"
        try:
            envelope = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as error:
            await self.quarantine(self.queue, message_id, f"the job is not JSON: {error}", body)
            return "poison"
        found = identity_of(envelope)
        if isinstance(found, str):
            await self.quarantine(self.queue, message_id, found, body)
            return "poison"
        job = found
        prior = self.records.get(job.key)
        if prior is not None:
            return await self.redelivered(job, prior)
        if job.fence in self.cancelled:
            emit("dropped", runId=job.run_id, stage=job.stage, attempt=job.attempt)
            return "ack"
        accepted = self.outcome(job, "accepted", {})
        if not self.records.claim(job.key, accepted[1]):
            record = self.records.get(job.key)
            assert record is not None
            return await self.redelivered(job, record)
        try:
            await self.send(job, accepted)
        except Exception as error:
            self.records.release(job.key)
            emit("accept-unconfirmed", runId=job.run_id, error=str(error))
            return "retry"
        emit("accepted", runId=job.run_id, stage=job.stage, attempt=job.attempt)
        final = await self.work(job, envelope)
        if final is None:
            emit("cancelled", runId=job.run_id, stage=job.stage, attempt=job.attempt)
            return "ack"
        self.records.finish(job.key, final[1])
        if self.exit_after_record:
            emit("exiting-after-record", runId=job.run_id)
            os._exit(17)
        try:
            await self.send(job, final)
        except Exception as error:
            emit("final-unconfirmed", runId=job.run_id, error=str(error))
            return "retry"
        return "ack"

    async def redelivered(self, job: Attempt, prior: tuple[bytes, bytes | None]) -> Settle:
        """protocol §5: a redelivery runs nothing; it re-sends what the record holds."""
        accepted, final = prior
        accepted_id = f"{job.message_id}:accepted"
        try:
            await self.send(job, (accepted_id, accepted))
            if final is not None:
                final_id = json.loads(final)["messageId"]
                await self.send(job, (final_id, final))
        except Exception:
            return "retry"
        emit(
            "redelivery",
            runId=job.run_id,
            stage=job.stage,
            attempt=job.attempt,
            resent=final is not None,
        )
        return "ack"

    async def work(self, job: Attempt, envelope: JsonObject) -> tuple[str, bytes] | None:
        running = Running(job)
        self.running[job.fence] = running
        beats = 0

        async def heartbeat() -> None:
            nonlocal beats
            while True:
                await asyncio.sleep(self.heartbeat_s)
                beats += 1
                try:
                    beat = self.outcome(job, "heartbeat", {"at": time.time()}, beats)
                    await self.send(job, beat)
                except Exception:
                    emit("heartbeat-skipped", runId=job.run_id)

        beating = asyncio.create_task(heartbeat())
        try:
            request = self.check(envelope)
            path = resolve_input(self.storage, job.tenant, request)
            if job.attempt == 1 and self.stall_first_attempt_s > 0:
                # a slow first attempt (for the tests of heartbeats and cancellation): it stops
                # as soon as the engine asks
                await asyncio.to_thread(running.cancel.wait, self.stall_first_attempt_s)
            if running.cancel.is_set():
                raise Cancelled
            result = await asyncio.to_thread(measure, path, request, self.limits, running.cancel)
            if running.cancel.is_set():
                raise Cancelled
            problems = self.contracts.violations(self.result_name, job.result_version, result)
            if problems:
                raise Failure(
                    "invalid-result", f"the result breaks {self.result_name}: {'; '.join(problems)}"
                )
            emit(
                "measured",
                runId=job.run_id,
                stage=job.stage,
                attempt=job.attempt,
                faces=result["faceCount"],
            )
            return self.outcome(job, "succeeded", result)
        except Cancelled:
            return None
        except Failure as failure:
            emit("failed", runId=job.run_id, code=failure.code, message=str(failure))
            payload = {
                "code": failure.code,
                "message": str(failure)[:2000],
                "retryable": failure.retryable,
            }
            return self.outcome(job, "failed", payload)
        except Exception as error:
            emit("crashed", runId=job.run_id, error=repr(error))
            payload = {"code": "handler-crashed", "message": repr(error)[:2000], "retryable": True}
            return self.outcome(job, "failed", payload)
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating
            self.running.pop(job.fence, None)

    def check(self, envelope: JsonObject) -> JsonObject:
        """protocol §3 step 3: envelope, then sealed values, then the request with defaults."""
        problems = self.contracts.violations("envelope", 2, envelope)
        if problems:
            raise Failure("invalid-envelope", "; ".join(problems))
        kind = (envelope["messageType"], envelope["contractVersion"])
        if kind != (self.request_name, self.request_version):
            raise Failure(
                "invalid-request",
                f"{CAPABILITY[0]} takes {self.request_name}@{self.request_version},"
                f" not {kind[0]}@{kind[1]}",
            )
        payload = envelope.get("payload")
        if has_sealed(payload):
            raise Failure(
                "unsealable-request", "the request has a sealed value and this worker holds no key"
            )
        request = apply_defaults(
            self.contracts.schema(self.request_name, self.request_version), payload
        )
        problems = self.contracts.violations(self.request_name, self.request_version, request)
        if problems:
            raise Failure("invalid-request", "; ".join(problems))
        checked: JsonObject = request
        return checked

    # ---- control

    async def on_control(self, message_id: str | None, body: bytes | None) -> Settle:
        """protocol §7: read `fence` and `stage`; stop a matching attempt; remember the fence."""
        queue = f"accord.control.{self.queue}"
        try:
            request = json.loads((body or b"").decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            request = None
        if (
            not isinstance(request, dict)
            or not isinstance(request.get("fence"), str)
            or not isinstance(request.get("stage"), str)
        ):
            await self.quarantine(
                queue, message_id, "a control message must name a fence and a stage", body
            )
            return "ack"
        fence, stage = request["fence"], request["stage"]
        self.cancelled[fence] = None
        while len(self.cancelled) > CANCELLED_REMEMBERED:
            self.cancelled.popitem(last=False)
        running = self.running.get(fence)
        if running is not None and running.attempt.stage == stage:
            running.cancel.set()
        emit("cancel-request", fence=fence, stage=stage, running=running is not None)
        return "ack"


def parse_storage(items: list[str]) -> dict[str, Path]:
    storage: dict[str, Path] = {}
    for item in items:
        name, sep, root = item.partition("=")
        if not sep or not name or not root:
            raise SystemExit(f"worker: --storage takes NAME=ROOT, not {item!r}")
        storage[name] = Path(root)
    return storage


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--transport", required=True, help="bullmq://host:port/db?... or amqp://..."
    )
    parser.add_argument(
        "--storage", action="append", default=[], help="NAME=ROOT (the ref `local` by default)"
    )
    parser.add_argument(
        "--state", required=True, type=Path, help="the acceptance record file (SQLite)"
    )
    parser.add_argument(
        "--queue", default=None, help="the queue to serve (default: the capability's)"
    )
    parser.add_argument("--worker-id", default=f"outside-worker-{os.getpid()}")
    parser.add_argument("--heartbeat-ms", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--schemas", type=Path, default=SCHEMAS)
    args = parser.parse_args(argv)
    contracts = Contracts(args.schemas)
    queue = args.queue or contracts.document(*CAPABILITY)["contract"]["queue"]
    transport = transport_for(args.transport, args.concurrency)
    worker = OutsideWorker(
        transport,
        contracts,
        AcceptanceRecords(args.state),
        parse_storage(args.storage),
        queue=queue,
        worker_id=args.worker_id,
        heartbeat_ms=args.heartbeat_ms,
        exit_after_record=os.environ.get("OUTSIDE_WORKER_EXIT_AFTER_RECORD") == "1",
        stall_first_attempt_s=float(os.environ.get("OUTSIDE_WORKER_STALL_FIRST_ATTEMPT_S", "0")),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await transport.start()
    await transport.consume(f"accord.control.{queue}", worker.on_control)
    await transport.consume(queue, worker.on_job)
    emit("ready", queue=queue, worker=args.worker_id)
    await stop.wait()
    await transport.close()
    emit("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
