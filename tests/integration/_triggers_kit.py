"""Shared pieces of the trigger tests: a small triggered workflow and engines over real stores."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.services import ensure_redis, redis_url

from accord.adapters import open_store, open_transport
from accord.contracts.catalog import Catalog
from accord.contracts.sources import load_catalog
from accord.engine.ports import Clock
from accord.engine.runtime.orchestrator import Engine, EngineOptions
from accord.workflow.compiler import compile_workflow
from accord.workflow.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
CATALOG: Catalog = load_catalog(ROOT / "schemas" / "contracts")
# 2026-01-05T00:00:00Z, a Monday
T0 = 1_767_571_200_000
MINUTE = 60_000

WORKFLOW = """\
name: {name}
version: "1"
owner: asset-processing
review_date: "2030-12-31"
context: model-ingest-context@1
entry: extract
terminals: [completed, failed]
stages:
  - name: extract
    type: worker
    worker: metadata.extract@2
    queue: {queue}
    input: {{ modelId: "${{context.modelId}}" }}
    on_success: completed
    on_failure: failed
triggers:
{triggers}
{budgets}
"""


def schedule(  # noqa: PLR0917 - each policy is one argument of the tests
    name: str = "every-minute",
    cron: str = "* * * * *",
    tz: str = "UTC",
    overlap: str = "allow",
    catch_up: str = "none",
    limit: int | None = None,
) -> str:
    extra = f"\n    catch_up_limit: {limit}" if limit is not None else ""
    return (
        f'  - name: {name}\n    type: schedule\n    cron: "{cron}"\n    timezone: {tz}\n'
        f"    overlap: {overlap}\n    catch_up: {catch_up}{extra}\n"
        f"    context: {{ modelId: sched-1 }}"
    )


WEBHOOK = (
    "  - name: upload-webhook\n    type: webhook\n    source: storefront\n"
    "    event: model-ingest-context@1\n"
    '    context: { modelId: "${event.modelId}", objectKey: "${event.objectKey}" }\n'
    '    dedupe: "${event.modelId}"'
)
MESSAGE = (
    "  - name: from-queue\n    type: message\n    event: model-ingest-context@1\n"
    "    queue: {queue}\n"
    '    context: { modelId: "${event.modelId}" }\n    dedupe: "${event.modelId}"'
)


def plan(
    triggers: str, budgets: str = "", *, name: str = "triggered", extra: str = "", queue: str = ""
) -> Plan:
    text = WORKFLOW.format(
        name=name,
        queue=queue or f"q-{uuid.uuid4().hex[:8]}",
        triggers=triggers,
        budgets=budgets,
    )
    text += extra
    return compile_workflow(text, "triggered.yaml", CATALOG).unwrap()


Opener = Callable[[Clock, str], Engine]


def sqlite_opener(tmp: Path) -> Opener:
    url = f"sqlite:///{tmp / 'triggers.db'}"

    def open_(clock: Clock, owner: str) -> Engine:
        return Engine(
            open_store(url, clock=clock),
            open_transport(url, clock=clock),
            clock,
            EngineOptions(owner=owner),
            catalog=CATALOG,
            owns_ports=True,
        )

    return open_


def redis_opener(_tmp: Path) -> Opener:
    ensure_redis()
    url = redis_url()
    prefix = f"bq{uuid.uuid4().hex[:10]}"

    def open_(clock: Clock, owner: str) -> Engine:
        return Engine(
            open_store(url, clock=clock),
            open_transport(f"bullmq://127.0.0.1:6379/15?prefix={prefix}", clock=clock),
            clock,
            EngineOptions(owner=owner),
            catalog=CATALOG,
            owns_ports=True,
        )

    return open_


OPENERS: dict[str, Callable[[Path], Opener]] = {"embedded": sqlite_opener, "redis": redis_opener}


@asynccontextmanager
async def engines(
    opener: Opener, clock: Clock, p: Plan, count: int = 2
) -> AsyncIterator[list[Engine]]:
    opened = [opener(clock, f"engine-{i}") for i in range(count)]
    try:
        await opened[0].register_plan(p)
        for e in opened:  # the one capability the plan needs, live for a day
            await e.announce("worker-1", ["metadata.extract@2"], 86_400_000)
        yield opened
    finally:
        for e in opened:
            await e.stop()


def live(states: list[Any]) -> list[Any]:
    return [s for s in states if s is not None and not s.terminal]
