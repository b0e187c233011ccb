"""Dispatch to remote HTTP workers: a :class:`~accord.engine.ports.Transport` wrapper.

:class:`HttpDispatchTransport` wraps the engine's transport. A publish to a queue the
remote-worker configuration names (:mod:`accord.adapters.ingress.remote`) becomes an HTTP
``POST`` of the job envelope to that remote's URL, signed with its ``signing_key`` (Standard
Webhooks headers, ``webhook-id`` = ``<job id>.<unix ms>``) and carrying ``Accord-Job-Id``;
everything else (other queues, consuming, acks, dead letters) goes to the inner transport.

**Delivery and acceptance** (architecture.md §4). A ``2xx`` answer whose JSON body has a non-empty
``acceptanceId`` is the remote's acceptance: the adapter publishes the attempt's ``accepted``
outcome (``outcome@1``, id ``<job messageId>:accepted``, ``workerId`` ``<remote worker id or
host>/<acceptance id>``) through the inner transport, on the job's ``replyTo`` queue (envelope@2:
the queue of the engine owning the run's shard) or, for a job without one, on ``accord.outcomes``,
and the publish returns. Anything else (a refused address, a connection or TLS failure, a timeout, a
redirect, another status, a body over the size limit or without an acceptance id, the ``accepted``
not confirmed) raises :class:`~accord.errors.TransportError`: the job's outbox entry stays, and the
dispatcher's sweep delivers it again (same job id, so the remote answers a repeat with its first
acceptance). After acceptance the engine's deadlines own the attempt: the worker answers at ``POST
/v1/callbacks``.

**Address rules (SSRF).** Before each request the URL's host is checked against the remote's
``allow`` list (names, ``*.suffix`` wildcards, CIDRs) and resolved; *every* address it resolves
to is checked: loopback, private-range, link-local, multicast, reserved and unspecified
addresses (an IPv4-mapped IPv6 address counts as its IPv4 one) are refused unless inside an
allowed CIDR. The request then connects to the checked address itself (the host name travels as
``Host`` and as the TLS server name), so a second resolution cannot move it elsewhere. ``http://``
needs ``allow_http: true``; redirects are never followed; ``connect_timeout_ms`` bounds the
connection, ``timeout_ms`` the whole exchange, ``max_response_bytes`` the answer read.

**Cancellation.** A cancellation request for a remote queue (``accord.control.<queue>``) is
POSTed, signed, to the remote's ``cancel_url`` once, best effort: the attempt is already fenced,
so a worker that never hears of it only has its outcome refused as stale. Without a
``cancel_url`` it is dropped. Either way it is not queued on the inner transport, where nothing
would read it.

The wrapper offers no joint commit (:class:`~accord.engine.ports.JointQueue`): with remote queues
configured, the embedded queue's jobs go through the outbox like a broker's.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import re
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from accord.adapters.ingress.remote import IpNetwork, Remote, RemoteConfig
from accord.adapters.ingress.webhooks import sign_headers
from accord.engine.ports import Delivery, Transport, Withdraw
from accord.engine.runtime.intake import OUTCOMES_QUEUE
from accord.engine.runtime.outbox import CONTROL_QUEUE
from accord.engine.runtime.wire import encode_outcome, outcome_id
from accord.errors import TransportError

__all__ = [
    "AddressRefused",
    "HttpDispatchTransport",
    "Resolver",
    "Target",
    "check_target",
    "refused_address",
]

log = logging.getLogger("accord.adapters.transports.http")

Resolver = Callable[[str, int], Awaitable[Sequence[str]]]  # host, port -> addresses
JOB_ID_HEADER = "accord-job-id"
_CONTROL_PREFIX = f"{CONTROL_QUEUE}."
_ACCEPTANCE = re.compile(r"^[\x21-\x7e]{1,256}$")
_IDENTITY = ("messageId", "runId", "stage", "attempt", "fence")  # what the accepted echoes


class AddressRefused(TransportError):
    """The remote's URL or an address it resolves to is not allowed."""

    code = "address-refused"

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


@dataclass(frozen=True, slots=True)
class Target:
    """Where a request goes: the checked address and what the URL named."""

    scheme: str
    host: str  # as the URL names it (the Host header, the TLS server name)
    address: str  # the checked address connected to
    port: int
    path: str  # path and query

    @property
    def url(self) -> str:
        ip = ipaddress.ip_address(self.address)
        netloc = f"[{ip}]:{self.port}" if ip.version == 6 else f"{ip}:{self.port}"
        return urlunsplit((self.scheme, netloc, self.path or "/", "", ""))

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        name = f"[{self.host}]" if ":" in self.host else self.host
        return name if self.port == default else f"{name}:{self.port}"


def refused_address(address: str, networks: Sequence[IpNetwork]) -> str | None:
    """Why ``address`` may not be connected to, or ``None`` when it may."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if any(ip in net for net in networks):
        return None
    for name, flag in (
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("unspecified", ip.is_unspecified),
        ("multicast", ip.is_multicast),
        ("private-range", ip.is_private),
        ("reserved", ip.is_reserved),
    ):
        if flag:
            return f"{ip} is a {name} address and no allowed network holds it"
    if not ip.is_global:
        return f"{ip} is not a public address and no allowed network holds it"
    return None


def _host_allowed(host: str, remote: Remote) -> bool:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        if host in remote.allow_hosts:
            return True
        return any(
            pattern.startswith("*.") and host.endswith(pattern[1:])
            for pattern in remote.allow_hosts
        )
    return any(ip in net for net in remote.allow_networks)  # a literal: an allowed network's


async def system_resolver(host: str, port: int) -> Sequence[str]:
    """Every address ``host`` resolves to (TCP)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def check_target(url: str, remote: Remote, resolver: Resolver = system_resolver) -> Target:
    """The checked :class:`Target` for ``url``; raises :class:`AddressRefused`."""
    parts = urlsplit(url)
    scheme, host = parts.scheme, (parts.hostname or "").lower()
    if scheme not in ("https", "http"):
        raise AddressRefused(f"{url}: only https:// (or allowed http://) URLs are used")
    if scheme == "http" and not remote.allow_http:
        raise AddressRefused(f"{url}: http:// is refused unless the remote sets allow_http")
    if not host or not _host_allowed(host, remote):
        raise AddressRefused(f"{url}: host {host!r} is not on remote {remote.queue!r}'s allowlist")
    port = parts.port or (443 if scheme == "https" else 80)
    try:
        addresses = [str(ipaddress.ip_address(host))]
    except ValueError:
        try:
            addresses = list(await resolver(host, port))
        except OSError as exc:
            raise TransportError(f"{url}: cannot resolve {host!r}: {exc}", retryable=True) from None
    if not addresses:
        raise TransportError(f"{url}: {host!r} resolves to no address", retryable=True)
    for address in addresses:
        why = refused_address(address, remote.allow_networks)
        if why is not None:
            raise AddressRefused(f"{url}: {host!r} resolves to {why}")
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    return Target(scheme, host, addresses[0], port, path)


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    body: bytes


class HttpDispatchTransport:
    """The inner transport, with the configured remote queues delivered over HTTP."""

    def __init__(
        self,
        inner: Transport,
        config: RemoteConfig,
        *,
        resolver: Resolver = system_resolver,
        outcome_queue: str = OUTCOMES_QUEUE,
        owns_inner: bool = True,
    ) -> None:
        self.inner, self.config = inner, config
        self._resolver, self._outcomes, self._owns = resolver, outcome_queue, owns_inner
        self._clients: dict[str, httpx.AsyncClient] = {}
        self.delivered = 0  # jobs accepted by a remote
        self.refused = 0  # deliveries that raised
        self.cancels_sent = 0
        self.cancels_dropped = 0

    # -- the Transport port --------------------------------------------------------------------

    async def publish(self, queue: str, message_id: str, body: bytes, delay_ms: int = 0) -> None:
        remote = self.config.remotes.get(queue)
        if remote is not None:
            try:
                await self._deliver(remote, message_id, body)
            except BaseException:
                self.refused += 1
                raise
            self.delivered += 1
            return
        if queue.startswith(_CONTROL_PREFIX):
            remote = self.config.remotes.get(queue[len(_CONTROL_PREFIX) :])
            if remote is not None:
                await self._cancel(remote, message_id, body)
                return
        await self.inner.publish(queue, message_id, body, delay_ms)

    def consume(self, queue: str, prefetch: int = 1) -> AsyncIterator[Delivery]:
        return self.inner.consume(queue, prefetch)

    async def ack(self, delivery: Delivery) -> None:
        await self.inner.ack(delivery)

    async def nack(self, delivery: Delivery, delay_ms: int = 0) -> None:
        await self.inner.nack(delivery, delay_ms)

    async def dead_letters(self, queue: str) -> list[Delivery]:
        return await self.inner.dead_letters(queue)

    async def withdraw(self, queue: str, message_id: str) -> bool:
        """The inner transport's withdrawal; a remote queue holds nothing to take back."""
        if queue in self.config.remotes or not isinstance(self.inner, Withdraw):
            return False
        return await self.inner.withdraw(queue, message_id)

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()
        if self._owns:
            await self.inner.close()

    # -- HTTP ----------------------------------------------------------------------------------

    def _client(self, remote: Remote) -> httpx.AsyncClient:
        client = self._clients.get(remote.queue)
        if client is None:
            verify: ssl.SSLContext | bool = True
            if remote.ca_file is not None:
                verify = ssl.create_default_context(cafile=str(remote.ca_file))
            client = httpx.AsyncClient(
                verify=verify,
                follow_redirects=False,
                trust_env=False,  # no proxy from the environment: the checked address is it
                timeout=httpx.Timeout(
                    remote.timeout_ms / 1000, connect=remote.connect_timeout_ms / 1000
                ),
            )
            self._clients[remote.queue] = client
        return client

    async def _post(
        self, remote: Remote, url: str, body: bytes, headers: dict[str, str]
    ) -> _Answer:
        """POST ``body`` to the checked address of ``url``; the status and (bounded) body."""
        target = await check_target(url, remote, self._resolver)
        client = self._client(remote)
        request = client.build_request(
            "POST",
            target.url,
            content=body,
            headers={**headers, "host": target.host_header, "content-type": "application/json"},
            extensions={"sni_hostname": target.host} if target.scheme == "https" else {},
        )
        limit = remote.max_response_bytes
        try:
            async with asyncio.timeout(remote.timeout_ms / 1000):
                response = await client.send(request, stream=True, follow_redirects=False)
                try:
                    chunks, size = [], 0
                    async for chunk in response.aiter_raw():
                        size += len(chunk)
                        if size > limit:
                            raise TransportError(
                                f"{url}: the answer is over {limit} bytes", retryable=True
                            )
                        chunks.append(chunk)
                finally:
                    await response.aclose()
        except TimeoutError:
            raise TransportError(
                f"{url}: no complete answer within {remote.timeout_ms} ms", retryable=True
            ) from None
        except httpx.HTTPError as exc:
            raise TransportError(f"{url}: {type(exc).__name__}: {exc}", retryable=True) from None
        return _Answer(response.status_code, b"".join(chunks))

    def _signed(self, remote: Remote, webhook_id: str, body: bytes) -> dict[str, str]:
        key = remote.signing_key
        return sign_headers(key, remote.secrets[key], webhook_id, body)

    async def _deliver(self, remote: Remote, job_id: str, body: bytes) -> None:
        try:
            envelope = json.loads(body)
        except ValueError:
            envelope = None
        if not isinstance(envelope, dict) or any(k not in envelope for k in _IDENTITY):
            raise TransportError(
                f"job {job_id} for remote {remote.queue!r} is no job envelope", retryable=False
            )
        webhook_id = f"{job_id}.{int(time.time() * 1000)}"
        headers = {**self._signed(remote, webhook_id, body), JOB_ID_HEADER: job_id}
        answer = await self._post(remote, remote.url, body, headers)
        if 300 <= answer.status < 400:
            raise TransportError(
                f"{remote.url}: answered {answer.status}; redirects are not followed",
                retryable=True,
            )
        if not 200 <= answer.status < 300:
            raise TransportError(f"{remote.url}: answered {answer.status}", retryable=True)
        acceptance, worker = _acceptance(answer.body)
        if acceptance is None:
            raise TransportError(
                f"{remote.url}: a {answer.status} answer without an acceptanceId is no acceptance",
                retryable=True,
            )
        await self._accepted(envelope, f"{worker or _host(remote.url)}/{acceptance}")

    async def _accepted(self, envelope: dict[str, Any], worker_id: str) -> None:
        job_message_id = str(envelope["messageId"])
        message_id = outcome_id(job_message_id, "accepted")
        outcome = encode_outcome(
            message_id,
            "accepted",
            run_id=str(envelope["runId"]),
            stage=str(envelope["stage"]),
            attempt=int(envelope["attempt"]),
            fence=str(envelope["fence"]),
            tenant=str(envelope.get("tenant", "")),
            worker_id=worker_id[:512],
            causation_id=job_message_id,
        )
        # the engine built this envelope itself: its replyTo is the queue of the run's owner
        reply_to = envelope.get("replyTo")
        queue = reply_to if isinstance(reply_to, str) and reply_to else self._outcomes
        await self.inner.publish(queue, message_id, outcome)

    async def _cancel(self, remote: Remote, message_id: str, body: bytes) -> None:
        if remote.cancel_url is None:
            self.cancels_dropped += 1
            return
        webhook_id = f"{message_id}.{int(time.time() * 1000)}"
        try:
            answer = await self._post(
                remote, remote.cancel_url, body, self._signed(remote, webhook_id, body)
            )
        except TransportError as exc:
            self.cancels_dropped += 1
            log.warning("cancellation %s not delivered to %s: %s", message_id, remote.queue, exc)
            return
        if 200 <= answer.status < 300:
            self.cancels_sent += 1
        else:
            self.cancels_dropped += 1
            log.warning(
                "cancellation %s refused by %s: %s", message_id, remote.queue, answer.status
            )


def _host(url: str) -> str:
    return urlsplit(url).hostname or "remote"


def _acceptance(body: bytes) -> tuple[str | None, str | None]:
    """``(acceptanceId, workerId)`` of an answer, each ``None`` when absent or unusable."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None, None
    if not isinstance(doc, dict):
        return None, None
    acceptance, worker = doc.get("acceptanceId"), doc.get("workerId")
    ok = isinstance(acceptance, str) and _ACCEPTANCE.match(acceptance)
    worker_ok = isinstance(worker, str) and _ACCEPTANCE.match(worker)
    return (acceptance if ok else None), (worker if worker_ok else None)
