"""Contracts as the API shows them: published artefacts first, then the sources.

The same precedence as ``accord contracts show|diff`` (published artefacts are the authority once
published; unpublished sources follow), read from the repository root the server was given.
The sources are linted once per change of their folder's files (by modification time), so a
request does not re-read the whole folder.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from accord.adapters.artefacts import ArtefactStore
from accord.contracts import compat
from accord.contracts.canonical import contract_summary, to_canonical
from accord.contracts.model import CapabilityContract, Contract, MessageContract
from accord.contracts.sources import ARTEFACTS_DIR, SOURCES_DIR, lint_paths
from accord.errors import Diagnostic

__all__ = ["ContractBook", "summary"]


def summary(c: Contract, published: bool) -> dict[str, Any]:
    return {**contract_summary(c), "published": published}


class ContractBook:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._stamp: tuple[float, ...] | None = None
        self._cached: list[tuple[Contract, bool]] = []

    def _stamp_now(self) -> tuple[float, ...]:
        stamps: list[float] = []
        for folder in (self.root / SOURCES_DIR, self.root / ARTEFACTS_DIR):
            if folder.is_dir():
                stamps += [p.stat().st_mtime for p in sorted(folder.rglob("*")) if p.is_file()]
                stamps.append(float(len(stamps)))
        return tuple(stamps)

    def all(self) -> list[tuple[Contract, bool]]:
        """Every known version, ``(contract, published)``: published ones win over sources."""
        with self._lock:
            stamp = self._stamp_now()
            if stamp != self._stamp:
                seen: dict[tuple[str, str, int], tuple[Contract, bool]] = {}
                for c in ArtefactStore(self.root / ARTEFACTS_DIR).published():
                    seen[(c.kind, c.name, c.version)] = (c, True)
                sources = self.root / SOURCES_DIR
                contracts, _ = lint_paths([sources]) if sources.is_dir() else ([], [])
                for c in contracts:
                    seen.setdefault((c.kind, c.name, c.version), (c, False))
                self._cached = sorted(seen.values(), key=lambda p: (p[0].name, p[0].version))
                self._stamp = stamp
            return list(self._cached)

    def versions(self, name: str) -> list[tuple[Contract, bool]]:
        return [p for p in self.all() if p[0].name == name]

    def one(self, name: str, version: int) -> tuple[Contract, bool] | None:
        return next((p for p in self.versions(name) if p[0].version == version), None)

    @staticmethod
    def document(c: Contract, published: bool, others: list[int]) -> dict[str, Any]:
        return {**summary(c, published), "versions": others, "contract": to_canonical(c)}

    @staticmethod
    def compatibility(old: Contract, new: Contract, mode: str) -> dict[str, Any] | None:
        """The report of ``old`` → ``new`` under ``mode``, as ``accord contracts diff --json``
        gives it; ``None`` when the two are not of comparable kinds."""
        if isinstance(old, MessageContract) and isinstance(new, MessageContract):
            report = compat.diff(old, new)
            failures = compat.check([old], new, mode)
        elif isinstance(old, CapabilityContract) and isinstance(new, CapabilityContract):
            report = compat.diff_capability(old, new)
            failures = [
                Diagnostic("compat-not-" + d, f"{c.key}: {c.message}", path=c.path)
                for c in report.changes
                for d in compat.directions(mode)
                if not getattr(c, d)
            ]
        else:
            return None
        return {
            "ok": not failures,
            "mode": mode,
            "report": report.to_json(),
            "failures": [d.as_dict() for d in failures],
        }
