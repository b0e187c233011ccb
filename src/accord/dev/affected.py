"""Which workers, and which parts of the platform, a list of changed paths touches (pure).

The rules (docs/monorepo.md):

==================================================  =========================================
a change to                                         reaches
==================================================  =========================================
``workers/<name>/**``                               that worker, and every worker installing it
``src/**``, ``pyproject.toml`` (the platform        every Python worker
package and its SDK)
``bindings/typescript/**``                          every TypeScript worker
a folder a worker's tests read (``examples/…``)     that worker
``schemas/contracts/<file>``                        the workers using a contract defined there
``schemas/published/<name>/**``,                    the workers using a contract ``<name>``
``schemas/fixtures/<name>/**``
any other ``schemas/**`` (the index, formats,       every worker
legacy shapes)
``.github/workflows/ci-<name>.yaml``                that worker
``docs/**``, a ``*.md`` outside ``workers/``        nothing
==================================================  =========================================

A worker *uses* the contracts its capabilities reach through the contract graph, those its own
source names, and the wire contracts (the envelope, the outcome contracts) — so a change to
``envelope.v1.yaml`` reaches every worker, one to ``semantic-analysis.v1.yaml`` only the worker
whose capability returns it. The platform's own suite (``tests/``, the TypeScript bindings'
tests) runs when anything outside ``workers/``, the per-worker CI files and the docs changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from accord.dev.graph import ContractGraph
from accord.dev.layout import COMMONS, Layout

__all__ = [
    "Affected",
    "Inputs",
    "affected",
    "inputs_of",
    "normal_path",
    "part_of",
    "reaches",
    "schema_scope",
]

PARTS = ("workers", "python-sdk", "platform", "typescript-bindings", "contracts", "ci", "docs")
_PLATFORM_PARTS = frozenset({"python-sdk", "platform", "typescript-bindings", "contracts"})


@dataclass(frozen=True, slots=True)
class Inputs:
    """What one worker reads from the repository: a change to any of it reaches the worker."""

    worker: str
    folders: tuple[str, ...]  # its own, the local packages it installs, its commons, test data
    files: tuple[str, ...]  # single files (the root pyproject.toml, its CI file)
    contracts: frozenset[str]  # every contract ref it uses

    def contract_names(self) -> frozenset[str]:
        return frozenset(r.rpartition("@")[0] for r in self.contracts)


def normal_path(path: str) -> str:
    """``path`` as the rules compare it: relative to the repository root, ``/``-separated."""
    text = path.strip().replace("\\", "/")
    while text.startswith("./"):
        text = text[2:]
    parts = text.split("/")
    if not text or text.startswith("/") or ".." in parts or (len(text) > 1 and text[1] == ":"):
        raise ValueError(f"changed path {path!r} is not relative to the repository root")
    return "/".join(p for p in parts if p)


def inputs_of(layout: Layout, graph: ContractGraph, name: str) -> Inputs:
    package = layout.packages[name]
    installed = layout.install_order(name)
    commons = COMMONS[package.language]
    folders = [layout.packages[n].path for n in installed[::-1]]
    folders += [c for c in commons if "." not in c.rsplit("/", 1)[-1]]
    # what the package's own tests read (a library's test data is not its users' input)
    reads = set(package.reads)
    mentions: set[str] = set()
    for other in installed:
        mentions |= set(layout.packages[other].capabilities) | set(layout.packages[other].mentions)
    folders += sorted(reads - set(folders))
    files = [c for c in commons if c not in folders]
    files.append(f".github/workflows/ci-{name}.yaml")
    return Inputs(
        worker=name,
        folders=tuple(dict.fromkeys(folders)),
        files=tuple(files),
        contracts=graph.closure(mentions) | graph.closure(graph.wire),
    )


def schema_scope(path: str, graph: ContractGraph) -> frozenset[str] | None:
    """The contracts a change to ``path`` (under ``schemas/``) is a change to; ``None`` when it
    is schema-wide and reaches every worker."""
    parts = path.split("/")
    if len(parts) >= 3 and parts[1] == "contracts":
        return graph.sources.get(path, frozenset())
    if len(parts) >= 4 and parts[1] in {"published", "fixtures"}:
        return graph.of_name(parts[2]) or frozenset()
    return None


def reaches(inputs: Inputs, path: str, graph: ContractGraph) -> bool:
    if path in inputs.files or any(path.startswith(f + "/") for f in inputs.folders):
        return True
    if path.startswith("schemas/"):
        scope = schema_scope(path, graph)
        if scope is None:
            return True
        if path.split("/")[1] == "contracts":
            return bool(scope & inputs.contracts)
        return path.split("/")[2] in inputs.contract_names()
    return False


def part_of(path: str) -> str:
    """The part of the repository ``path`` belongs to (one of :data:`PARTS`)."""
    top = path.split("/", 1)[0]
    if top == "workers":
        return "workers"
    if path.startswith("src/accord/worker/"):
        return "python-sdk"
    if path.startswith("bindings/typescript/"):
        return "typescript-bindings"
    if top == "schemas":
        return "contracts"
    if path.startswith(".github/workflows/ci-"):
        return "ci"
    if top == "docs" or ("/" not in path and path.endswith(".md")):
        return "docs"
    return "platform"


@dataclass(frozen=True)
class Affected:
    changed: tuple[str, ...]
    workers: tuple[str, ...]
    parts: tuple[str, ...]
    reasons: Mapping[str, tuple[str, ...]]  # worker -> the changed paths that reach it
    platform: bool  # whether the platform's own suite runs

    def to_json(self) -> dict[str, object]:
        return {
            "changed": list(self.changed),
            "workers": list(self.workers),
            "parts": list(self.parts),
            "platform": self.platform,
            "reasons": {k: list(v) for k, v in self.reasons.items()},
        }


def affected(paths: Iterable[str], layout: Layout, graph: ContractGraph) -> Affected:
    """What ``paths`` touch; a path that is not repository-relative raises ``ValueError``."""
    changed = tuple(sorted({normal_path(p) for p in paths}))
    reasons: dict[str, tuple[str, ...]] = {}
    for worker in layout.workers:
        inputs = inputs_of(layout, graph, worker.name)
        hits = tuple(p for p in changed if reaches(inputs, p, graph))
        if hits:
            reasons[worker.name] = hits
    parts = {part_of(p) for p in changed}
    return Affected(
        changed=changed,
        workers=tuple(sorted(reasons)),
        parts=tuple(p for p in PARTS if p in parts),
        reasons=reasons,
        platform=bool(parts & _PLATFORM_PARTS),
    )
