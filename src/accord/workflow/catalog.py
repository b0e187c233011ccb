"""What the compiler needs of a contract catalog, as a Protocol.

:class:`accord.contracts.catalog.Catalog` satisfies it; tests may pass anything with the same
three methods. Lookups return ``None`` for an unknown reference; ``digest`` is the artefact digest
(``sha256:…``) the plan pins.
"""

from __future__ import annotations

from typing import Any, Protocol

from accord.contracts.model import CapabilityContract, ContractRef, MessageContract

__all__ = ["ContractCatalogLike"]


class ContractCatalogLike(Protocol):
    """What the compiler needs of :class:`accord.contracts.catalog.Catalog`."""

    def message(self, ref: ContractRef) -> MessageContract | None: ...
    def capability(self, ref: ContractRef) -> CapabilityContract | None: ...
    def digest(self, item: Any) -> str: ...
