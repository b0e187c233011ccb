"""The ``accord`` command: thin typer commands over the packages.

Exit codes everywhere: 0 ok, 1 the input is refused (lint error, incompatible change, invalid
message, refused plan), 2 usage error. Every command that reports takes ``--json``; with it,
every outcome (refusals and usage errors included) is one JSON document on stdout.
"""

from __future__ import annotations

import typer

from accord.cli import (
    alerts,
    contracts,
    dead_letters,
    demo,
    dev,
    doctor,
    engine,
    events,
    keys,
    migration,  # noqa: F401 - registers migrate, migration-plan, shadow, canary, promote, abort
    objects,
    policy,
    quarantine,
    runs,
    serve,
    store,
    telemetry,
    triggers,
    worker,
    workflow,
)
from accord.cli._common import AccordGroup

app = typer.Typer(
    cls=AccordGroup,
    name="accord",
    help="Governed contracts, compiled workflows and a durable engine for worker fleets.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(contracts.app, name="contracts")
app.add_typer(workflow.app, name="workflow")
app.add_typer(engine.app, name="engine")
app.add_typer(runs.app, name="runs")
app.add_typer(worker.app, name="worker")
app.add_typer(quarantine.app, name="quarantine")
app.add_typer(dead_letters.app, name="dead-letters")
app.add_typer(events.app, name="events")
app.add_typer(keys.app, name="keys")
app.add_typer(store.app, name="store")
app.add_typer(triggers.app, name="triggers")
app.add_typer(policy.app, name="policy")
app.add_typer(objects.app, name="objects")
app.add_typer(telemetry.app, name="telemetry")
app.add_typer(alerts.app, name="alerts")
app.add_typer(dev.app, name="dev")
app.command("demo")(demo.demo)
app.command("serve")(serve.serve)
app.command("doctor")(doctor.doctor)


def main() -> None:
    app()
