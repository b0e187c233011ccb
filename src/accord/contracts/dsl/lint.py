"""Contract sources as text in, frozen, meta-validated contracts out: per file and per set.

Pipeline, per file: :func:`~accord.contracts.yamlsource.compose` keeps a location for every node;
:func:`~accord.contracts.dsl.kinds.parse_document` checks the shape of the document (closed key
sets, names, owner, lifecycle) and :mod:`~accord.contracts.dsl.fields` the payload fields
(constraints that fit the type, defaults that satisfy their own field). Across a set of files,
:func:`lint_sources` adds the rules that need every contract at once: no ``name@version`` defined
twice, and every ``request``/``result``/``outcomes``/``appliesTo`` reference resolves to a message
contract in the set (an active contract may not depend on a planned one).

Pure on text: reading the files is :mod:`accord.contracts.dsl.files`, which calls this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from accord.contracts.dsl.kinds import Reference, parse_document
from accord.contracts.dsl.reader import ContractReader
from accord.contracts.model import Contract
from accord.contracts.yamlsource import compose
from accord.errors import ContractLintError, Diagnostic, Location

__all__ = ["contract_key", "lint_sources", "lint_text", "parse_sources", "parse_text"]


def contract_key(contract: Contract) -> tuple[str, str, int]:
    """Identity of a contract in a set: (category, name, version); categories never collide."""
    category = "capability" if contract.kind in ("worker", "action") else contract.kind
    return category, contract.name, contract.version


def lint_text(text: str, filename: str) -> tuple[Contract | None, list[Diagnostic]]:
    """One file on its own: the contract (``None`` when refused) and every finding."""
    contract, diagnostics, _ = _lint_one(text, filename)
    return contract, sorted(diagnostics, key=_order)


def parse_text(text: str, filename: str) -> Contract:
    """One file on its own; raises :class:`ContractLintError` carrying every finding."""
    contract, diagnostics = lint_text(text, filename)
    if contract is None or _errors(diagnostics):
        raise ContractLintError(diagnostics, f"{filename}: contract refused")
    return contract


def lint_sources(sources: Mapping[str, str]) -> tuple[list[Contract], list[Diagnostic]]:
    """A set of files (name → text): the contracts that parsed and every finding, cross-file too.

    Contracts are returned sorted by identity, so the result does not depend on file order.
    """
    parsed: list[tuple[Contract, list[Reference]]] = []
    diagnostics: list[Diagnostic] = []
    for filename in sorted(sources):
        contract, found, refs = _lint_one(sources[filename], filename)
        diagnostics += found
        if contract is not None:
            parsed.append((contract, refs))
    diagnostics += _cross_check(parsed)
    diagnostics.sort(key=_order)
    contracts = sorted((c for c, _ in parsed), key=contract_key)
    return contracts, diagnostics


def parse_sources(sources: Mapping[str, str]) -> list[Contract]:
    """Like :func:`lint_sources`, but raises :class:`ContractLintError` on any error."""
    contracts, diagnostics = lint_sources(sources)
    if _errors(diagnostics):
        raise ContractLintError(diagnostics, f"{len(_errors(diagnostics))} contract error(s)")
    return contracts


def _order(d: Diagnostic) -> tuple[str, int, int, str, str]:
    loc = d.location
    return (loc.file, loc.line, loc.column, d.code, d.path) if loc else ("", 0, 0, d.code, d.path)


def _errors(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    return [d for d in diagnostics if d.severity == "error"]


def _lint_one(
    text: str, filename: str
) -> tuple[Contract | None, list[Diagnostic], list[Reference]]:
    root, diagnostics = compose(text, filename)
    if root is None:
        return None, diagnostics, []
    reader = ContractReader()
    contract, refs = parse_document(reader, root, source=Location(filename, 1, 1))
    diagnostics = diagnostics + reader.diagnostics
    if diagnostics:
        return None, diagnostics, refs
    return contract, diagnostics, refs


def _cross_check(parsed: list[tuple[Contract, list[Reference]]]) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    seen: dict[tuple[str, str, int], Contract] = {}
    names: dict[str, str] = {}
    messages: dict[str, dict[int, Contract]] = {}
    for contract, _ in parsed:
        key = contract_key(contract)
        if key in seen:
            out.append(
                Diagnostic(
                    "ref-duplicate-contract",
                    f"{contract.kind} {contract.name}@{contract.version} is also defined in "
                    f"{seen[key].source}",
                    contract.source,
                    "name",
                )
            )
            continue
        seen[key] = contract
        clash = names.setdefault(contract.name, key[0])
        if clash != key[0]:
            out.append(
                Diagnostic(
                    "ref-name-clash",
                    f"{contract.name!r} already names a {clash} contract; artefacts share one "
                    f"directory per name",
                    contract.source,
                    "name",
                )
            )
        if contract.kind == "message":
            messages.setdefault(contract.name, {})[contract.version] = contract
    for contract, refs in parsed:
        for ref in refs:
            out += _resolve(contract, ref, messages)
    return out


def _resolve(
    owner: Contract, ref: Reference, messages: Mapping[str, Mapping[int, Contract]]
) -> list[Diagnostic]:
    name, _, version = ref.target.partition("@")
    versions = messages.get(name, {})
    if version:
        target = versions.get(int(version))
        if target is None:
            known = ", ".join(f"{name}@{v}" for v in sorted(versions)) or "no version of it"
            return [
                Diagnostic(
                    "ref-unresolved",
                    f"{ref.target} is not a message contract in this set ({known})",
                    ref.location,
                    ref.path,
                )
            ]
        targets = [target]
    elif not versions:
        return [
            Diagnostic(
                "ref-unresolved",
                f"no message contract named {name!r} in this set",
                ref.location,
                ref.path,
            )
        ]
    else:
        targets = list(versions.values())
    if owner.status != "planned" and all(t.status == "planned" for t in targets):
        return [
            Diagnostic(
                "ref-planned",
                f"{owner.status} {owner.name}@{owner.version} depends on planned "
                f"{ref.target}; planned contracts fail closed",
                ref.location,
                ref.path,
            )
        ]
    return []
