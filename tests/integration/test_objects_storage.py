"""``storageConnectionRef`` resolution against a real S3 server (SeaweedFS): the registry checks
the run's tenant, grants signed URLs under the tenant's prefix that end within the stage's
deadline, refuses another tenant's reference (terminal ``storage-ref-denied``, recorded in the
run's history), and no signed URL reaches a history entry, a log line or an ``accord runs`` view
(canary grep over every URL the resolver issued)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from accord.adapters.objects.connections import (
    Connection,
    ConnectionRegistry,
    RegistryError,
)
from accord.adapters.objects.s3 import S3ObjectStore
from accord.cli import app
from accord.cli._demo_run import reference_workers
from accord.cli.workflow import compile_file
from accord.contracts.catalog import Catalog
from accord.contracts.sources import load_catalog
from accord.errors import StageFailed
from accord.objects.ports import Operation
from accord.worker.fleet import ingest_stack, wait_terminal
from accord.worker.storage import RemoteStorage, StorageMap
from accord.workflow.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from tests.services import SeaweedFS, ensure_seaweedfs  # noqa: E402

BUCKET = "accord-tenants"
MODEL = ROOT / "examples" / "models" / "plate-with-hole.stl"


class Recording(S3ObjectStore):
    """The real S3 store, noting every signed URL it issues (for the canary grep)."""

    issued: list[str]

    def presign(self, key: str, operation: Operation, expires_s: int) -> str:
        url = super().presign(key, operation, expires_s)
        self.issued.append(url)
        return url


def admin(server: SeaweedFS, cls: type[S3ObjectStore] = S3ObjectStore) -> S3ObjectStore:
    access, secret = server.credentials()
    store = cls(BUCKET, endpoint=server.endpoint, access_key=access, secret_key=secret)
    store.ensure_bucket()
    return store


@pytest.fixture
def world() -> Iterator[tuple[ConnectionRegistry, Recording, str]]:
    """A registry with one connection per tenant (acme, globex) and a shared one, all in one
    bucket under a fresh top prefix; the resolver's store records the URLs it signs."""
    server = ensure_seaweedfs()
    top = f"r-{uuid.uuid4().hex[:10]}"
    store = admin(server, Recording)
    assert isinstance(store, Recording)
    store.issued = []
    url = f"s3://{BUCKET}?endpoint={server.endpoint}"
    rw, ro = frozenset({"read", "write"}), frozenset({"read"})
    conns = [
        Connection("acme-models", "acme", url, f"{top}/tenants/acme/", rw),
        Connection("globex-models", "globex", url, f"{top}/tenants/globex/", ro),
        Connection("local", "*", url, f"{top}/shared/{{tenant}}/", rw),
    ]
    names = ("acme-models", "globex-models", "local")
    registry = ConnectionRegistry(conns, stores=dict.fromkeys(names, store))
    yield registry, store, top
    store.close()


def test_a_grant_is_scoped_to_the_tenants_prefix(world: Any) -> None:
    registry, store, top = world
    storage = StorageMap(registry=registry).open("acme-models", "acme")
    assert isinstance(storage, RemoteStorage)
    key, size, digest = storage.put_bytes("thumbnails/m1/a.png", b"\x89PNG-1")
    assert (key, size) == ("thumbnails/m1/a.png", 6) and digest.startswith("sha256:")
    assert store.get(f"{top}/tenants/acme/thumbnails/m1/a.png").data == b"\x89PNG-1"
    assert storage.get_path(key).read_bytes() == b"\x89PNG-1"
    store.put(f"{top}/tenants/globex/models/g.stl", b"globex's")
    with pytest.raises(StageFailed) as refused:
        storage.get_path("../globex/models/g.stl")
    assert refused.value.failure_code == "invalid-object-key"
    with pytest.raises(StageFailed) as missing:
        storage.get_path("models/g.stl")  # acme's prefix has no such model
    assert missing.value.failure_code == "object-not-found"
    shared = StorageMap(registry=registry).open(None, "globex")  # no ref: the "local" one
    shared.put_bytes("x.bin", b"g")
    assert store.list(f"{top}/shared/") == [f"{top}/shared/globex/x.bin"]


def test_another_tenants_reference_is_refused(world: Any) -> None:
    registry, _, _ = world
    with pytest.raises(StageFailed) as refused:
        StorageMap(registry=registry).open("acme-models", "globex")
    assert refused.value.failure_code == "storage-ref-denied" and not refused.value.retryable
    read_only = StorageMap(registry=registry).open("globex-models", "globex")
    with pytest.raises(StageFailed) as no_write:
        read_only.put_bytes("x.bin", b"x")
    assert no_write.value.failure_code == "storage-ref-denied"
    with pytest.raises(StageFailed) as unknown:
        StorageMap(registry=registry).open("nobody", "acme")
    assert unknown.value.failure_code == "storage-unavailable"


def test_signed_urls_end_within_the_stages_deadline(world: Any) -> None:
    registry, store, _ = world
    now = 1_800_000_000_000
    grant = registry.resolve("acme-models", "acme", now_ms=now, deadline_ms=now + 4_500)
    assert grant.expires_s == 4
    long = registry.resolve("acme-models", "acme", now_ms=now, deadline_ms=now + 86_400_000)
    assert long.expires_s == 900  # never past the registry's cap
    with pytest.raises(StageFailed) as late:
        registry.resolve("acme-models", "acme", now_ms=now, deadline_ms=now - 1)
    assert late.value.failure_code == "storage-ref-denied"
    grant.url("models/m.stl", "read")
    assert "X-Amz-Expires=4&" in store.issued[-1]


def test_a_signed_url_from_a_grant_expires(world: Any) -> None:
    registry, store, top = world
    store.put(f"{top}/tenants/acme/m.bin", b"m")
    now = int(time.time() * 1000)
    # the grant lives 3 s (whole seconds, rounded down); S3 dates a signature to the second, so
    # the URL lives between 2 and 3 s: long enough to be read at once on a loaded machine
    grant = registry.resolve("acme-models", "acme", now_ms=now, deadline_ms=now + 3_999)
    assert grant.expires_s == 3
    url = grant.url("m.bin", "read")
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.read() == b"m"
    time.sleep(4.2)
    with pytest.raises(urllib.error.HTTPError) as expired:
        urllib.request.urlopen(url, timeout=10)
    assert expired.value.code == 403
    expired.value.close()


def test_the_registry_file_is_checked_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "connections.json"
    entry = {"name": "a", "tenant": "acme", "url": "s3://b", "prefix": "p/"}
    path.write_text(json.dumps({"connections": [entry | {"secretKeyEnv": "NOPE"}]}))
    with pytest.raises(RegistryError, match=r"connections\[0\]\.secretKeyEnv"):
        ConnectionRegistry.from_file(path, env={})
    path.write_text(json.dumps({"connections": [entry | {"tenant": "*", "prefix": "shared/"}]}))
    with pytest.raises(RegistryError, match=r"connections\[0\].*\{tenant\}"):
        ConnectionRegistry.from_file(path, env={})
    keyed = entry | {"accessKeyEnv": "K", "secretKeyEnv": "S"}
    path.write_text(json.dumps({"connections": [keyed]}))
    loaded = ConnectionRegistry.from_file(path, env={"K": "key-1", "S": "secret-1"})
    assert loaded.names() == ["a"]
    assert "secret-1" not in json.dumps(loaded.describe())


# -- a real run: the reference workers read and write through signed URLs ----------------------


def plan_with_ref(tmp_path: Path, catalog: Catalog) -> Plan:
    """model-ingest with each worker stage also bound to ``context.storageConnectionRef``."""
    text = (ROOT / "workflows" / "model-ingest.yaml").read_text()
    text = re.sub(
        r"(    worker: [^\n]+\n    input: \{ modelId: \"\$\{context.modelId\}\")",
        r'\1, storageConnectionRef: "${context.storageConnectionRef}"',
        text,
    )
    assert text.count("context.storageConnectionRef") == 3
    (tmp_path / "model-ingest.yaml").write_text(text)
    return compile_file(tmp_path / "model-ingest.yaml", catalog).unwrap()


async def run_two(tmp_path: Path, registry: ConnectionRegistry) -> tuple[str, str, str]:
    catalog = load_catalog(ROOT / "schemas" / "contracts")
    plan = plan_with_ref(tmp_path, catalog)
    url = f"sqlite:///{tmp_path / 'accord.db'}"
    services = {"storage": StorageMap(registry=registry)}
    workers = reference_workers(ROOT)
    async with ingest_stack(url, plan, catalog, workers, state=tmp_path / "state",
                            services=services) as stack:  # fmt: skip
        engine = stack.engine
        ok = await engine.start_run(
            plan.name, {"modelId": "plate", "storageConnectionRef": "acme-models"}, tenant="acme"
        )
        refused = await engine.start_run(
            plan.name, {"modelId": "plate", "storageConnectionRef": "acme-models"},
            tenant="globex",
        )  # fmt: skip
        await wait_terminal(engine, [ok, refused], 90)
    return url, ok, refused


def test_a_run_uses_signed_urls_only_and_another_tenants_ref_is_refused(
    tmp_path: Path, world: Any, caplog: pytest.LogCaptureFixture
) -> None:
    registry, store, top = world
    store.put(f"{top}/tenants/acme/models/plate.stl", MODEL.read_bytes())
    store.put(f"{top}/tenants/globex/models/plate.stl", MODEL.read_bytes())
    caplog.set_level(logging.DEBUG)
    url, ok, refused = asyncio.run(run_two(tmp_path, registry))
    views = {}
    for run_id in (ok, refused):
        for command in ("show", "history"):
            result = CliRunner().invoke(app, ["runs", command, run_id, "--store", url, "--json"])
            assert result.exit_code == 0, result.output
            views[(command, run_id)] = result.output
    shown = json.loads(views[("show", ok)])
    assert shown["status"] == "completed", views[("history", ok)]
    thumbs = store.list(f"{top}/tenants/acme/thumbnails/plate/")
    assert thumbs and all(k.endswith(".png") for k in thumbs)
    assert store.list(f"{top}/tenants/globex/thumbnails/") == []
    failed = json.loads(views[("show", refused)])
    assert failed["status"] == "failed"
    history = json.loads(views[("history", refused)])
    failures = [h["event"] for h in history if h["event"]["kind"] == "stage-failed"]
    assert [(f["stage"], f["code"], f["retryable"]) for f in failures] == [
        ("render-thumbnail", "storage-ref-denied", False)
    ], failures
    # the canary: every signed URL the resolver issued, and its signature alone
    assert len(store.issued) >= 3
    canaries = set(store.issued) | {
        re.search(r"X-Amz-Signature=([0-9a-f]+)", u).group(1)  # type: ignore[union-attr]
        for u in store.issued
    }
    db = (tmp_path / "accord.db").read_bytes()
    logs = "\n".join(r.getMessage() for r in caplog.records)
    seen = {"log": logs, "db": db.decode("latin-1"), **{str(k): v for k, v in views.items()}}
    leaks = sorted(where for where, text in seen.items() for c in canaries if c in text)
    assert leaks == [], leaks
    assert "X-Amz-Signature" not in logs and "X-Amz-Credential" not in logs
