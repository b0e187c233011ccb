"""Real back-ends for tests: make sure they answer, starting them when they do not.

:func:`ensure_redis` pings Redis on 127.0.0.1:6379 and, when nothing answers, starts a private
``redis-server`` (installing the Debian package first if the binary is missing). Tests never skip
for want of Redis: if it cannot be had, they fail, loudly, everywhere (in CI as on a laptop).
Tests use database 15 and a unique key prefix per store, so they neither collide with each other
nor touch data in database 0; every prefix handed out is deleted when the test process exits.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

__all__ = [
    "REDIS_DB",
    "REDIS_PORT",
    "PrivateRedis",
    "ensure_rabbitmq",
    "ensure_redis",
    "redis_store_opener",
    "redis_url",
]

REDIS_PORT, REDIS_DB = 6379, 15
_prefixes: list[str] = []
_state: dict[str, bool] = {}


def _ping(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def _start(port: int) -> None:
    if shutil.which("redis-server") is None:
        subprocess.run(["apt-get", "install", "-y", "redis-server"], check=False, timeout=300)
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed and `apt-get install redis-server` failed")
    subprocess.run(
        ["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "--port", str(port),
         "--save", "", "--appendonly", "no"],
        check=True, timeout=30,
    )  # fmt: skip


def ensure_redis(port: int = REDIS_PORT) -> None:
    """Redis answers on ``port`` with ``maxmemory-policy noeviction`` (set for this process's
    lifetime and restored at exit if it was something else), or the calling test fails."""
    if _state.get("ready"):
        return
    if not _ping(port):
        _start(port)
        deadline = time.monotonic() + 10
        while not _ping(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not _ping(port):
            ci = " (CI)" if os.environ.get("CI") else ""
            pytest.fail(f"Redis on 127.0.0.1:{port} is not answering and could not be started{ci}")
    client = redis.Redis(port=port, decode_responses=True)
    policy = client.config_get("maxmemory-policy")["maxmemory-policy"]
    if policy != "noeviction":
        client.config_set("maxmemory-policy", "noeviction")
        atexit.register(_restore, port, str(policy))
    _state["ready"] = True


def _restore(port: int, policy: str) -> None:
    redis.Redis(port=port).config_set("maxmemory-policy", policy)


def redis_url(prefix: str | None = None, *, shards: int = 4, port: int = REDIS_PORT) -> str:
    """A store URL on a fresh keyspace (deleted at exit)."""
    prefix = prefix or f"t-{uuid.uuid4().hex[:12]}"
    if port == REDIS_PORT:
        _prefixes.append(prefix)
    return f"redis://127.0.0.1:{port}/{REDIS_DB}?prefix={prefix}&shards={shards}"


def redis_store_opener(_tmp: Path, clock: Any) -> Any:
    """Contract-suite factory: every call of the opener is a new connection on one keyspace."""
    from accord.adapters import open_store

    ensure_redis()
    url = redis_url()
    return lambda: open_store(url, clock=clock)


@atexit.register
def _cleanup() -> None:
    if not _prefixes:
        return
    try:
        client = redis.Redis(port=REDIS_PORT, db=REDIS_DB)
        for prefix in _prefixes:
            keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
            for n in range(0, len(keys), 500):
                client.delete(*keys[n : n + 500])
    except redis.RedisError:
        pass  # the server is gone: nothing left to clean


class PrivateRedis:
    """A ``redis-server`` of the test's own, on a free port, persisting to ``directory`` with AOF
    ``appendfsync always`` (every acknowledged write is on disk), so it can be killed and
    restarted, or squeezed with ``maxmemory``, without touching the shared server. ``extra`` are
    more ``redis-server`` arguments (``--replicaof``, …)."""

    def __init__(self, directory: Path, *extra: str) -> None:
        ensure_redis()  # installs the binary when missing
        self.directory = directory
        self.extra = extra
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> PrivateRedis:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
             str(self.directory), "--appendonly", "yes", "--appendfsync", "always", "--save", "",
             "--maxmemory-policy", "noeviction", *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while not _ping(self.port):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                pytest.fail(f"private redis-server on port {self.port} did not start")
            time.sleep(0.02)
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown save, only what the AOF already holds survives."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True)

    def url(self, prefix: str = "acc", shards: int = 4) -> str:
        return f"redis://127.0.0.1:{self.port}/0?prefix={prefix}&shards={shards}"


RABBITMQ_PORT = 5672


def _rabbit_answers(port: int) -> bool:
    """An AMQP 0-9-1 handshake starts: the server answers the protocol header with a frame."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            return sock.recv(1) == b"\x01"  # a method frame (Connection.Start)
    except OSError:
        return False


def ensure_rabbitmq(port: int = RABBITMQ_PORT) -> None:
    """RabbitMQ answers AMQP on ``port`` (started with ``rabbitmq-server -detached`` when it does
    not, installing the Debian package first if needed), or the calling test fails."""
    if _state.get("rabbitmq") or _rabbit_answers(port):
        _state["rabbitmq"] = True
        return
    if shutil.which("rabbitmq-server") is None:
        subprocess.run(["apt-get", "install", "-y", "rabbitmq-server"], check=False, timeout=600)
    if shutil.which("rabbitmq-server") is None:
        pytest.fail("rabbitmq-server is not installed and `apt-get install` failed")
    subprocess.run(["rabbitmq-server", "-detached"], check=False, timeout=60)
    deadline = time.monotonic() + 60
    while not _rabbit_answers(port) and time.monotonic() < deadline:
        time.sleep(0.25)
    if not _rabbit_answers(port):
        ci = " (CI)" if os.environ.get("CI") else ""
        pytest.fail(f"RabbitMQ on 127.0.0.1:{port} is not answering and could not be started{ci}")
    _state["rabbitmq"] = True
