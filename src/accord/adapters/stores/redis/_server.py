"""Connecting to Redis: URL options, the startup checks, and error translation.

``redis://[user:password@]host:port/db?prefix=accord&shards=8`` (``rediss://`` for TLS), or
``redis+cluster://[user:password@]host:port[,host:port...]/?prefix=…`` for a Redis Cluster (the
hosts are startup nodes; redis-py's asyncio cluster client learns the rest; ``ssl=true`` for TLS;
no database number). ``prefix``
and ``shards`` belong to the store (see ``keys.py``), and so do ``replicas`` and
``replica_wait_ms``: with ``replicas=N`` (default 0, off) every round of writes ends with
``WAIT N replica_wait_ms`` (default 1000), and a write fewer than ``N`` replicas acknowledged in
time fails as indeterminate (a retryable :class:`~accord.errors.StoreError`; see
``accord.adapters._redis_group``). Every other query option goes to redis-py
(``socket_timeout``, ``health_check_interval``, …).

Startup refuses a Redis that could lose run state silently: ``maxmemory-policy`` must be
``noeviction`` (an evicting Redis drops keys to make room, which for a run store means runs,
history or outbox entries vanishing); Redis must be 7.0 or newer (script flags, stream claims);
and the keyspace's shard count must match the one it was created with. Persistence switched off
is allowed, for tests and caches, but logged as a warning: a restart then loses every run; so is a
primary with fewer connected replicas than ``replicas`` asks for (its writes fail until they come).

On a cluster the checks run on every master, and each master's replicas are counted for
``replicas`` (a write waits on the master of its slot).

Errors are translated at this edge: a connection or timeout problem becomes a retryable
:class:`~accord.errors.StoreError`; a write refused for memory (``OOM``) becomes a retryable
StoreError that says nothing was written (scripts are flagged to be refused whole, never half-run).
So do the replies of a cluster in the middle of a failover or a resharding (``CLUSTERDOWN``,
``MASTERDOWN``, ``TRYAGAIN``, ``READONLY`` from a demoted master, redirections not settled, a slot
no known node serves): each means the command was not carried out, and the slot map is refreshed
before the next try.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

try:
    import redis.asyncio as aioredis
    from redis import exceptions as rx
    from redis.asyncio.cluster import ClusterNode
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.asyncio.connection import SSLConnection, parse_url
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("the Redis store needs redis-py: pip install 'accord[redis]'") from exc

from accord.adapters._redis_group import ReplicaShortfall
from accord.adapters._store_rules import prefix_option, redis_db
from accord.adapters.stores.redis.keys import StoreKeys
from accord.errors import StoreError

__all__ = ["StoreUrl", "check_server", "is_cluster", "open_client", "redis_errors", "split_url"]

log = logging.getLogger("accord.store.redis")
DEFAULT_PREFIX, DEFAULT_SHARDS, DEFAULT_REPLICA_WAIT_MS = "accord", 8, 1_000
_OURS = {"prefix", "shards", "replicas", "replica_wait_ms"}
CLUSTER_SCHEME = "redis+cluster"
# cluster replies meaning "not carried out, ask again once the cluster settles"
_UNSETTLED = (rx.ClusterDownError, rx.TryAgainError, rx.AskError, rx.ClusterError, rx.ReadOnlyError)


@dataclass(frozen=True)
class StoreUrl:
    """A store URL taken apart: what goes to redis-py, and the store's own options."""

    client_url: str
    where: str = "localhost:6379"  # for messages: the host (or the startup nodes)
    prefix: str = DEFAULT_PREFIX
    shards: int = DEFAULT_SHARDS
    replicas: int = 0
    replica_wait_ms: int = DEFAULT_REPLICA_WAIT_MS


def split_url(url: str) -> StoreUrl:
    """The store's options out of ``url``; :class:`ValueError` naming the option on a bad one."""
    parts = urlsplit(url)
    if parts.scheme == CLUSTER_SCHEME:
        where = ",".join(f"{h}:{p}" for h, p in _startup_nodes(parts.netloc))
        if redis_db(parts.path):
            raise ValueError(f"a Redis Cluster has only database 0, got path {parts.path!r}")
    elif parts.scheme in ("redis", "rediss"):
        redis_db(parts.path)  # a database that is not a number is named here, not by redis-py
        where = f"{parts.hostname or 'localhost'}:{parts.port or 6379}"
    else:
        raise ValueError(
            f"expected a redis://, rediss:// or {CLUSTER_SCHEME}:// URL, got scheme"
            f" {parts.scheme!r}"
        )
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in pairs if k in _OURS}
    rest = [(k, v) for k, v in pairs if k not in _OURS]

    def whole(name: str, default: int, least: int | None = None) -> int:
        text = ours.get(name)
        if text is None:
            return default
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"option {name}={text!r}: expected an integer") from None
        if least is not None and value < least:
            raise ValueError(f"option {name}={text!r}: expected an integer ≥ {least}")
        return value

    return StoreUrl(
        urlunsplit(parts._replace(query=urlencode(rest))),
        where,
        prefix_option(ours, DEFAULT_PREFIX),
        whole("shards", DEFAULT_SHARDS),  # keys.py says which counts are allowed
        whole("replicas", 0, 0),
        whole("replica_wait_ms", DEFAULT_REPLICA_WAIT_MS, 1),
    )


def _startup_nodes(netloc: str) -> list[tuple[str, int]]:
    """``host:port`` pairs of a cluster URL's ``[user:password@]h1:p1,h2:p2`` (port 6379 when
    left out); :class:`ValueError` naming a bad one."""
    hosts = netloc.rpartition("@")[2]
    nodes = []
    for item in hosts.split(","):
        host, colon, port = item.strip().rpartition(":")
        if not colon:
            host, port = port, "6379"
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"startup node {item!r}: expected host:port")
        nodes.append((host.strip("[]"), int(port)))
    return nodes


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is redis-py's asyncio cluster client."""
    return isinstance(client, AsyncRedisCluster)


def open_client(url: str) -> Any:
    """A redis-py client for ``url`` (a standalone client, or the asyncio cluster client for
    ``redis+cluster://``, its query options passed to every node's connections)."""
    try:
        parts = urlsplit(url)
        if parts.scheme == CLUSTER_SCHEME:
            nodes = _startup_nodes(parts.netloc)
            auth = parts.netloc.rpartition("@")[0]
            first = f"{auth}@" if auth else ""
            host, port = nodes[0]
            options: dict[str, Any] = dict(
                parse_url(f"redis://{first}{host}:{port}/0?{parts.query}")
            )
            for name in ("host", "port", "db"):
                options.pop(name, None)
            if options.pop("connection_class", None) is SSLConnection:
                options["ssl"] = True
            startup = [ClusterNode(h, p) for h, p in nodes]
            return AsyncRedisCluster(startup_nodes=startup, decode_responses=True, **options)
        client = aioredis.from_url(url, decode_responses=True)
        pool = client.connection_pool
        pool.connection_class(**pool.connection_kwargs)  # unknown options fail now, not later
    except (TypeError, ValueError, rx.RedisClusterException) as exc:
        raise ValueError(f"redis-py refused the URL options: {exc}") from exc
    return client


@asynccontextmanager
async def redis_errors(operation: str) -> AsyncIterator[None]:
    """Translate redis-py exceptions raised inside the block into :class:`StoreError`."""
    try:
        yield
    except (rx.ConnectionError, rx.TimeoutError) as exc:
        raise StoreError(f"Redis {operation}: connection problem: {exc}", retryable=True) from exc
    except rx.RedisClusterException as exc:
        # no startup node answered (a connection problem underneath) is an outage; a node that
        # is no cluster node, or a URL option the cluster client refuses, is not
        unreachable = isinstance(exc.__cause__, (rx.ConnectionError, rx.TimeoutError))
        if isinstance(exc, rx.SlotNotCoveredError) or unreachable:
            raise StoreError(
                f"Redis {operation}: no node of the cluster answered or serves the slot: {exc}",
                retryable=True,
            ) from exc
        raise StoreError(f"Redis {operation}: {exc}") from exc
    except _UNSETTLED as exc:
        raise StoreError(
            f"Redis {operation}: the cluster is failing over or resharding"
            f" ({type(exc).__name__}: {exc}); not carried out, try again",
            retryable=True,
        ) from exc
    except ReplicaShortfall as exc:
        raise StoreError(
            f"Redis {operation}: {exc}; the write is indeterminate, so reload before trying again"
            " (see replicas in docs/redis.md)",
            retryable=True,
        ) from exc
    except rx.ResponseError as exc:
        text = str(exc)
        if isinstance(exc, rx.OutOfMemoryError) or "maxmemory" in text:
            raise StoreError(
                f"Redis {operation}: refused, Redis is at maxmemory (noeviction); nothing was"
                " written. Free memory or raise maxmemory.",
                retryable=True,
            ) from exc
        raise StoreError(f"Redis {operation}: {text}") from exc
    except rx.RedisError as exc:
        raise StoreError(f"Redis {operation}: {exc}") from exc


async def check_server(client: Any, keys: StoreKeys, where: str, replicas: int = 0) -> None:
    """The startup checks of the module docstring; raises :class:`StoreError` on refusal."""
    async with redis_errors("startup check"):
        if is_cluster(client):
            await client.initialize()
            for node in client.get_primaries():
                await _check_node(_On(client, node), f"{node.name} (of {where})", replicas)
        else:
            await _check_node(client, where, replicas)
        await client.hsetnx(keys.meta, "shards", keys.shard_count)
        recorded = await client.hget(keys.meta, "shards")
    if recorded is not None and int(recorded) != keys.shard_count:
        raise StoreError(
            f"keyspace {keys.prefix!r} at {where} was created with shards={recorded}; this store"
            f" was opened with shards={keys.shard_count}. Open it with ?shards={recorded}."
        )


class _On:
    """The two server commands the checks send, aimed at one node of a cluster client."""

    def __init__(self, client: Any, node: Any) -> None:
        self.client, self.node = client, node

    async def info(self, section: str) -> Any:
        return await self.client.info(section, target_nodes=self.node)

    async def config_get(self, name: str) -> Any:
        return await self.client.config_get(name, target_nodes=self.node)


async def _check_node(client: Any, where: str, replicas: int) -> None:
    """The checks of one server (a standalone Redis, or one master of a cluster)."""
    if replicas:
        connected = int((await client.info("replication")).get("connected_slaves", 0))
        if connected < replicas:
            log.warning(
                "Redis at %s has %d connected replicas and the store asks for replicas=%d:"
                " every write fails as indeterminate until enough replicas connect",
                where,
                connected,
                replicas,
            )
    server = await client.info("server")
    memory = await client.info("memory")
    persistence = await client.info("persistence")
    version = str(server.get("redis_version", "0"))
    if tuple(int(p) for p in version.split(".")[:2]) < (7, 0):
        raise StoreError(f"Redis at {where} is version {version}; the store needs 7.0 or newer")
    policy = str(memory.get("maxmemory_policy", "unknown"))
    if policy != "noeviction":
        raise StoreError(
            f"Redis at {where} has maxmemory-policy={policy}; refusing to use it as the run"
            " store: an evicting Redis silently deletes run state, history and outbox entries."
            " Set `maxmemory-policy noeviction` (CONFIG SET maxmemory-policy noeviction, and"
            " in redis.conf)."
        )
    await _warn_on_persistence(client, persistence, where)


async def _warn_on_persistence(client: Any, persistence: dict[str, Any], where: str) -> None:
    if int(persistence.get("aof_enabled", 0)):
        try:
            fsync = (await client.config_get("appendfsync")).get("appendfsync", "unknown")
        except rx.ResponseError:  # CONFIG may be denied by ACLs or renamed by a provider
            fsync = "unknown"
        if fsync != "always":
            log.info(
                "Redis at %s: AOF with appendfsync=%s; up to ~1 s of acknowledged commits can"
                " be lost on a crash (see docs/redis.md)",
                where,
                fsync,
            )
        return
    try:
        save = (await client.config_get("save")).get("save", "")
    except rx.ResponseError:
        save = "unknown"
    what = "only RDB snapshots" if save else "no persistence (no AOF, no RDB)"
    log.warning(
        "Redis at %s has %s: a restart loses run state committed since the last snapshot;"
        " production needs appendonly yes with appendfsync always (see docs/redis.md)",
        where,
        what,
    )
