"""Where the contract commands find things, and how they show them.

``accord contracts …`` runs from anywhere inside the repository: the root is the nearest
directory above the working directory holding ``schemas/`` or ``pyproject.toml``. A contract
argument is either a source file path or ``name@version``; a reference is looked up among the
published artefacts first (they are the authority once published) and then among the sources.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from rich.table import Table

from accord.adapters.artefacts import ArtefactStore
from accord.cli._common import EXIT_REFUSED, console, refuse
from accord.contracts.catalog import Catalog
from accord.contracts.compat import DiffReport
from accord.contracts.model import Contract, ContractRef
from accord.contracts.sources import ARTEFACTS_DIR, SOURCES_DIR, find_root, lint_paths, load_file
from accord.errors import Diagnostic

__all__ = ["Workspace", "print_report", "refused_json", "workspace"]


@dataclass(frozen=True)
class Workspace:
    root: Path

    @property
    def sources(self) -> Path:
        return self.root / SOURCES_DIR

    @property
    def store(self) -> ArtefactStore:
        return ArtefactStore(self.root / ARTEFACTS_DIR)

    def source_catalog(self) -> Catalog:
        """Sources that lint cleanly on their own (a broken file does not hide the others)."""
        contracts, _ = lint_paths([self.sources]) if self.sources.is_dir() else ([], [])
        return Catalog(contracts)

    def published_catalog(self) -> Catalog:
        return Catalog(self.store.published())

    def resolve(self, spec: str) -> Contract:
        """A file path or ``name@version``; raises ``LookupError`` when nothing matches."""
        path = Path(spec)
        if path.suffix in (".yaml", ".yml") or path.is_file():
            if not path.is_file():
                raise LookupError(f"no such contract file: {spec}")
            return load_file(path)
        try:
            ref = ContractRef.parse(spec)
        except ValueError as exc:
            raise LookupError(str(exc)) from exc
        for catalog in (self.published_catalog(), self.source_catalog()):
            for kind in ("message", "capability", "policy"):
                found = catalog.get(kind, ref)
                if found is not None:
                    return found
        raise LookupError(f"{spec} is neither published nor among the sources in {self.sources}")

    def versions(self, name: str) -> list[Contract]:
        """Every known version of ``name``: published ones, then unpublished sources."""
        seen: dict[tuple[str, int], Contract] = {}
        for catalog in (self.published_catalog(), self.source_catalog()):
            for contract in catalog:
                if contract.name == name:
                    seen.setdefault((contract.kind, contract.version), contract)
        return sorted(seen.values(), key=lambda c: c.version)


def workspace(start: Path | None = None) -> Workspace:
    return Workspace(find_root(start))


def print_report(report: DiffReport) -> None:
    """One table row per classified change."""
    table = Table(title=f"{report.old} → {report.new}")
    for column in ("change", "path", "backward", "forward", "action"):
        table.add_column(column, overflow="fold")
    for c in report.changes:
        table.add_row(
            c.code, c.path, "✓" if c.backward else "✗", "✓" if c.forward else "✗", c.action
        )
    console.print(table)


def refused_json(json: bool, message: str, diagnostics: Iterable[Diagnostic]) -> NoReturn:
    """Report a refusal (as JSON or text) and exit 1 (:func:`~accord.cli._common.refuse`)."""
    refuse(message, EXIT_REFUSED, diagnostics=diagnostics, as_json=json)
