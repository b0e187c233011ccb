"""``accord doctor``: check a deployment and say what to fix (docs/observability.md).

Each check ends ``ok``, ``warn`` (works, with a risk named), ``fail`` (must be fixed: the command
exits 1) or ``skip`` (not applicable, or not checkable from here), with what was seen and, unless
``ok``, what to do:

- Redis behind a ``redis://`` store or a ``bullmq://`` transport: ``maxmemory-policy noeviction``
  (an evicting Redis silently deletes run state and jobs) and persistence (AOF with
  ``appendfsync always``; RDB alone or ``everysec`` loses the last acknowledged writes);
- RabbitMQ behind an ``amqp://`` transport: every ``accord.*`` queue is a quorum queue (read
  through the management API on port 15672, ``--rabbitmq-api`` to name another);
- clocks: this host's clock against the Redis server's ``TIME`` (timers, leases and deadlines
  compare instants written by different hosts);
- announced capabilities: workers announced in the store and live; none is a warning;
- projector lag and stranded outbox entries: read from the store's telemetry readers when the
  store offers them (``projector_lag_ms``, ``stranded_outbox``), else ``skip``.

The store is opened only after the Redis checks, and a store that refuses to open (as the Redis
store refuses an evicting server) is one failed check, not a traceback.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from typing import Annotated, Any
from urllib.parse import quote, urlsplit

import typer
from rich.markup import escape

from accord.cli._common import EXIT_OK, EXIT_REFUSED, console, emit_json
from accord.cli._connect import masked

__all__ = ["Check", "diagnose", "doctor"]

SKEW_WARN_MS, SKEW_FAIL_MS = 250, 1_000
CHECK_S = 5.0


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: str  # ok | warn | fail | skip
    detail: str
    fix: str = ""


def _redis_endpoints(*urls: str) -> list[str]:
    """Distinct ``redis://host:port/db`` of the Redis-backed URLs among ``urls``."""
    seen: list[str] = []
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme in ("redis", "rediss", "bullmq"):
            scheme = "rediss" if parts.scheme == "rediss" else "redis"
            auth = f"{parts.username or ''}:{parts.password}@" if parts.password else ""
            found = f"{scheme}://{auth}{parts.hostname or '127.0.0.1'}:{parts.port or 6379}"
            if found not in seen:
                seen.append(found)
    return seen


async def _redis_checks(url: str) -> list[Check]:
    import redis.asyncio as aioredis  # noqa: PLC0415 - only for Redis deployments

    where = masked(url)
    client = aioredis.from_url(url, decode_responses=True, socket_timeout=CHECK_S)
    try:
        try:
            memory = await client.info("memory")
            persistence = await client.info("persistence")
            before = time.time()
            seconds, micros = await client.time()
            after = time.time()
        except Exception as exc:
            return [Check(f"redis {where}", "fail", f"not reachable: {exc}",
                          "start Redis or correct the URL")]  # fmt: skip
        out = []
        policy = str(memory.get("maxmemory_policy", "unknown"))
        if policy == "noeviction":
            out.append(Check(f"redis {where} eviction", "ok", "maxmemory-policy noeviction"))
        else:
            out.append(Check(
                f"redis {where} eviction", "fail",
                f"maxmemory-policy is {policy}: Redis may delete run state, history and jobs",
                "CONFIG SET maxmemory-policy noeviction, and set it in redis.conf",
            ))  # fmt: skip
        aof = int(persistence.get("aof_enabled", 0))
        fsync = await _config(client, "appendfsync")
        save = await _config(client, "save")
        if aof and fsync == "always":
            out.append(Check(f"redis {where} persistence", "ok", "AOF, appendfsync always"))
        elif aof:
            out.append(Check(
                f"redis {where} persistence", "warn",
                f"AOF with appendfsync {fsync}: about 1 s of acknowledged commits can be lost",
                "CONFIG SET appendfsync always (and in redis.conf)",
            ))  # fmt: skip
        elif save:
            out.append(Check(
                f"redis {where} persistence", "warn",
                f"RDB snapshots only (save {save!r}): a crash loses commits since the last one",
                "CONFIG SET appendonly yes; CONFIG SET appendfsync always (and in redis.conf)",
            ))  # fmt: skip
        else:
            out.append(Check(
                f"redis {where} persistence", "fail",
                "no persistence (no AOF, no RDB): a restart loses every run",
                "CONFIG SET appendonly yes; CONFIG SET appendfsync always (and in redis.conf)",
            ))  # fmt: skip
        server_ms = int(seconds) * 1000 + int(micros) // 1000
        skew = abs(server_ms - int((before + after) * 500))
        rtt = int((after - before) * 1000)
        status = "ok" if skew < SKEW_WARN_MS else "warn" if skew < SKEW_FAIL_MS else "fail"
        out.append(Check(
            f"clock against redis {where}", status,
            f"skew {skew} ms (round trip {rtt} ms)",
            "" if status == "ok" else "synchronise both hosts' clocks (NTP / chrony)",
        ))  # fmt: skip
        return out
    finally:
        await client.aclose()


async def _config(client: Any, name: str) -> str:
    try:
        return str((await client.config_get(name)).get(name, ""))
    except Exception:  # CONFIG may be denied by ACLs or renamed by a provider
        return "unknown"


def _rabbit_checks(url: str, api: str | None) -> list[Check]:
    parts = urlsplit(url)
    base = api or f"http://{parts.hostname or '127.0.0.1'}:15672"
    vhost = quote(parts.path.lstrip("/") or "/", safe="")
    user, password = parts.username or "guest", parts.password or "guest"
    request = urllib.request.Request(f"{base}/api/queues/{vhost}")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=CHECK_S) as got:
            queues = json.loads(got.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return [Check(
            "rabbitmq quorum queues", "warn", f"management API at {base} not readable: {exc}",
            "enable rabbitmq_management (or pass --rabbitmq-api), or check by hand: "
            "rabbitmqctl list_queues name type",
        )]  # fmt: skip
    ours = [q for q in queues if str(q.get("name", "")).startswith("accord")]
    classic = sorted(str(q["name"]) for q in ours if q.get("type") != "quorum")
    if not ours:
        return [Check("rabbitmq quorum queues", "skip", "no accord queues declared yet")]
    if classic:
        return [Check(
            "rabbitmq quorum queues", "fail",
            f"{len(classic)} of {len(ours)} accord queues are not quorum queues: "
            + ", ".join(classic[:10]),
            "delete them while empty and let Accord declare them again (x-queue-type quorum)",
        )]  # fmt: skip
    return [Check("rabbitmq quorum queues", "ok", f"{len(ours)} accord queues, all quorum")]


async def _store_checks(store_url: str) -> list[Check]:
    from accord.adapters import open_store  # noqa: PLC0415

    store = None
    try:
        store = open_store(store_url)
        live = await asyncio.wait_for(store.live_capabilities(int(time.time() * 1000)), CHECK_S)
    except Exception as exc:
        if store is not None:
            with contextlib.suppress(Exception):
                await store.close()
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        return [Check("store", "fail", f"{masked(store_url)} refused to open: {first}",
                      "fix what the message names, then run accord doctor again")]  # fmt: skip
    out = [Check("store", "ok", f"{masked(store_url)} reachable")]
    try:
        if live:
            shown = ", ".join(f"{c} ({len(w)})" for c, w in sorted(live.items()))
            out.append(Check("announced capabilities", "ok", shown))
        else:
            out.append(Check(
                "announced capabilities", "warn", "no worker has announced itself",
                "start the workers (accord worker run …) against this store",
            ))  # fmt: skip
        for name, reader, limit, fix in (
            ("projector lag", "projector_lag_ms", 60_000,
             "look at the projector (accord telemetry …); re-drive its failures"),
            ("stranded outbox", "stranded_outbox", 0,
             "start an engine: its reconciler republishes stranded entries"),
        ):  # fmt: skip
            read = getattr(store, reader, None)
            if not callable(read):
                out.append(Check(name, "skip", "this store does not report it"))
                continue
            value = int(await read())
            status = "ok" if value <= limit else "warn"
            out.append(Check(name, status, str(value), "" if status == "ok" else fix))
    finally:
        await store.close()
    return out


async def diagnose(store: str, transport: str | None, rabbitmq_api: str | None) -> list[Check]:
    """Every check of the module docstring for a store URL and a transport URL."""
    checks: list[Check] = []
    for endpoint in _redis_endpoints(store, transport or ""):
        checks.extend(await _redis_checks(endpoint))
    if transport and urlsplit(transport).scheme in ("amqp", "amqps"):
        checks.extend(await asyncio.to_thread(_rabbit_checks, transport, rabbitmq_api))
    if not any(c.name.startswith("clock") for c in checks):
        checks.append(Check("clock", "skip", "no server clock to compare with (Redis only)"))
    checks.extend(await _store_checks(store))
    return checks


_STYLE = {"ok": "green", "warn": "yellow", "fail": "red", "skip": "dim"}


def doctor(
    store: Annotated[str, typer.Option("--store", help="Store URL of the deployment.")],
    transport: Annotated[str | None, typer.Option("--transport", help="Transport URL.")] = None,
    rabbitmq_api: Annotated[
        str | None, typer.Option("--rabbitmq-api", help="RabbitMQ management API base URL.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON document.")] = False,
) -> None:
    """Check a deployment (Redis, RabbitMQ, clocks, workers, telemetry) and say what to fix."""
    checks = asyncio.run(diagnose(store, transport, rabbitmq_api))
    failed = [c for c in checks if c.status == "fail"]
    if json_out:
        emit_json({"ok": not failed, "checks": [asdict(c) for c in checks]})
    else:
        for c in checks:
            style = _STYLE[c.status]
            console.print(f"[{style}]{c.status:4}[/{style}] {escape(c.name)}: {escape(c.detail)}",
                          markup=True, highlight=False, soft_wrap=True)  # fmt: skip
            if c.fix:
                console.print(f"     fix: {escape(c.fix)}", highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_REFUSED if failed else EXIT_OK)
