"""The contract DSL: YAML source text in, frozen, meta-validated contracts out.

The parts, each depending only on those listed before it:

- :mod:`~accord.contracts.dsl.reader` — typed reads of positioned YAML nodes, worded with the
  ``dsl-*`` codes (the shared :class:`accord.contracts.yamlsource.Reader` underneath);
- :mod:`~accord.contracts.dsl.common` — the grammar every kind shares: names, references, owner,
  lifecycle, change record;
- :mod:`~accord.contracts.dsl.fields` — payload fields, each proved self-consistent;
- :mod:`~accord.contracts.dsl.kinds` — the four document kinds (``message``, ``worker``,
  ``action``, ``policy``);
- :mod:`~accord.contracts.dsl.lint` — one file, or a set of files checked against each other
  (pure on text);
- :mod:`~accord.contracts.dsl.files` — the same from files and directories on disk.

Every finding is a :class:`~accord.errors.Diagnostic` with a stable code, ``file:line:column`` and
the field path; nothing stops at the first error. Stable codes: ``yaml-*`` (syntax, duplicate
keys, several documents), ``dsl-*`` (document and field rules), ``ref-*`` (cross-contract rules)
and ``source-*`` (files that cannot be read).
"""

from __future__ import annotations

from accord.contracts.dsl.files import load_directory, load_file
from accord.contracts.dsl.lint import (
    contract_key,
    lint_sources,
    lint_text,
    parse_sources,
    parse_text,
)

__all__ = [
    "contract_key",
    "lint_sources",
    "lint_text",
    "load_directory",
    "load_file",
    "parse_sources",
    "parse_text",
]
