"""``accord objects``: the object store's administration.

``accord objects lifecycle apply --objects s3://bucket[/prefix]?endpoint=…`` puts the bucket
lifecycle rule that collects the stage-result cache's garbage: objects under ``<prefix>cache/``
expire ``--ttl-days`` + 1 days after they were written (S3 lifecycle is day-granular and runs
about once a day, so the rule only ever removes entries the read-time check already calls
``expired``; that check stays the authority). Other rules of the bucket are kept. ``show`` lists
the rules. Credentials come from the environment (``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY``), never the URL.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated

import typer

from accord.adapters.objects import open_object_store, redact_url
from accord.cli._common import EXIT_USAGE, console, emit_json, refuse
from accord.errors import StoreError

if TYPE_CHECKING:  # boto3 is the optional `s3` extra: imported only when an s3:// URL is opened
    from accord.adapters.objects.s3 import S3ObjectStore

app = typer.Typer(help="Object store administration (lifecycle rules).", no_args_is_help=True)
lifecycle = typer.Typer(help="The bucket lifecycle rule of the result cache.", no_args_is_help=True)
app.add_typer(lifecycle, name="lifecycle")

RULE_ID = "accord-cache-expiry"
ObjectsOpt = Annotated[str, typer.Option("--objects", help="s3://bucket\\[/prefix]?endpoint=…")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]


def _open(url: str) -> S3ObjectStore:
    try:
        store = open_object_store(url)
    except ValueError as exc:
        refuse(f"--objects: {exc}", EXIT_USAGE)
    if not hasattr(store, "apply_expiry_rule"):
        store.close()
        refuse(f"--objects {redact_url(url)}: a directory has no lifecycle rules; the cache's "
               "read-time expiry check is all it needs", EXIT_USAGE)  # fmt: skip
    return store  # type: ignore[return-value]  # an S3ObjectStore: it has lifecycle rules


@lifecycle.command("apply")
def apply(
    objects: ObjectsOpt,
    ttl_days: Annotated[
        float, typer.Option("--ttl-days", help="The cache's TTL in days (default 7).")
    ] = 7.0,
    json_out: JsonOpt = False,
) -> None:
    """Put the rule expiring ``cache/`` objects a day after the cache's TTL."""
    if not 0 < ttl_days <= 36_500:
        refuse("--ttl-days: must be more than 0 and at most 36500", EXIT_USAGE)
    store = _open(objects)
    days = math.ceil(ttl_days) + 1
    try:
        rule = store.apply_expiry_rule(RULE_ID, "cache/", days)
        rules = store.lifecycle_rules()
    except StoreError as exc:
        refuse(f"lifecycle apply on {store.url}: {exc}")
    finally:
        store.close()
    report = {"ok": True, "store": store.url, "rule": rule, "rules": len(rules)}
    if json_out:
        emit_json(report)
        return
    console.print(f"rule {RULE_ID} on {store.url}: objects under "
                  f"{rule['Filter']['Prefix']!r} expire after {days} days "
                  f"({len(rules)} rule(s) in the bucket)")  # fmt: skip


@lifecycle.command("show")
def show(objects: ObjectsOpt, json_out: JsonOpt = False) -> None:
    """List the bucket's lifecycle rules."""
    store = _open(objects)
    try:
        rules = store.lifecycle_rules()
    except StoreError as exc:
        refuse(f"lifecycle show on {store.url}: {exc}")
    finally:
        store.close()
    if json_out:
        emit_json({"ok": True, "store": store.url, "rules": rules})
        return
    for rule in rules:
        console.print(f"{rule.get('ID')}: {rule.get('Filter')} → {rule.get('Expiration')}")
    if not rules:
        console.print("no lifecycle rules")
