"""The connector's own configuration: where Etsy is, and the tokens behind opaque references.

A publish request names its shop's OAuth token only by ``credentialsRef``; the token itself lives
in the worker's configuration and never travels in a payload, an outcome or a log line. The
configuration comes from ``ctx.services["etsy"]`` (an :class:`EtsyConfig`, as tests and the
fleet pass it) or from the environment:

| variable | meaning |
| --- | --- |
| ``ACCORD_ETSY_BASE_URL`` | Etsy's API root (``https://openapi.etsy.com``) |
| ``ACCORD_ETSY_API_KEY`` | the application's key, sent as ``x-api-key`` |
| ``ACCORD_ETSY_TOKENS`` | a JSON file ``{"<credentialsRef>": "<OAuth access token>"}`` |
| ``ACCORD_POLICIES`` | the folder ``accord policy refresh`` writes (``.accord/policies``) |
| ``ACCORD_ETSY_READ_TIMEOUT_S`` | how long to wait for a response once a request is sent (10) |
| ``ACCORD_ETSY_CREATE_CLAIMS`` | a store all connector processes reach, for create claims |

``ACCORD_ETSY_CREATE_CLAIMS`` is an object store URL (``file:///dir``, or
``s3://bucket?endpoint=…`` with credentials from boto3's chain): creates are claimed there first
(:mod:`.claims`). Unset, only the per-process lock serialises them.

A claims URL that names no store raises :class:`ValueError` naming the variable. The
claim store is opened once per process (the configuration is read again for every job).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accord.adapters.objects import open_object_store
from accord.objects.ports import ObjectStore

__all__ = ["EtsyConfig", "config_of"]


@dataclass(frozen=True)
class EtsyConfig:
    base_url: str
    api_key: str
    tokens: Mapping[str, str] = field(repr=False)
    policies: Path = Path(".accord/policies")
    read_timeout_s: float = 10.0
    max_wait_s: float = 10.0  # the longest Retry-After honoured inside one attempt
    tries: int = 3  # calls per attempt after a 429 or 5xx before the attempt gives up
    # where connector processes claim a create before making it (accord_worker_marketplace_etsy
    # .claims); None: one process per shop, serialised by its lock alone
    create_claims: ObjectStore | None = field(default=None, repr=False)
    claim_poll_s: float = 0.1  # how often a process waiting on another's claim looks again

    @property
    def claim_lease_s(self) -> float:
        """How long a create claim holds: longer than one whole create call (every try, every
        ``Retry-After`` honoured), with room for the query around it."""
        return self.tries * (self.read_timeout_s + self.max_wait_s) + 5.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> EtsyConfig:
        env = os.environ if env is None else env
        tokens_file = env.get("ACCORD_ETSY_TOKENS")
        tokens: dict[str, str] = {}
        if tokens_file:
            loaded = json.loads(Path(tokens_file).read_text("utf-8"))
            tokens = {str(k): str(v) for k, v in dict(loaded).items()}
        claims_url = env.get("ACCORD_ETSY_CREATE_CLAIMS")
        claims = _claims_store(claims_url) if claims_url else None
        return cls(
            base_url=env.get("ACCORD_ETSY_BASE_URL", "https://openapi.etsy.com"),
            api_key=env.get("ACCORD_ETSY_API_KEY", ""),
            tokens=tokens,
            policies=Path(env.get("ACCORD_POLICIES", ".accord/policies")),
            read_timeout_s=float(env.get("ACCORD_ETSY_READ_TIMEOUT_S", "10")),
            create_claims=claims,
        )


def config_of(services: Mapping[str, Any]) -> EtsyConfig:
    found = services.get("etsy")
    return found if isinstance(found, EtsyConfig) else EtsyConfig.from_env()


_STORES: dict[str, ObjectStore] = {}
_STORES_GUARD = threading.Lock()


def _claims_store(url: str) -> ObjectStore:
    """The claim store ``url`` names, opened once per process."""
    with _STORES_GUARD:
        if url not in _STORES:
            try:
                _STORES[url] = open_object_store(url)
            except ValueError as exc:
                raise ValueError(f"ACCORD_ETSY_CREATE_CLAIMS: {exc}") from None
        return _STORES[url]
