"""The catalog: every known contract, looked up by kind and ``name@version``.

Pure and in-memory. The workflow compiler resolves ``worker: thumbnail.render@3`` through
:meth:`Catalog.capability` and the request/result messages through :meth:`Catalog.message`; the
registry and the CLI use it to find versions and digests. Build one from parsed sources
(:func:`accord.contracts.sources.load_catalog`) or from published artefacts. A catalog refuses two
different contracts under one identity; the same contract twice is harmless.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Literal, TypeAlias

from accord.contracts.canonical import contract_digest
from accord.contracts.model import (
    CapabilityContract,
    Contract,
    ContractRef,
    MessageContract,
    PolicyContract,
)

__all__ = ["Catalog", "CatalogKind"]

CatalogKind: TypeAlias = Literal["message", "capability", "worker", "action", "policy"]


def _category(kind: str) -> str:
    return "capability" if kind in ("worker", "action", "capability") else kind


class Catalog:
    """An immutable set of contracts indexed by (category, name, version)."""

    def __init__(self, contracts: Iterable[Contract] = ()) -> None:
        index: dict[tuple[str, str, int], Contract] = {}
        for contract in contracts:
            key = (_category(contract.kind), contract.name, contract.version)
            known = index.get(key)
            if known is not None and contract_digest(known) != contract_digest(contract):
                raise ValueError(
                    f"two different contracts named {contract.kind} "
                    f"{contract.name}@{contract.version}"
                )
            index[key] = contract
        self._index = dict(sorted(index.items()))
        self._digests: dict[tuple[str, str, int], str] = {}

    def __len__(self) -> int:
        return len(self._index)

    def __iter__(self) -> Iterator[Contract]:
        return iter(self._index.values())

    def __contains__(self, contract: object) -> bool:
        return any(contract is c or contract == c for c in self._index.values())

    def get(self, kind: CatalogKind | str, ref: ContractRef | str) -> Contract | None:
        """The contract of ``kind`` (``capability`` matches worker and action) at ``ref``."""
        if isinstance(ref, str):
            ref = ContractRef.parse(ref)
        found = self._index.get((_category(kind), ref.name, ref.version))
        if found is not None and kind in ("worker", "action") and found.kind != kind:
            return None
        return found

    def message(self, ref: ContractRef | str) -> MessageContract | None:
        found = self.get("message", ref)
        return found if isinstance(found, MessageContract) else None

    def capability(self, ref: ContractRef | str) -> CapabilityContract | None:
        found = self.get("capability", ref)
        return found if isinstance(found, CapabilityContract) else None

    def policy(self, ref: ContractRef | str) -> PolicyContract | None:
        found = self.get("policy", ref)
        return found if isinstance(found, PolicyContract) else None

    def messages(self) -> list[MessageContract]:
        return [c for c in self._index.values() if isinstance(c, MessageContract)]

    def capabilities(self) -> list[CapabilityContract]:
        return [c for c in self._index.values() if isinstance(c, CapabilityContract)]

    def policies(self) -> list[PolicyContract]:
        return [c for c in self._index.values() if isinstance(c, PolicyContract)]

    def versions(self, name: str, kind: CatalogKind | None = None) -> list[int]:
        """Every version known under ``name``, ascending (optionally of one kind only)."""
        return sorted(
            v
            for (cat, n, v) in self._index
            if n == name and (kind is None or cat == _category(kind))
        )

    def latest(self, kind: CatalogKind | str, name: str) -> Contract | None:
        versions = [v for (cat, n, v) in self._index if cat == _category(kind) and n == name]
        return self._index[(_category(kind), name, max(versions))] if versions else None

    def digest(self, item: Contract | ContractRef | str) -> str:
        """``sha256:…`` of a contract, or of the message/capability/policy named by ``item``."""
        if isinstance(item, MessageContract | CapabilityContract | PolicyContract):
            return contract_digest(item)
        ref = ContractRef.parse(item) if isinstance(item, str) else item
        matches = [k for k in self._index if k[1:] == (ref.name, ref.version)]
        if not matches:
            raise KeyError(f"no contract {ref} in the catalog")
        key = matches[0]
        if key not in self._digests:
            self._digests[key] = contract_digest(self._index[key])
        return self._digests[key]
