"""What every contract document shares: names, references, owner, lifecycle, change record.

The constants here are the DSL's grammar (closed key sets per kind, naming rules, statuses); the
functions read the keys common to all kinds. ``deprecated`` needs ``supportUntil``; ``planned``
needs ``reviewDate`` and ``promotionCriteria`` so that it fails closed at admission; change
record versions increase and never exceed the contract's own version.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from accord.contracts.dsl.reader import ContractReader
from accord.contracts.model import ChangeRecord
from accord.contracts.yamlsource import Node
from accord.errors import Location

__all__ = [
    "CAPABILITY_NAME",
    "CODE",
    "CONTRACT_NAME",
    "IDEMPOTENCY",
    "KEYS",
    "REF",
    "REQUIRED",
    "STATUSES",
    "Reference",
    "check_changes",
    "parse_changes",
    "parse_common",
    "parse_date",
]

CONTRACT_NAME = r"^[a-z][a-z0-9-]*$"
CAPABILITY_NAME = r"^[a-z][a-z0-9-]*(\.[a-z][a-z0-9-]*)+$"
REF = r"^[a-z][a-z0-9-]*@[1-9][0-9]*$"
CODE = r"^[a-z][a-z0-9-]*$"
_LIFECYCLE = ("status", "description", "supportUntil", "reviewDate", "promotionCriteria", "changes")
_BASE = ("kind", "name", "owner", *_LIFECYCLE)
KEYS = {
    "message": (
        *_BASE,
        "wireVersion",
        "payload",
        "outcomes",
        "reserved",
        "tolerates",
        "compatibility",
        "transitive",
        "maxBytes",
    ),
    "worker": (
        *_BASE,
        "version",
        "request",
        "result",
        "errors",
        "queue",
        "limits",
        "idempotency",
        "cacheable",
    ),
    "policy": (*_BASE, "version", "rules", "appliesTo"),
}
KEYS["action"] = KEYS["worker"]
REQUIRED = {
    "message": ("wireVersion", "payload"),
    "worker": ("version", "request", "result", "queue"),
    "action": ("version", "request", "result"),
    "policy": ("version", "rules"),
}
STATUSES = ("planned", "active", "deprecated")
IDEMPOTENCY = ("idempotency-key", "natural-key", "read-only")


@dataclass(frozen=True, slots=True)
class Reference:
    """A reference to a message contract by ``name@version`` (or bare ``name`` for outcomes)."""

    target: str
    location: Location
    path: str


def parse_common(reader: ContractReader, e: dict[str, Node], kind: str) -> dict[str, Any]:
    rule = CAPABILITY_NAME if kind in ("worker", "action") else CONTRACT_NAME
    out: dict[str, Any] = {
        "name": reader.text(e["name"], "name", rule, f"the {kind} name rule {rule}")
        if "name" in e
        else None,
        "owner": reader.text(e["owner"], "owner", CONTRACT_NAME, f"the owner rule {CONTRACT_NAME}")
        if "owner" in e
        else None,
    }
    status = "active"
    if "status" in e:
        status = reader.scalar(e["status"], "status", str) or "active"
        if status not in STATUSES:
            reader.error(
                "dsl-bad-status",
                f"status must be one of {', '.join(STATUSES)}",
                e["status"].location,
                "status",
            )
    out["status"] = status
    if "description" in e:
        out["description"] = reader.scalar(e["description"], "description", str)
    for key, attr in (("supportUntil", "support_until"), ("reviewDate", "review_date")):
        if key in e:
            out[attr] = parse_date(reader, e[key], key)
    if "promotionCriteria" in e:
        out["promotion_criteria"] = reader.scalar(e["promotionCriteria"], "promotionCriteria", str)
    if status == "deprecated" and "supportUntil" not in e:
        reader.error(
            "dsl-lifecycle",
            "a deprecated contract needs 'supportUntil'",
            e["status"].location,
            "supportUntil",
        )
    if status == "planned":
        for key in ("reviewDate", "promotionCriteria"):
            if key not in e:
                reader.error(
                    "dsl-lifecycle",
                    f"a planned contract needs {key!r} (fails closed)",
                    e["status"].location,
                    key,
                )
    if "changes" in e:
        out["changes"] = parse_changes(reader, e["changes"])
    return out


def parse_date(reader: ContractReader, node: Node, path: str) -> str | None:
    text = reader.scalar(node, path, str)
    if text is None:
        return None
    try:
        return dt.date.fromisoformat(text).isoformat()
    except ValueError:
        reader.error(
            "dsl-bad-date", f"{path} must be a date YYYY-MM-DD, got {text!r}", node.location, path
        )
        return None


def parse_changes(reader: ContractReader, node: Node) -> tuple[ChangeRecord, ...]:
    if node.kind != "seq":
        reader.error("dsl-wrong-type", "changes must be a list", node.location, "changes")
        return ()
    out: list[ChangeRecord] = []
    for index, item in enumerate(node.items):
        path = f"changes[{index}]"
        e = reader.mapping(
            item, path, ("version", "summary", "acknowledges", "reviewedBy"), ("version", "summary")
        )
        if not e or "version" not in e or "summary" not in e:
            continue
        version = reader.positive_int(e["version"], f"{path}.version")
        summary = reader.scalar(e["summary"], f"{path}.summary", str)
        acks = (
            reader.texts(e["acknowledges"], f"{path}.acknowledges") if "acknowledges" in e else []
        )
        who = reader.texts(e["reviewedBy"], f"{path}.reviewedBy") if "reviewedBy" in e else []
        if version is not None and out and version <= out[-1].version:
            reader.error(
                "dsl-change-record",
                "change record versions must increase",
                e["version"].location,
                f"{path}.version",
            )
        if version is not None and summary is not None:
            out.append(
                ChangeRecord(
                    version,
                    summary,
                    tuple(a for a, _ in acks or ()),
                    tuple(w for w, _ in who or ()),
                )
            )
    return tuple(out)


def check_changes(
    reader: ContractReader, common: dict[str, Any], version: int | None, node: Node | None
) -> None:
    records: tuple[ChangeRecord, ...] = common.get("changes", ())
    if version is not None and node is not None and any(c.version > version for c in records):
        reader.error(
            "dsl-change-record",
            f"a change record names a version above {version}",
            node.location,
            "changes",
        )
