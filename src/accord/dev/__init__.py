"""Working in the monorepo: which workers a change touches, per-worker CI, sparse sets, scaffolds.

Pure rules over the repository's texts (:mod:`~accord.dev.layout`, :mod:`~accord.dev.graph`,
:mod:`~accord.dev.affected`, :mod:`~accord.dev.ci`, :mod:`~accord.dev.scaffold`); reading the
tree and git is :mod:`~accord.dev.repo`. docs/monorepo.md describes the rules.
"""

from accord.dev.affected import Affected, Inputs, affected, inputs_of
from accord.dev.ci import ci_files, path_filters, render_ci, sparse_set
from accord.dev.graph import WIRE, ContractGraph
from accord.dev.layout import Layout, LayoutError, Package, read_package

__all__ = [
    "WIRE",
    "Affected",
    "ContractGraph",
    "Inputs",
    "Layout",
    "LayoutError",
    "Package",
    "affected",
    "ci_files",
    "inputs_of",
    "path_filters",
    "read_package",
    "render_ci",
    "sparse_set",
]
