"""`accord triggers`: read and steer the triggers of a workflow's active plan.

``list`` shows every trigger of the plan (schedules with their state and next ticks), ``next``
the next fire times of one schedule, ``pause`` / ``resume`` one schedule (durably, in the
store every engine reads: a paused schedule fires nothing on any engine; resuming does not
catch up the ticks that fell in the pause), ``fires`` a schedule's fire records. A workflow
without an active plan, or a trigger it does not declare, is refused with exit 1; a store that
cannot be opened is exit 2. ``--json`` prints one JSON document in every outcome.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import typer

from accord.adapters import open_store
from accord.adapters.clock import SystemClock
from accord.cli._common import EXIT_OK, EXIT_USAGE, console, emit_json, refuse
from accord.engine.ports import Store
from accord.engine.runtime.plans import PlanBook
from accord.engine.runtime.schedules import (
    fire_records,
    next_fire_times,
    set_paused,
    trigger_summary,
)
from accord.errors import EngineError, StoreError
from accord.workflow.plan import Plan
from accord.workflow.triggers import ScheduleTrigger

app = typer.Typer(
    help="List, pause, resume and preview a workflow's triggers.", no_args_is_help=True
)

T = TypeVar("T")
StoreOpt = Annotated[str, typer.Option("--store", help="store URL, e.g. sqlite:///accord.db")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document")]
WorkflowArg = Annotated[str, typer.Argument(help="workflow name")]
TriggerArg = Annotated[str, typer.Argument(help="trigger name")]


class _Refused(Exception):
    pass


def _with_store(url: str, body: Callable[[Store], Awaitable[T]], as_json: bool) -> T:
    async def go() -> T:
        try:
            store = open_store(url)
        except (ValueError, OSError) as exc:
            refuse(f"cannot open store {url!r}: {exc}", EXIT_USAGE, as_json=as_json)
        try:
            return await body(store)
        finally:
            await store.close()

    try:
        return asyncio.run(go())
    except StoreError as exc:
        refuse(f"store {url!r}: {str(exc).splitlines()[0]}", EXIT_USAGE, as_json=as_json)
    except _Refused as exc:
        refuse(str(exc), as_json=as_json)


async def _plan(store: Store, workflow: str) -> Plan:
    try:
        return await PlanBook(store).resolve(workflow)
    except EngineError as exc:
        raise _Refused(str(exc)) from None


async def _schedule(store: Store, workflow: str, trigger: str) -> tuple[Plan, ScheduleTrigger]:
    plan = await _plan(store, workflow)
    t = plan.trigger(trigger)
    if not isinstance(t, ScheduleTrigger):
        names = ", ".join(x.name for x in plan.triggers if isinstance(x, ScheduleTrigger))
        raise _Refused(
            f"{plan.name} has no schedule trigger {trigger!r} (schedules: {names or 'none'})"
        )
    return plan, t


def _now() -> int:
    return SystemClock().now_ms()


def _done(report: dict[str, Any], as_json: bool, lines: list[str]) -> None:
    if as_json:
        emit_json(report)
    else:
        for line in lines:
            console.print(line, markup=False, soft_wrap=True)
    raise typer.Exit(EXIT_OK)


@app.command("list")
def list_(workflow: WorkflowArg, store: StoreOpt, as_json: JsonOpt = False) -> None:
    """Every trigger of the workflow's active plan; schedules with state and next ticks."""

    async def body(s: Store) -> tuple[Plan, list[Any]]:
        plan = await _plan(s, workflow)
        return plan, await trigger_summary(s, plan, _now(), 5)

    plan, items = _with_store(store, body, as_json)
    lines = [f"{plan.name} {plan.version} ({plan.digest}): {len(items)} trigger(s)"]
    for t in items:
        if t["type"] == "schedule":
            state = "paused" if t["paused"] else "active"
            nxt = t["next"][0]["local"] if t["next"] else "-"
            lines.append(
                f"  {t['name']}  schedule {t['cron']!r} {t['timezone']}  {state}  "
                f"overlap {t['overlap']}  catch_up {t['catch_up']}  next {nxt}"
            )
        elif t["type"] == "webhook":
            lines.append(f"  {t['name']}  webhook  source {t['source']}  event {t['event']}")
        else:
            lines.append(f"  {t['name']}  message  queue {t['queue']}  event {t['event']}")
    _done(
        {"ok": True, "workflow": plan.name, "digest": plan.digest, "triggers": items},
        as_json,
        lines,
    )


@app.command("next")
def next_(
    workflow: WorkflowArg,
    trigger: TriggerArg,
    store: StoreOpt,
    count: Annotated[int, typer.Option("--count", min=1, max=100)] = 5,
    as_json: JsonOpt = False,
) -> None:
    """The next fire times of a schedule (local to its timezone, and UTC)."""

    async def body(s: Store) -> tuple[Plan, ScheduleTrigger]:
        return await _schedule(s, workflow, trigger)

    plan, t = _with_store(store, body, as_json)
    ticks = next_fire_times(t, _now(), count)
    lines = [f"{t.name} ({t.cron!r} in {t.timezone}):"]
    lines += [f"  {x['local']}  ({x['utc']})" for x in ticks]
    _done({"ok": True, "workflow": plan.name, "trigger": t.name, "next": ticks}, as_json, lines)


def _set(workflow: str, trigger: str, store: str, paused: bool, as_json: bool) -> None:
    async def body(s: Store) -> Any:
        plan, t = await _schedule(s, workflow, trigger)
        return plan, await set_paused(s, plan.name, t.name, paused, _now())

    plan, state = _with_store(store, body, as_json)
    word = "paused" if paused else "resumed"
    _done(
        {"ok": True, "workflow": plan.name, "trigger": trigger, "state": state},
        as_json,
        [f"{plan.name}/{trigger} {word}"],
    )


@app.command()
def pause(
    workflow: WorkflowArg, trigger: TriggerArg, store: StoreOpt, as_json: JsonOpt = False
) -> None:
    """Pause a schedule on every engine."""
    _set(workflow, trigger, store, True, as_json)


@app.command()
def resume(
    workflow: WorkflowArg, trigger: TriggerArg, store: StoreOpt, as_json: JsonOpt = False
) -> None:
    """Resume a paused schedule from now (the ticks of the pause are not caught up)."""
    _set(workflow, trigger, store, False, as_json)


@app.command()
def fires(
    workflow: WorkflowArg,
    trigger: TriggerArg,
    store: StoreOpt,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000)] = 100,
    as_json: JsonOpt = False,
) -> None:
    """A schedule's fire records: what fired, when, and the run it started or why none."""

    async def body(s: Store) -> Any:
        plan, t = await _schedule(s, workflow, trigger)
        return plan, await fire_records(s, plan.name, t.name, limit)

    plan, records = _with_store(store, body, as_json)
    lines = [
        f"  {r['nominal']}  {r['decision']:<8} {r.get('runId') or '-'}  {r.get('reason') or ''}"
        for r in records
    ]
    _done(
        {"ok": True, "workflow": plan.name, "trigger": trigger, "fires": records},
        as_json,
        [f"{plan.name}/{trigger}: {len(records)} fire record(s)", *lines],
    )
