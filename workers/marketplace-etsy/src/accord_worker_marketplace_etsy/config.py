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
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> EtsyConfig:
        env = os.environ if env is None else env
        tokens_file = env.get("ACCORD_ETSY_TOKENS")
        tokens: dict[str, str] = {}
        if tokens_file:
            loaded = json.loads(Path(tokens_file).read_text("utf-8"))
            tokens = {str(k): str(v) for k, v in dict(loaded).items()}
        return cls(
            base_url=env.get("ACCORD_ETSY_BASE_URL", "https://openapi.etsy.com"),
            api_key=env.get("ACCORD_ETSY_API_KEY", ""),
            tokens=tokens,
            policies=Path(env.get("ACCORD_POLICIES", ".accord/policies")),
            read_timeout_s=float(env.get("ACCORD_ETSY_READ_TIMEOUT_S", "10")),
        )


def config_of(services: Mapping[str, Any]) -> EtsyConfig:
    found = services.get("etsy")
    return found if isinstance(found, EtsyConfig) else EtsyConfig.from_env()
