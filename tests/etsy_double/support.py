"""What the marketplace tests share: policy files, the connector's configuration, a context."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

from accord_worker_marketplace_etsy.config import EtsyConfig
from typer.testing import CliRunner

from accord.cli import app
from accord.worker.sdk import Context

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = ROOT / "schemas" / "contracts"
TOKENS = {"demo-shop": "token-shop-1", "read-only-shop": "token-read-only", "revoked": "gone"}

RULES: dict[str, Any] = {
    "titleMaxLength": 140,
    "titlePattern": r"[\w\s.,:;!?'\"()\[\]/&%+=<>#*@×°±™©®-]+",
    "tagMaxLength": 20,
    "tagPattern": r"[\w '™©®-]+",
    "maxTags": 13,
    "taxonomyIds": [1, 66],
    "priceMin": 0.2,
    "priceMax": 50000,
}


def refresh(policies: Path, tmp: Path, **override: Any) -> dict[str, Any]:
    """``accord policy refresh etsy --from FILE --json``; the document it printed."""
    source = tmp / f"policy-{len(list(tmp.glob('policy-*.json')))}.json"
    source.write_text(json.dumps(RULES | override))
    args = ["policy", "refresh", "etsy", "--from", str(source), "--policies", str(policies)]
    result = CliRunner().invoke(app, [*args, "--contracts", str(CONTRACTS), "--json"])
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.output)
    return doc


def config(base_url: str, policies: Path, **kw: Any) -> EtsyConfig:
    return EtsyConfig(
        base_url=base_url,
        api_key="double-api-key",
        tokens=TOKENS,
        policies=policies,
        **({"read_timeout_s": 2.0, "max_wait_s": 3.0} | kw),
    )


def context(
    cfg: EtsyConfig, tenant: str = "demo", run_id: str = "r1", attempt: int = 1, **services: Any
) -> Context:
    return Context(
        run_id=run_id,
        stage="publish-listing",
        attempt=attempt,
        fence="f",
        tenant=tenant,
        capability="marketplace.etsy.publish-listing@1",
        idempotency_key=f"{run_id}:publish-listing",
        envelope={},
        services={"etsy": cfg, **services},
    )


def listing(**override: Any) -> dict[str, Any]:
    return {
        "quantity": 1,
        "title": "Cube 3D printable model (3MF)",
        "description": "A cube.\nFile format: 3MF.",
        "price": 12.5,
        "whoMade": "i_did",
        "whenMade": "made_to_order",
        "taxonomyId": 1,
        "type": "download",
        "isDigital": True,
        "tags": ["cube", "box"],
    } | override


def request(model_id: str = "cube", ref: str = "demo-shop", **override: Any) -> dict[str, Any]:
    return {"modelId": model_id, "shopId": 1, "credentialsRef": ref, "listing": listing(**override)}


def png(width: int, height: int, shade: int = 200) -> bytes:
    """A real PNG of one grey level (what the thumbnail worker writes, smaller)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + bytes([shade]) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
            + chunk(b"IEND", b""))  # fmt: skip


def thumbnails(objects: Path, tenant: str, model_id: str, count: int = 2) -> list[str]:
    """``count`` gallery thumbnails of ``model_id`` in the tenant's folder, as model-ingest
    leaves them; their keys."""
    keys = [f"thumbnails/{model_id}/gallery-{64 + i}.png" for i in range(count)]
    for i, key in enumerate(keys):
        path = objects / tenant / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png(64 + i, 64 + i, 100 + 40 * i))
    return keys
