"""The contract graph: which contracts a capability uses, directly or through references.

Built from a :class:`~accord.contracts.catalog.Catalog` (pure). The edges are the references
the contract language has: a capability's ``request`` and ``result``, a message's ``outcomes``
(by name: every version of it), a policy's ``appliesTo`` (the policy is used by the capability
it applies to). A change to a contract reaches the workers whose capabilities (or own source)
use it; a change to a *wire* contract — the envelope and the outcome contracts every worker
speaks whatever its capability — reaches every worker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from accord.contracts.catalog import Catalog
from accord.contracts.model import CapabilityContract, MessageContract, PolicyContract

__all__ = ["WIRE", "ContractGraph"]

# the envelope of every job, and what every worker answers with (docs/protocol.md): outcome@1,
# its batch, the payload contract of each outcome kind but `succeeded` (the capability's result),
# and the cancellation request every worker honours
WIRE: frozenset[str] = frozenset(
    {
        "envelope",
        "outcome",
        "outcome-batch",
        "stage-accepted",
        "stage-heartbeat",
        "progress",
        "stage-failed",
        "cancellation-requested",
    }
)


@dataclass(frozen=True)
class ContractGraph:
    uses: Mapping[str, frozenset[str]]  # ref -> refs it uses directly
    sources: Mapping[str, frozenset[str]]  # repository path of a source -> refs defined there
    capabilities: frozenset[str]  # worker and action capability refs
    digests: Mapping[str, str]  # ref -> published digest (sha256:…)

    @classmethod
    def from_catalog(cls, catalog: Catalog, root: str = "") -> ContractGraph:
        """The graph of ``catalog``; source paths are made relative to ``root`` (a prefix)."""
        by_name: dict[str, set[str]] = {}
        for contract in catalog:
            by_name.setdefault(contract.name, set()).add(str(contract.ref))
        uses: dict[str, set[str]] = {str(c.ref): set() for c in catalog}
        sources: dict[str, set[str]] = {}
        capabilities: set[str] = set()
        prefix = root.rstrip("/") + "/" if root else ""
        for contract in catalog:
            ref = str(contract.ref)
            if contract.source is not None:
                path = contract.source.file.replace("\\", "/").removeprefix(prefix)
                sources.setdefault(path, set()).add(ref)
            if isinstance(contract, CapabilityContract):
                capabilities.add(ref)
                uses[ref] |= {str(contract.request), str(contract.result)}
            elif isinstance(contract, MessageContract):
                for name in contract.outcomes:
                    uses[ref] |= by_name.get(name, set())
            elif isinstance(contract, PolicyContract):
                for target in contract.applies_to:
                    uses.setdefault(str(target), set()).add(ref)
        return cls(
            uses={k: frozenset(v) for k, v in uses.items()},
            sources={k: frozenset(v) for k, v in sources.items()},
            capabilities=frozenset(capabilities),
            digests={str(c.ref): catalog.digest(c) for c in catalog},
        )

    @property
    def refs(self) -> frozenset[str]:
        return frozenset(self.uses)

    def names(self, refs: Iterable[str]) -> frozenset[str]:
        return frozenset(ref.rpartition("@")[0] for ref in refs)

    def of_name(self, name: str) -> frozenset[str]:
        return frozenset(r for r in self.uses if r.rpartition("@")[0] == name)

    @property
    def wire(self) -> frozenset[str]:
        return frozenset(r for r in self.uses if r.rpartition("@")[0] in WIRE)

    def closure(self, refs: Iterable[str]) -> frozenset[str]:
        """``refs`` (those the catalog knows) and every contract they use, transitively."""
        seen: set[str] = set()
        pending = [r for r in refs if r in self.uses]
        while pending:
            ref = pending.pop()
            if ref not in seen:
                seen.add(ref)
                pending.extend(self.uses.get(ref, ()))
        return frozenset(seen)

    def source_of(self, ref: str) -> str | None:
        for path, refs in self.sources.items():
            if ref in refs:
                return path
        return None
