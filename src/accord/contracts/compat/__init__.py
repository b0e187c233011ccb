"""Contract compatibility: every change classified, checked in a mode, gated at publish.

Pure functions over :mod:`accord.contracts.model` objects; no I/O. The public surface is here;
the parts live beside it:

- :mod:`~accord.contracts.compat.rules` — the table of docs/compatibility.md as data (code → row,
  backward, forward, action, SemVer level) and the :class:`Change` record;
- :mod:`~accord.contracts.compat.fields` — the recursive payload walk (``payload.a.b``,
  ``payload.items[].field``), rename candidates, presence, limits, annotations;
- :mod:`~accord.contracts.compat.diffs` — :func:`diff`, :func:`diff_capability`, declared
  tolerance, and the :class:`DiffReport` (verdicts, actions, SemVer, stable JSON);
- :mod:`~accord.contracts.compat.checks` — Confluent-style :func:`check` (backward, forward, full,
  each optionally transitive), :func:`tolerance_check` and the publish gate
  :func:`check_publish` (its policy is described there).

A change's stable key is ``<code>@<path>`` (``enum-value-added@payload.previewType``); a change
record acknowledges a change by key or by bare code. Verdicts are for **closed** readers: unknown
fields are rejected unless the reader declares a :class:`~accord.contracts.model.Tolerance` for
the writer's wire version, which turns TR from a hope into a check. SemVer derived from a diff is
the package axis of the generated bindings; it is never proof of wire compatibility.

Where Accord judges a row more finely than docs/compatibility.md (each with its reason):

- Row 3 backward ✓: every Accord binding applies defaults when a field is missing (the DSL's own
  rule, enforced by the validators), so the table's condition always holds.
- Row 4: reserving the removed name stops its reuse (``reserved-name-reused``, breaking) but does
  not make a closed reader accept old data that still carries it, so backward stays ✗ until the
  new version declares a tolerance for the old one.
- Row 5 for a required field *with a default* (``field-removed-required-with-default``): forward
  ✓ and action TR, because old readers supply the default when the field is gone; this is the
  exact mirror of row 3.
- Row 6 when the newly required field has a default (``optional-to-required-with-default``):
  backward ✓ forward ✓, action CA, for the same reason as row 3. Adding a default to a required
  field, or removing it, behaves like rows 7 and 6 (``default-added-to-required``,
  ``default-removed-from-required``).
- Row 8, format changed (not only added): backward ✗ forward ✗ like a changed pattern; multipleOf
  changed to a value that neither divides nor is divided by the old one: ``limit-changed``, ✗ ✗.
- Row 11, number → integer (``type-narrowed``): backward ✗ forward ✓, WV. The table's "anything
  else ✗ both" is stricter than needed: every integer is a number, so old readers are fine.
- Row 15: a description is "marked semantic" when its text starts with ``Semantic:``; a change of
  such a description is ``meaning-changed`` (CA), any other description change is row 20.
- Row 16: ``sensitive`` added needs no action (redaction only grows); removal is CA.
- Row 17: a removed and an added member of the same shape in the same object are reported once,
  as ``field-renamed`` at the new path (the old path in ``detail``), never as two milder changes.
- Row 18 (``routing-changed``, capability queue or kind): verdicts are ✓ ✓ since a message stays
  readable; the required action is dual-route.
- Row 19: ``outcome-added`` backward ✓ forward ✗ (an old orchestrator meets an unknown outcome),
  ``outcome-removed`` backward ✗ forward ✓; capability error codes follow the same rule.

Publish decisions (details in :mod:`~accord.contracts.compat.checks`): a TR change not covered by a
declared tolerance is an error only when it fails a direction the contract's mode requires, else a
warning; a WV change with a wire bump that still fails a required direction must be acknowledged
like a CA change, so breaking the declared roll-out order is always a recorded decision.
"""

from __future__ import annotations

from accord.contracts.compat.checks import (
    acknowledgements,
    check,
    check_publish,
    tolerance_check,
    unknown_fields,
)
from accord.contracts.compat.diffs import (
    DiffReport,
    Mode,
    SemverBump,
    diff,
    diff_capability,
    directions,
    tolerates,
)
from accord.contracts.compat.rules import RULES, Action, Change, Rule

__all__ = [
    "RULES",
    "Action",
    "Change",
    "DiffReport",
    "Mode",
    "Rule",
    "SemverBump",
    "acknowledgements",
    "check",
    "check_publish",
    "diff",
    "diff_capability",
    "directions",
    "tolerance_check",
    "tolerates",
    "unknown_fields",
]
