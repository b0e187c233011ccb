"""The published contract registry on disk: ``schemas/published/<name>/<version>.json`` + index.

All decisions are made by :mod:`accord.contracts.registry` (pure); this module only reads the
artefacts that exist, asks for a :class:`~accord.contracts.registry.Publication`, and — when
nothing is refused — writes the new artefacts and then the index, each atomically (temporary
file in the same directory, ``fsync``, ``os.replace``, ``fsync`` of the directory). A crash or a
refusal therefore never leaves a half-written artefact; a crash between artefacts and index
leaves complete artefacts that the next run recognises (the artefact files, not the index, are
the truth, and their digests are verified on every read).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from accord._files import atomic_write
from accord.canonical import canonical_json
from accord.contracts.compat import check_publish
from accord.contracts.jsonschema import export
from accord.contracts.model import Contract, ContractRef, MessageContract
from accord.contracts.registry import (
    CompatCheck,
    Publication,
    RetentionPolicy,
    artefact_document,
    artefact_path,
    contract_from_artefact,
    index_document,
    plan_publication,
    retirement_refusal,
)
from accord.errors import (
    ContractError,
    Diagnostic,
    ImmutableArtefactError,
    IncompatibleChange,
)

__all__ = ["INDEX_NAME", "ArtefactStore", "atomic_write", "compat_check"]

INDEX_NAME = "index.json"


def compat_check(previous: Sequence[MessageContract], new: MessageContract) -> list[Diagnostic]:
    """The compatibility gate of :mod:`accord.contracts.compat`."""
    return list(check_publish(previous, new))


def _encode(document: Any) -> bytes:
    return canonical_json(document) + b"\n"


class ArtefactStore:
    """The artefact directory (``schemas/published`` by default)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path_of(self, contract: Contract) -> Path:
        return self.root / artefact_path(contract)

    def published(self) -> list[Contract]:
        """Every artefact under the root, each verified against its digest."""
        if not self.root.is_dir():
            return []
        out = []
        for path in sorted(self.root.glob("*/*.json")):
            try:
                document = json.loads(path.read_bytes())
            except (OSError, ValueError) as exc:
                raise ContractError(f"{path}: unreadable artefact ({exc})") from exc
            out.append(contract_from_artefact(document, str(path)))
        return out

    def artefact(self, ref: ContractRef | str) -> dict[str, Any] | None:
        """The stored document of ``name@version`` (any kind), or ``None``."""
        ref = ContractRef.parse(ref) if isinstance(ref, str) else ref
        path = self.root / ref.name / f"{ref.version}.json"
        if not path.is_file():
            return None
        document: dict[str, Any] = json.loads(path.read_bytes())
        contract_from_artefact(document, str(path))
        return document

    def plan(self, sources: Iterable[Contract], check: CompatCheck = compat_check) -> Publication:
        return plan_publication(sources, self.published(), check)

    def publish(
        self,
        sources: Iterable[Contract],
        *,
        check: CompatCheck = compat_check,
        dry_run: bool = False,
    ) -> Publication:
        """Publish every new version; raise (writing nothing) on any conflict or refusal."""
        plan = self.plan(sources, check)
        if plan.conflicts:
            raise ImmutableArtefactError("\n".join(plan.conflicts))
        if plan.incompatible:
            raise IncompatibleChange(plan.incompatible, "publication refused: incompatible change")
        if dry_run:
            return plan
        documents = [(self.path_of(c), _encode(self._document(c))) for c in plan.new]
        for path, data in documents:
            atomic_write(path, data)
        self._write_index(plan.resulting)
        return plan

    def retire(self, ref: ContractRef | str, now: dt.datetime, policy: RetentionPolicy) -> Contract:
        """Delete one artefact when :func:`retirement_refusal` allows it; index first."""
        ref = ContractRef.parse(ref) if isinstance(ref, str) else ref
        published = self.published()
        matches = [c for c in published if (c.name, c.version) == (ref.name, ref.version)]
        if not matches:
            raise ContractError(f"{ref} is not published")
        contract = matches[0]
        rest = [c for c in published if c is not contract]
        reason = retirement_refusal(contract, rest, now, policy)
        if reason is not None:
            raise ContractError(f"retirement refused: {reason}")
        self._write_index(rest)
        self.path_of(contract).unlink()
        return contract

    def _write_index(self, contracts: Iterable[Contract]) -> None:
        data = _encode(index_document(contracts))
        index = self.root / INDEX_NAME
        if not index.is_file() or index.read_bytes() != data:
            atomic_write(index, data)

    @staticmethod
    def _document(contract: Contract) -> dict[str, Any]:
        schema = None
        if isinstance(contract, MessageContract):
            schema = export(contract)
        return artefact_document(contract, schema)
