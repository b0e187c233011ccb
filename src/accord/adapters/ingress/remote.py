"""The remote-worker configuration: which queues are served over HTTP, where, and with what keys.

One YAML (or JSON) file, read by :func:`load_remote_config` / :func:`parse_remote_config`::

    callbacks:
      tolerance_s: 300          # webhook-timestamp tolerance, 1..300 s
      max_body_bytes: 1048576   # largest callback body accepted
    remotes:
      metadata:                 # the queue (a stage's queue, else its capability's)
        capability: metadata.extract@2      # optional: the capability the queue serves
        url: https://meta.internal.example/v1/jobs
        cancel_url: https://meta.internal.example/v1/cancel   # optional
        allow: [meta.internal.example, 10.20.0.0/16]
        allow_http: false       # http:// only when true
        ca_file: certs/remote-ca.pem        # relative to this file
        connect_timeout_ms: 2000
        timeout_ms: 10000
        max_response_bytes: 65536
        signing_key: k2         # signs the jobs sent to the worker
        secrets:                # verify its callbacks: every key listed is active
          k1: env:METADATA_SECRET_OLD
          k2: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw

A secret is a Standard Webhooks secret (``whsec_`` + base64 of 24 to 64 bytes) or ``env:NAME``,
read from the environment when the file is loaded. Key ids are unique across the file: a
callback's ``Accord-Key-Id`` names the key, and so the remote it comes from. Every problem is a
:class:`RemoteConfigError` whose diagnostics name ``file:line:column`` and the field path.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from accord.contracts.yamlsource import Node, Reader, compose, holds, location_of
from accord.errors import AccordError, Diagnostic, Location

__all__ = [
    "CallbackSettings",
    "IpNetwork",
    "Remote",
    "RemoteConfig",
    "RemoteConfigError",
    "load_remote_config",
    "parse_remote_config",
    "secret_bytes",
]

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_TOLERANCE_S = 300  # standardwebhooks also holds a fixed five-minute window
_KEY_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_QUEUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_HOST = re.compile(r"^(\*\.)?[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")
_SECRET_PREFIX = "whsec_"


class RemoteConfigError(AccordError):
    """The remote-worker configuration is refused; ``diagnostics`` names every problem."""

    code = "remote-config"

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        self.diagnostics = tuple(diagnostics)
        super().__init__("\n".join(str(d) for d in self.diagnostics))


@dataclass(frozen=True, slots=True)
class CallbackSettings:
    tolerance_s: int = MAX_TOLERANCE_S
    max_body_bytes: int = 1_048_576


@dataclass(frozen=True, slots=True)
class Remote:
    """One queue served by a remote HTTP worker."""

    queue: str
    url: str
    secrets: Mapping[str, str]  # key id -> whsec_ secret, every one accepted on callbacks
    signing_key: str  # the key id that signs jobs sent to the worker
    capability: str | None = None
    cancel_url: str | None = None
    allow_hosts: frozenset[str] = frozenset()  # exact names, or ``*.suffix``
    allow_networks: tuple[IpNetwork, ...] = ()
    allow_http: bool = False
    ca_file: Path | None = None
    connect_timeout_ms: int = 2_000
    timeout_ms: int = 10_000
    max_response_bytes: int = 65_536


@dataclass(frozen=True, slots=True)
class RemoteConfig:
    remotes: Mapping[str, Remote] = field(default_factory=dict)  # by queue
    callbacks: CallbackSettings = CallbackSettings()

    def key(self, key_id: str) -> tuple[Remote, str] | None:
        """The remote a key id belongs to and its secret, or ``None``."""
        for remote in self.remotes.values():
            if key_id in remote.secrets:
                return remote, remote.secrets[key_id]
        return None


def secret_bytes(secret: str) -> bytes:
    """The key bytes of a ``whsec_`` secret; ``ValueError`` when it is not one."""
    if not secret.startswith(_SECRET_PREFIX):
        raise ValueError(f"a secret starts with {_SECRET_PREFIX!r}")
    try:
        raw = base64.b64decode(secret[len(_SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a secret is whsec_ followed by base64") from None
    if not 24 <= len(raw) <= 64:
        raise ValueError(f"a secret holds 24 to 64 bytes, this one {len(raw)}")
    return raw


def load_remote_config(path: Path | str, env: Mapping[str, str] | None = None) -> RemoteConfig:
    """Read and check the file at ``path``; raises :class:`RemoteConfigError`."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RemoteConfigError(
            [Diagnostic("remote-config-unreadable", str(exc), Location(str(p)))]
        ) from None
    return parse_remote_config(text, str(p), env=env, base=p.parent)


def parse_remote_config(
    text: str,
    filename: str = "<remote-config>",
    *,
    env: Mapping[str, str] | None = None,
    base: Path | None = None,
) -> RemoteConfig:
    """The configuration in ``text``; ``env`` resolves ``env:NAME`` secrets (default the process
    environment), ``base`` relative ``ca_file`` paths."""
    root, found = compose(text, filename)
    if root is None or found:
        raise RemoteConfigError(found)
    reader = _ConfigReader(os.environ if env is None else env, base or Path("."))
    config = reader.config(root)
    if reader.failed or config is None:
        raise RemoteConfigError(reader.diagnostics)
    return config


class _ConfigReader(Reader):
    def __init__(self, env: Mapping[str, str], base: Path) -> None:
        super().__init__()
        self.env, self.base = env, base

    def _map(self, node: Node, path: str, known: set[str]) -> bool:
        if node.kind != "map":
            self.error("remote-config-type", "must be a mapping", node.location, path)
            return False
        for key, _, loc in node.entries:
            if key not in known:
                self.error(
                    "remote-config-unknown-field",
                    f"unknown field {key!r}; known: {', '.join(sorted(known))}",
                    loc,
                    f"{path}.{key}" if path else key,
                )
        return True

    def _int(self, node: Node, key: str, path: str, default: int, *, low: int, high: int) -> int:
        value = node.get(key)
        if value is None:
            return default
        if value.kind != "scalar" or not holds(value.value, int) or not low <= value.value <= high:
            self.error(
                "remote-config-value",
                f"must be an integer from {low} to {high}",
                location_of(node, key),
                f"{path}.{key}",
            )
            return default
        return int(value.value)

    def _str(self, node: Node, key: str, path: str, *, required: bool = False) -> str | None:
        value = node.get(key)
        if value is None:
            if required:
                self.error("remote-config-missing", f"{key!r} is required", node.location, path)
            return None
        if value.kind != "scalar" or not isinstance(value.value, str) or not value.value:
            self.error(
                "remote-config-type", "must be a non-empty string", value.location, f"{path}.{key}"
            )
            return None
        return value.value

    def config(self, root: Node) -> RemoteConfig | None:
        if not self._map(root, "", {"remotes", "callbacks"}):
            return None
        settings = CallbackSettings()
        cb = root.get("callbacks")
        if cb is not None and self._map(cb, "callbacks", {"tolerance_s", "max_body_bytes"}):
            settings = CallbackSettings(
                tolerance_s=self._int(
                    cb, "tolerance_s", "callbacks", 300, low=1, high=MAX_TOLERANCE_S
                ),
                max_body_bytes=self._int(
                    cb, "max_body_bytes", "callbacks", 1_048_576, low=1_024, high=16_777_216
                ),
            )
        remotes: dict[str, Remote] = {}
        node = root.get("remotes")
        if node is None:
            self.error("remote-config-missing", "'remotes' is required", root.location, "remotes")
            return None
        if node.kind != "map":
            self.error("remote-config-type", "must be a mapping", node.location, "remotes")
            return None
        key_owner: dict[str, str] = {}
        for queue, item, loc in node.entries:
            path = f"remotes.{queue}"
            if not _QUEUE.match(queue):
                self.error("remote-config-value", "not a queue name", loc, path)
                continue
            remote = self.remote(queue, item, path)
            if remote is None:
                continue
            for key_id in remote.secrets:
                if key_id in key_owner:
                    self.error(
                        "remote-config-duplicate-key",
                        f"key id {key_id!r} is already used by remote {key_owner[key_id]!r}",
                        location_of(item, "secrets"),
                        f"{path}.secrets.{key_id}",
                    )
                key_owner[key_id] = queue
            remotes[queue] = remote
        return RemoteConfig(remotes, settings)

    def remote(self, queue: str, node: Node, path: str) -> Remote | None:
        known = {
            "capability", "url", "cancel_url", "allow", "allow_http", "ca_file",
            "connect_timeout_ms", "timeout_ms", "max_response_bytes", "signing_key", "secrets",
        }  # fmt: skip
        if not self._map(node, path, known):
            return None
        allow_http_node = node.get("allow_http")
        allow_http = False
        if allow_http_node is not None:
            if not holds(allow_http_node.value, bool):
                self.error(
                    "remote-config-type", "must be true or false", allow_http_node.location,
                    f"{path}.allow_http",
                )  # fmt: skip
            else:
                allow_http = bool(allow_http_node.value)
        hosts, networks = self.allow(node, path)
        url = self.url(node, "url", path, allow_http, required=True)
        cancel_url = self.url(node, "cancel_url", path, allow_http)
        secrets = self.secrets(node, path)
        signing = self._str(node, "signing_key", path)
        if signing is None and secrets:
            signing = sorted(secrets)[-1]
        elif signing is not None and signing not in secrets:
            self.error(
                "remote-config-value",
                f"signing_key {signing!r} is not one of the secrets' key ids",
                location_of(node, "signing_key"),
                f"{path}.signing_key",
            )
        ca_file: Path | None = None
        ca = self._str(node, "ca_file", path)
        if ca is not None:
            ca_file = (self.base / ca) if not Path(ca).is_absolute() else Path(ca)
            if not ca_file.is_file():
                self.error(
                    "remote-config-value", f"no such file: {ca_file}",
                    location_of(node, "ca_file"), f"{path}.ca_file",
                )  # fmt: skip
        capability = self._str(node, "capability", path)
        if url is None or not secrets or signing is None:
            return None
        return Remote(
            queue=queue,
            url=url,
            secrets=secrets,
            signing_key=signing,
            capability=capability,
            cancel_url=cancel_url,
            allow_hosts=hosts,
            allow_networks=networks,
            allow_http=allow_http,
            ca_file=ca_file,
            connect_timeout_ms=self._int(
                node, "connect_timeout_ms", path, 2_000, low=1, high=60_000
            ),
            timeout_ms=self._int(node, "timeout_ms", path, 10_000, low=1, high=600_000),
            max_response_bytes=self._int(
                node, "max_response_bytes", path, 65_536, low=256, high=16_777_216
            ),
        )

    def url(
        self, node: Node, key: str, path: str, allow_http: bool, *, required: bool = False
    ) -> str | None:
        text = self._str(node, key, path, required=required)
        if text is None:
            return None
        where = location_of(node, key)
        try:
            parts = urlsplit(text)
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError as exc:
            self.error("remote-config-url", f"not a URL: {exc}", where, f"{path}.{key}")
            return None
        if parts.scheme not in ("https", "http") or not parts.hostname:
            self.error(
                "remote-config-url", "must be an https:// URL with a host", where, f"{path}.{key}"
            )
            return None
        if parts.scheme == "http" and not allow_http:
            self.error(
                "remote-config-url",
                "http:// is refused unless the remote sets allow_http: true",
                where,
                f"{path}.{key}",
            )
            return None
        if parts.username or parts.password or parts.fragment:
            self.error(
                "remote-config-url",
                "a URL carries no credentials and no fragment",
                where,
                f"{path}.{key}",
            )
            return None
        return text

    def allow(self, node: Node, path: str) -> tuple[frozenset[str], tuple[IpNetwork, ...]]:
        value = node.get("allow")
        if value is None:
            self.error(
                "remote-config-missing",
                "'allow' is required: the hosts and networks this remote may be reached at",
                node.location,
                f"{path}.allow",
            )
            return frozenset(), ()
        if value.kind != "seq":
            self.error("remote-config-type", "must be a list", value.location, f"{path}.allow")
            return frozenset(), ()
        hosts: set[str] = set()
        networks: list[IpNetwork] = []
        for i, item in enumerate(value.items):
            where = f"{path}.allow[{i}]"
            if not isinstance(item.value, str) or not item.value:
                self.error("remote-config-type", "must be a host or CIDR", item.location, where)
                continue
            text = item.value.strip().lower()
            try:
                networks.append(ipaddress.ip_network(text, strict=False))
                continue
            except ValueError:
                pass
            if "/" in text or ":" in text or not _HOST.match(text):
                self.error(
                    "remote-config-value",
                    f"{item.value!r} is neither a host name nor a CIDR",
                    item.location,
                    where,
                )
                continue
            hosts.add(text)
        return frozenset(hosts), tuple(networks)

    def secrets(self, node: Node, path: str) -> dict[str, str]:
        value = node.get("secrets")
        if value is None:
            self.error(
                "remote-config-missing", "'secrets' is required", node.location, f"{path}.secrets"
            )
            return {}
        if value.kind != "map" or not value.entries:
            self.error(
                "remote-config-type",
                "must map key ids to secrets",
                value.location,
                f"{path}.secrets",
            )
            return {}
        out: dict[str, str] = {}
        for key_id, item, loc in value.entries:
            where = f"{path}.secrets.{key_id}"
            if not _KEY_ID.match(key_id):
                self.error("remote-config-value", "a key id is 1-64 of [A-Za-z0-9._-]", loc, where)
                continue
            raw: Any = item.value
            if not isinstance(raw, str):
                self.error("remote-config-type", "must be a string", item.location, where)
                continue
            if raw.startswith("env:"):
                name = raw[4:]
                if name not in self.env:
                    self.error(
                        "remote-config-env",
                        f"environment variable {name!r} is not set",
                        item.location,
                        where,
                    )
                    continue
                raw = self.env[name]
            try:
                secret_bytes(raw)
            except ValueError as exc:
                self.error("remote-config-secret", str(exc), item.location, where)
                continue
            out[key_id] = raw
        return out
