"""``accord demo --objects s3://…``: the same demo with models, thumbnails and the stage-result
cache in an S3 object store instead of the state directory.

The models are uploaded to ``<prefix>tenants/<tenant>/models/<modelId>.<ext>`` (skipped when the
stored bytes are already the same), the workers reach them through the connection registry's
shared ``local`` connection (prefix ``tenants/{tenant}/``: each run sees only its tenant's objects
— never the cache's — through
signed URLs that end within the stage's deadline), and the platform's cache lives under
``<prefix>cache/`` with conditional writes. The engine's store and queue stay where ``--store`` /
``--transport`` put them. Credentials come from the environment (``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY``), never the URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

from accord.actions.config import Locator
from accord.adapters.objects import open_object_store
from accord.adapters.objects.connections import Connection, ConnectionRegistry
from accord.cli._common import console
from accord.cli._demo_run import reference_workers, start_and_follow
from accord.cli._demo_view import summarise, summary_table
from accord.cli._registry import Workspace
from accord.cli.workflow import compile_file
from accord.contracts.sealing import Keyring
from accord.contracts.sources import load_catalog
from accord.engine.machine.state import RunState
from accord.errors import EngineError
from accord.objects.ports import ObjectError, ObjectNotFound, ObjectStore
from accord.worker.fleet import ingest_stack
from accord.worker.storage import StorageMap

__all__ = ["run_demo_objects"]


def _upload(store: ObjectStore, tenant: str, models: list[tuple[str, Path]]) -> None:
    for model_id, path in models:
        key = f"tenants/{tenant}/models/{model_id}{path.suffix.lower()}"
        data = path.read_bytes()
        try:
            if store.get(key).data == data:
                continue
        except ObjectNotFound:
            pass
        store.put(key, data)


def s3_locator(store: ObjectStore, local: Path) -> Locator:
    """The platform's model locator over the store: the first ``tenants/<tenant>/models/<id>.*``,
    mirrored to ``local`` (re-read only when its size changed) so its digest can be taken."""

    def locate(tenant: str, model_id: str) -> Path | None:
        try:
            keys = store.list(f"tenants/{tenant}/models/{model_id}.")
            if not keys:
                return None
            key = keys[0]
            target = local / key
            size = store.head(key).size
            if not target.is_file() or target.stat().st_size != size:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(store.get(key).data)
            return target
        except ObjectError:
            return None  # not a cache verdict: the workers classify an unreachable store

    return locate


def _view_dir(store: ObjectStore, run: RunState, folder: Path) -> Path:
    """The cache objects a hit referenced, copied under ``folder`` for the report."""
    lookup = run.stages["cache-lookup"].result or {}
    for ref in lookup.get("results", []):
        key = str(ref["objectKey"])
        with contextlib.suppress(ObjectError, OSError):
            target = folder / key
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(store.get(key).data)
    return folder


async def run_demo_objects(
    ws: Workspace,
    models: list[tuple[str, Path]],
    state: Path,
    tenant: str,
    objects_url: str,
    *,
    quiet: bool,
    store: str | None = None,
    transport: str | None = None,
    sealing: Keyring | None = None,
) -> list[dict[str, Any]]:
    try:
        objects = open_object_store(objects_url)
    except ValueError as exc:
        raise EngineError(f"--objects: {exc}") from None
    try:
        ensure_bucket = getattr(objects, "ensure_bucket", None)  # S3: create it when missing
        if ensure_bucket is not None:
            await asyncio.to_thread(ensure_bucket)
        await asyncio.to_thread(_upload, objects, tenant, models)
    except ObjectError as exc:
        objects.close()
        raise EngineError(f"--objects {objects.url}: {exc}") from None
    try:
        return await _run(ws, models, state, tenant, objects, quiet, store, transport, sealing)
    finally:
        objects.close()


async def _run(  # noqa: PLR0917 - the demo's parts
    ws: Workspace,
    models: list[tuple[str, Path]],
    state: Path,
    tenant: str,
    objects: ObjectStore,
    quiet: bool,
    store: str | None,
    transport: str | None,
    sealing: Keyring | None,
) -> list[dict[str, Any]]:
    catalog = load_catalog(ws.sources)
    plan = compile_file(ws.root / "workflows" / "model-ingest.yaml", catalog).unwrap()
    state.mkdir(parents=True, exist_ok=True)
    shared = Connection(
        "local", "*", objects.url, "tenants/{tenant}/", frozenset({"read", "write"})
    )
    registry = ConnectionRegistry([shared], stores={"local": objects})
    services = {"storage": StorageMap(registry=registry)}
    url = store or f"sqlite:///{state / 'accord.db'}"
    if not quiet:
        console.print(f"workflow [bold]{plan.name}@{plan.version}[/bold] compiled: {plan.digest}")
        console.print(f"objects: {objects.url} (models, thumbnails and the result cache)")
    started = time.perf_counter()
    workers = reference_workers(ws.root)
    async with ingest_stack(
        url, plan, catalog, workers, state=state, services=services, transport=transport,
        sealing=sealing, locate=s3_locator(objects, state / "objects-mirror"),
        cache_store=objects,
    ) as stack:  # fmt: skip  # the cache and the model locator on the store
        engine = stack.engine
        title = f"model-ingest over {len(models)} models (tenant {tenant}, objects in S3)"
        runs, states = await start_and_follow(engine, plan, models, tenant, title, quiet=quiet)
        await stack.platform.writer.drain()
    elapsed = time.perf_counter() - started
    rows = []
    base = objects.url.split("?", 1)[0].rstrip("/")
    for mr in runs:
        run = states[mr.run_id]
        assert run is not None
        view_dir = await asyncio.to_thread(_view_dir, objects, run, state / "objects-view")
        row = summarise(mr, run, view_dir, Path("/"))
        row["thumbnails"] = [f"{base}/tenants/{t.removeprefix('/')}" for t in row["thumbnails"]]
        rows.append(row)
    if not quiet:
        hits = sum(r["route"] == "cache hit" for r in rows)
        console.print(summary_table(rows, f"{len(rows)} models in {elapsed:.1f} s, {hits} from "
                                          "the cache"))  # fmt: skip
        console.print(f"outputs: models, thumbnails and the result cache in {base}/")
    return rows
