"""The contract DSL's typed reads: the shared source reader, worded with ``dsl-*`` codes.

The DSL parser asks a :class:`ContractReader` for "a positive integer at ``wireVersion``" or "a
mapping with exactly these keys"; the reader answers with the value or ``None`` and, in the
``None`` case, has already recorded a :class:`~accord.errors.Diagnostic` with the stable code, the
location of the offending node and the field path. Callers carry on with ``None`` so that one run
of the linter reports every error in a file. Collecting, positions and the rule for a value's type
are those of :class:`accord.contracts.yamlsource.Reader`, which the workflow schema reads with too.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection
from typing import Any

from accord.contracts.yamlsource import Node, Reader, holds

__all__ = ["ContractReader", "join_path"]

_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    bool: "a boolean",
    dict: "a mapping",
    list: "a list",
}


def join_path(base: str, key: str) -> str:
    return f"{base}.{key}" if base else key


class ContractReader(Reader):
    """Reads contract documents: each problem is a ``dsl-*`` finding at the node and field path."""

    def mapping(
        self,
        node: Node,
        path: str,
        allowed: Collection[str],
        required: Collection[str] = (),
        what: str = "",
    ) -> dict[str, Node] | None:
        """The entries of a mapping node; unknown and missing keys are reported."""
        if node.kind != "map":
            self.error(
                "dsl-wrong-type",
                f"{what or path or 'document'} must be a mapping",
                node.location,
                path,
            )
            return None
        out: dict[str, Node] = {}
        for key, value, key_loc in node.entries:
            if key not in allowed:
                hint = difflib.get_close_matches(key, sorted(allowed), n=1)
                suffix = f"; did you mean {hint[0]!r}?" if hint else ""
                self.error(
                    "dsl-unknown-key", f"unknown key {key!r}{suffix}", key_loc, join_path(path, key)
                )
                continue
            out[key] = value
        for key in required:
            if key not in out and node.get(key) is None:
                self.error(
                    "dsl-missing-key",
                    f"required key {key!r} is missing",
                    node.location,
                    join_path(path, key),
                )
        return out

    def scalar(self, node: Node, path: str, kind: type, what: str = "") -> Any:
        """The scalar value when it has Python type ``kind`` (``bool`` is never an ``int``)."""
        value = node.value if node.kind == "scalar" else None
        if node.kind != "scalar" or not holds(value, kind):
            expected = "a number" if kind is float else _TYPE_NAMES.get(kind, kind.__name__)
            shown = value if node.kind == "scalar" else f"a {node.kind}"
            self.error(
                "dsl-wrong-type",
                f"{what or path} must be {expected}, got {shown!r}",
                node.location,
                path,
            )
            return None
        return value

    def text(self, node: Node, path: str, pattern: str | None = None, rule: str = "") -> str | None:
        value: str | None = self.scalar(node, path, str)
        if value is None:
            return None
        if pattern is not None and not re.fullmatch(pattern, value):
            self.error(
                "dsl-bad-name", f"{value!r} does not match {rule or pattern}", node.location, path
            )
            return None
        return value

    def positive_int(self, node: Node, path: str, minimum: int = 1) -> int | None:
        value: int | None = self.scalar(node, path, int)
        if value is not None and value < minimum:
            self.error(
                "dsl-bad-value",
                f"{path} must be at least {minimum}, got {value}",
                node.location,
                path,
            )
            return None
        return value

    def texts(
        self, node: Node, path: str, pattern: str | None = None, rule: str = ""
    ) -> list[tuple[str, Node]] | None:
        """A list of strings; duplicates are reported, each entry keeps its node."""
        if node.kind != "seq":
            self.error("dsl-wrong-type", f"{path} must be a list", node.location, path)
            return None
        out: list[tuple[str, Node]] = []
        seen: set[str] = set()
        for index, item in enumerate(node.items):
            item_path = f"{path}[{index}]"
            value = self.text(item, item_path, pattern, rule)
            if value is None:
                continue
            if value in seen:
                self.error(
                    "dsl-duplicate-entry", f"{value!r} is listed twice", item.location, item_path
                )
                continue
            seen.add(value)
            out.append((value, item))
        return out
