"""Publication decisions for the contract registry, separate from the files that record them.

An **artefact** is the immutable record of one published version: the canonical contract, its
JSON Schema 2020-12 export (message contracts), and its digest. Identity is ``kind name@version``
and content identity is the digest of the canonical contract, so publishing is a pure decision
over (sources, already-published artefacts):

- a version not yet published is **new** — unless it is ``planned`` (never published as
  runnable; reported as skipped) or the compatibility check refuses it;
- a version published with the *same* digest is **unchanged** (a no-op, even if the JSON Schema
  exporter has since improved: the artefact records what was published);
- a version published with a *different* digest is a **conflict**: the whole publication is
  refused with :class:`~accord.errors.ImmutableArtefactError` and nothing is written.

Compatibility: each new message version is checked by :func:`accord.contracts.compat.check_publish`
against the previous version of the same name (published or published in the same batch), or
against every earlier retained version when the contract is ``transitive``.

Retention: a version may be retired only when it is deprecated, its ``supportUntil`` plus the
queue retention plus the longest accepted run lifetime has passed, and no retained capability
still names it. :func:`retirement_refusal` decides; the caller supplies the clock.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from accord.contracts.canonical import contract_digest, from_canonical, to_canonical
from accord.contracts.dsl import contract_key
from accord.contracts.model import CapabilityContract, Contract, MessageContract
from accord.errors import ContractError, Diagnostic

__all__ = [
    "ARTEFACT_FORMAT",
    "CompatCheck",
    "Publication",
    "RetentionPolicy",
    "artefact_document",
    "artefact_path",
    "contract_from_artefact",
    "index_document",
    "plan_publication",
    "retirement_refusal",
]

ARTEFACT_FORMAT = 1
CompatCheck = Callable[[Sequence[MessageContract], MessageContract], list[Diagnostic]]
Key = tuple[str, str, int]


def artefact_path(contract: Contract) -> str:
    """Relative path of an artefact: ``<name>/<version>.json`` (names never collide: messages
    and policies are hyphenated, capabilities dotted; a policy and a message may not share one)."""
    return f"{contract.name}/{contract.version}.json"


def artefact_document(contract: Contract, schema: Mapping[str, Any] | None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": ARTEFACT_FORMAT,
        "kind": contract.kind,
        "name": contract.name,
        "version": contract.version,
        "digest": contract_digest(contract),
        "contract": to_canonical(contract),
    }
    if schema is not None:
        doc["jsonSchema"] = dict(schema)
    return doc


def contract_from_artefact(doc: Mapping[str, Any], where: str) -> Contract:
    """The contract recorded in an artefact, after checking that its digest still matches."""
    try:
        contract = from_canonical(doc["contract"])
        stored = doc["digest"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ContractError(f"{where}: not a contract artefact ({exc})") from exc
    if contract_digest(contract) != stored:
        raise ContractError(f"{where}: artefact digest {stored} does not match its contract")
    return contract


def index_document(published: Iterable[Contract]) -> dict[str, Any]:
    entries = [
        {
            "kind": c.kind,
            "name": c.name,
            "version": c.version,
            "status": c.status,
            "digest": contract_digest(c),
            "path": artefact_path(c),
            **({"supportUntil": c.support_until} if c.support_until else {}),
        }
        for c in sorted(published, key=contract_key)
    ]
    return {"format": ARTEFACT_FORMAT, "contracts": entries}


@dataclass(frozen=True)
class Publication:
    """What publishing would do; ``refusals`` non-empty means nothing may be written."""

    new: tuple[Contract, ...] = ()
    unchanged: tuple[Contract, ...] = ()
    skipped: tuple[Contract, ...] = ()  # planned: never published as runnable
    conflicts: tuple[str, ...] = ()  # immutability violations, one message each
    incompatible: tuple[Diagnostic, ...] = ()
    warnings: tuple[Diagnostic, ...] = ()  # compatibility findings that do not refuse
    resulting: tuple[Contract, ...] = field(default=(), repr=False)  # registry after publishing

    @property
    def refused(self) -> bool:
        return bool(self.conflicts or self.incompatible)


def plan_publication(
    sources: Iterable[Contract], published: Iterable[Contract], check: CompatCheck
) -> Publication:
    """Decide, for every source contract, whether publishing it is new, a no-op or refused."""
    registry: dict[Key, Contract] = {contract_key(c): c for c in published}
    result: dict[Key, Contract] = dict(registry)
    new: list[Contract] = []
    unchanged: list[Contract] = []
    skipped: list[Contract] = []
    conflicts: list[str] = []
    for contract in sorted(sources, key=contract_key):
        key = contract_key(contract)
        existing = registry.get(key)
        if existing is not None:
            if contract_digest(existing) == contract_digest(contract):
                unchanged.append(contract)
            else:
                conflicts.append(
                    f"{contract.kind} {contract.name}@{contract.version} is already published "
                    f"with digest {contract_digest(existing)}; this source has "
                    f"{contract_digest(contract)}. Published versions are immutable: publish "
                    f"the change as version {_next_version(result, key)} instead"
                )
        elif contract.status == "planned":
            skipped.append(contract)
        else:
            new.append(contract)
            result[key] = contract
    findings: list[Diagnostic] = []
    for contract in new:
        if isinstance(contract, MessageContract):
            findings += check(_previous(result, contract), contract)
    return Publication(
        new=tuple(new),
        unchanged=tuple(unchanged),
        skipped=tuple(skipped),
        conflicts=tuple(conflicts),
        incompatible=tuple(d for d in findings if d.severity == "error"),
        warnings=tuple(d for d in findings if d.severity != "error"),
        resulting=tuple(sorted(result.values(), key=contract_key)),
    )


def _next_version(known: Mapping[Key, Contract], key: Key) -> int:
    return 1 + max(v for (cat, name, v) in known if (cat, name) == key[:2])


def _previous(known: Mapping[Key, Contract], contract: MessageContract) -> list[MessageContract]:
    earlier = sorted(
        (
            c
            for (cat, name, v), c in known.items()
            if cat == "message" and name == contract.name and v < contract.version
        ),
        key=lambda c: c.version,
    )
    # the gate itself picks the latest one or, for a transitive contract, every one
    return [c for c in earlier if isinstance(c, MessageContract)]


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How long a version must outlive the end of its support before it may be deleted."""

    queue_retention: dt.timedelta = dt.timedelta(days=14)
    longest_run_lifetime: dt.timedelta = dt.timedelta(days=30)

    def window(self) -> dt.timedelta:
        return self.queue_retention + self.longest_run_lifetime


def retirement_refusal(
    contract: Contract, retained: Iterable[Contract], now: dt.datetime, policy: RetentionPolicy
) -> str | None:
    """Why ``contract`` may not be deleted yet, or ``None`` when it may be."""
    label = f"{contract.kind} {contract.name}@{contract.version}"
    if contract.status != "deprecated" or contract.support_until is None:
        return f"{label} is {contract.status}; only a deprecated version may be retired"
    # supportUntil is inclusive: the version is supported through that whole (UTC) day
    last_day = dt.date.fromisoformat(contract.support_until)
    support_end = dt.datetime.combine(last_day + dt.timedelta(days=1), dt.time(0), tzinfo=dt.UTC)
    earliest = support_end + policy.window()
    if now < earliest:
        return (
            f"{label} is inside its retention window until {earliest.isoformat()} "
            f"(supportUntil {contract.support_until} + queue retention "
            f"{policy.queue_retention} + longest run lifetime {policy.longest_run_lifetime})"
        )
    if isinstance(contract, MessageContract):
        users = [
            f"{c.name}@{c.version}"
            for c in retained
            if isinstance(c, CapabilityContract) and contract.ref in (c.request, c.result)
        ]
        if users:
            return f"{label} is still named by retained capabilities: {', '.join(users)}"
    return None
