"""`accord policy refresh|show`: mutable marketplace policy, versioned apart from every contract.

``refresh etsy --from FILE`` reads a YAML or JSON mapping of listing limits, checks it against the
shape contract ``etsy-listing-limits@1`` (every failing field named with its path), and writes it
as the next immutable revision of ``marketplace-listing-limits`` for Etsy::

    <policies>/etsy/marketplace-listing-limits/<revision>.json   one per revision, never rewritten
    <policies>/etsy/marketplace-listing-limits/current.json      what publications use

Each revision records its version (``marketplace-listing-limits/etsy@<n>``), the sha256 digest of
its rules, when it was refreshed and from which file. Refreshing with rules equal to the current
ones writes nothing (``unchanged``). No contract changes: publications record which revision they
were checked against, so a verdict can always be traced to the values that produced it.
``show etsy`` prints the current revision. Both take ``--json``.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from accord._files import atomic_write
from accord.canonical import digest_of
from accord.cli._common import console, emit_json, refuse, usage
from accord.contracts.sources import load_catalog
from accord.contracts.validate import Validator
from accord.errors import AccordError, Diagnostic, Location

__all__ = ["POLICY", "app", "current", "refresh_policy"]

app = typer.Typer(help="Refresh and show marketplace policy artefacts.", no_args_is_help=True)

POLICY = "marketplace-listing-limits"
SHAPES = {"etsy": "etsy-listing-limits@1"}  # marketplace -> the contract of its policy's shape

PoliciesOpt = Annotated[
    Path,
    typer.Option("--policies", envvar="ACCORD_POLICIES", help="policy artefact folder"),
]
ContractsOpt = Annotated[Path, typer.Option("--contracts", help="contract sources")]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]


def _folder(policies: Path, marketplace: str) -> Path:
    return policies / marketplace / POLICY


def current(policies: Path, marketplace: str) -> dict[str, Any] | None:
    path = _folder(policies, marketplace) / "current.json"
    if not path.is_file():
        return None
    doc: dict[str, Any] = json.loads(path.read_text("utf-8"))
    return doc


def _read(source: Path) -> Any:
    if not source.is_file():
        refuse(f"{source}: no such file", diagnostics=[_diag("policy-file-missing", source, "")])
    try:
        return YAML(typ="safe").load(source.read_text("utf-8"))
    except MarkedYAMLError as exc:
        mark = exc.problem_mark
        loc = Location(str(source), mark.line + 1, mark.column + 1) if mark else None
        d = Diagnostic("policy-file-unreadable", str(exc.problem), loc)
        refuse(f"{source}: not YAML or JSON", diagnostics=[d])
    except (YAMLError, UnicodeDecodeError) as exc:
        d = _diag("policy-file-unreadable", source, "", str(exc))
        refuse(f"{source}: not YAML or JSON", diagnostics=[d])


def _diag(code: str, source: Path, path: str, message: str = "") -> Diagnostic:
    return Diagnostic(code, message or code, Location(str(source)), path)


def refresh_policy(
    marketplace: str, source: Path, policies: Path, contracts: Path
) -> tuple[dict[str, Any], bool]:
    """The revision now current and whether this call wrote it; refuses (exit 1) bad input."""
    if marketplace not in SHAPES:
        usage(f"no policy shape for marketplace {marketplace!r}; known: {', '.join(SHAPES)}")
    rules = _read(source)
    try:
        shape = load_catalog(contracts).message(SHAPES[marketplace])
    except AccordError as exc:
        refuse(f"{contracts}: {exc}")
    if shape is None:
        refuse(f"{contracts}: no contract {SHAPES[marketplace]}")
    verdict = Validator.for_contract(shape).validate(rules)
    if not verdict.ok:
        found = [_diag("policy-invalid", source, v.path, v.message) for v in verdict.violations]
        refuse(f"{source}: not a valid {SHAPES[marketplace]} document", diagnostics=found)
    value = dict(verdict.value or {})
    if value["priceMin"] > value["priceMax"]:
        d = _diag("policy-invalid", source, "priceMin", "priceMin is above priceMax")
        refuse(f"{source}: not a valid {SHAPES[marketplace]} document", diagnostics=[d])
    for key in ("titlePattern", "tagPattern"):
        try:
            re.compile(value[key])
        except re.error as exc:
            d = _diag("policy-invalid", source, key, f"not a regular expression: {exc}")
            refuse(f"{source}: not a valid {SHAPES[marketplace]} document", diagnostics=[d])
    digest = digest_of(value)
    now = current(policies, marketplace)
    if now is not None and now.get("digest") == digest:
        return now, False
    revision = 1 + int(now["revision"]) if now else 1
    doc = {
        "policy": POLICY,
        "marketplace": marketplace,
        "shape": SHAPES[marketplace],
        "revision": revision,
        "version": f"{POLICY}/{marketplace}@{revision}",
        "digest": digest,
        "rules": value,
        "refreshedAt": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "source": str(source),
    }
    folder = _folder(policies, marketplace)
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    target = folder / f"{revision}.json"
    if target.exists():
        refuse(f"{target}: revision {revision} exists already; refusing to rewrite it")
    atomic_write(target, text)
    atomic_write(folder / "current.json", text)
    return doc, True


@app.command("refresh")
def refresh(
    marketplace: Annotated[str, typer.Argument(help="the marketplace (etsy)")],
    source: Annotated[Path, typer.Option("--from", help="YAML or JSON file of policy values")],
    policies: PoliciesOpt = Path(".accord/policies"),
    contracts: ContractsOpt = Path("schemas/contracts"),
    json_out: JsonOpt = False,
) -> None:
    """Write the values in FILE as the next policy revision (nothing when they are unchanged)."""
    doc, written = refresh_policy(marketplace, source, policies, contracts)
    if json_out:
        emit_json({"ok": True, "written": written, **doc})
        return
    state = "written" if written else "unchanged"
    console.print(f"{doc['version']} {doc['digest']} {state}", soft_wrap=True)


@app.command("show")
def show(
    marketplace: Annotated[str, typer.Argument(help="the marketplace (etsy)")],
    policies: PoliciesOpt = Path(".accord/policies"),
    json_out: JsonOpt = False,
) -> None:
    """Print the current policy revision."""
    doc = current(policies, marketplace)
    if doc is None:
        refuse(f"no {POLICY} revision for {marketplace} under {policies}")
    if json_out:
        emit_json({"ok": True, **doc})
        return
    console.print(f"{doc['version']} {doc['digest']} (refreshed {doc['refreshedAt']})",
                  soft_wrap=True, markup=False)  # fmt: skip
    for key, value in sorted(doc["rules"].items()):
        console.print(f"  {key}: {value}", soft_wrap=True, markup=False)
