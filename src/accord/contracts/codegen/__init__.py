"""Code generation: contract sources → Python models and the TypeScript package.

:func:`generate_all` loads every message contract under ``<root>/schemas/contracts`` (planned
contracts are not runnable and get no bindings), renders all outputs **in memory** first, then
either writes the files that differ (atomically: :func:`accord._files.atomic_write`)
and removes stale generated files, or, with ``check=True``, writes nothing and reports every file
that differs from a fresh generation. Rendering reads neither the clock nor the network, so two
runs give byte-identical output; ``make codegen-check`` fails when committed code has drifted.

Outputs (each folder holds generated files only):

- ``src/accord/generated/`` — pydantic v2 models (:mod:`.python`);
- ``bindings/typescript/src/generated/`` — types, schemas, formats (:mod:`.typescript`);
- ``schemas/fixtures/<name>/<version>/{valid,invalid}/`` — golden fixtures derived by
  :mod:`accord.contracts.fixtures`; hand-written ones are named ``extra-*.json`` and never touched.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from accord._files import atomic_write
from accord.contracts.codegen.python import render_python
from accord.contracts.codegen.typescript import CodegenToolError, render_typescript
from accord.contracts.dsl import load_directory
from accord.contracts.fixtures import derive_fixtures
from accord.contracts.model import MessageContract

__all__ = [
    "FIXTURES_OUT",
    "PYTHON_OUT",
    "TYPESCRIPT_OUT",
    "TYPESCRIPT_PACKAGE",
    "CodegenReport",
    "CodegenToolError",
    "generate_all",
    "message_contracts",
    "render_all",
]

FIXTURES_OUT = Path("schemas/fixtures")
PYTHON_OUT = Path("src/accord/generated")
TYPESCRIPT_PACKAGE = Path("bindings/typescript")
TYPESCRIPT_OUT = TYPESCRIPT_PACKAGE / "src" / "generated"


@dataclass(slots=True)
class CodegenReport:
    """Paths are relative to the repository root, sorted."""

    check: bool
    written: list[str] = field(default_factory=list)  # changed (or, in check mode, would change)
    removed: list[str] = field(default_factory=list)  # stale (or, in check mode, would remove)
    unchanged: list[str] = field(default_factory=list)

    @property
    def differing(self) -> list[str]:
        return sorted(self.written + self.removed)

    @property
    def ok(self) -> bool:
        """In check mode: nothing differs. After writing: always true."""
        return not self.check or not self.differing


def message_contracts(root: Path) -> list[MessageContract]:
    found = load_directory(root / "schemas" / "contracts")
    runnable = [c for c in found if isinstance(c, MessageContract) and c.status != "planned"]
    return sorted(runnable, key=lambda c: (c.name, c.wire_version))


def render_all(root: Path, contracts: Sequence[MessageContract]) -> dict[Path, str]:
    """Every generated file (relative path → text) for ``contracts``."""
    files = {PYTHON_OUT / k: v for k, v in render_python(contracts).items()}
    ts = render_typescript(contracts, root / TYPESCRIPT_PACKAGE)
    files.update({TYPESCRIPT_OUT / k: v for k, v in ts.items()})
    for contract in contracts:
        folder = FIXTURES_OUT / contract.name / str(contract.wire_version)
        for rel, fixture in derive_fixtures(contract).items():
            text = json.dumps(fixture, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
            files[folder / rel] = text
    return files


def _generated_folders(root: Path, contracts: Sequence[MessageContract]) -> list[Path]:
    folders = [PYTHON_OUT, TYPESCRIPT_OUT]
    for c in contracts:
        base = FIXTURES_OUT / c.name / str(c.wire_version)
        folders += [base / "valid", base / "invalid"]
    return [f for f in folders if (root / f).is_dir()]


def generate_all(
    root: Path, check: bool = False, contracts: Sequence[MessageContract] | None = None
) -> CodegenReport:
    """Generate (or, with ``check``, compare) every binding under ``root``."""
    chosen = message_contracts(root) if contracts is None else contracts
    files = render_all(root, chosen)
    report = CodegenReport(check=check)
    for rel, text in sorted(files.items()):
        target = root / rel
        current = target.read_bytes() if target.is_file() else None
        if current == text.encode("utf-8"):
            report.unchanged.append(str(rel))
            continue
        report.written.append(str(rel))
        if not check:
            atomic_write(target, text)
    for folder in _generated_folders(root, chosen):
        for existing in sorted((root / folder).iterdir()):
            rel = existing.relative_to(root)
            generated = existing.suffix in {".py", ".ts", ".json"} and existing.is_file()
            if generated and not existing.name.startswith("extra-") and rel not in files:
                report.removed.append(str(rel))
                if not check:
                    existing.unlink()
    return report
