"""The generated parts of ``docs/protocol.md``: field tables drawn from the message contracts.

A worker written in another language is built from the protocol document, so the document's field
lists must be the contracts' own, or they drift the first time a contract changes. The document
is hand-written prose with *generated regions* between two markers::

    <!-- generated: envelope@1 -->
    ...a table rendered from the contract envelope@1...
    <!-- end generated -->

A region names a message contract ``name@version`` (its field table) or ``capabilities`` (the
worker capabilities with their queues and request and result contracts). :func:`render_document`
rewrites only what lies between the markers and leaves every other byte alone; its result says
which regions changed, which is what ``accord contracts docs --check`` reports as stale.

Pure: text and a :class:`~accord.contracts.catalog.Catalog` in, text out; no file is read here.

A field table has one row per field, nested object fields flattened with dotted paths
(``payloadRef.digest``) and array items written ``[]`` (``views[]``, ``views[].angle``), the
path notation the contracts' tolerances and the validator's violations use.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from accord.canonical import canonical_json
from accord.contracts.catalog import Catalog
from accord.contracts.model import FieldSpec, MessageContract

__all__ = [
    "CAPABILITIES",
    "END_MARKER",
    "DocumentError",
    "FieldRow",
    "Region",
    "RenderedDocument",
    "capability_table",
    "contract_table",
    "field_rows",
    "find_regions",
    "render_document",
    "render_region",
]

CAPABILITIES = "capabilities"  # the region listing the worker capabilities and their queues
END_MARKER = "<!-- end generated -->"
_START = re.compile(r"^<!-- generated: (?P<name>[^\s>]+) -->[ \t]*$", re.M)
_END = re.compile(r"^<!-- end generated -->[ \t]*$", re.M)
_REF = re.compile(r"^(?P<name>[a-z][a-z0-9.-]*)@(?P<version>[1-9][0-9]*)$")


class DocumentError(ValueError):
    """The document's markers cannot be read, or a region names nothing the catalog holds;
    ``str()`` names the region (or the line) at fault."""


@dataclass(frozen=True, slots=True)
class FieldRow:
    """One row of a field table."""

    path: str
    type: str
    required: bool
    constraints: str
    sensitive: bool
    description: str


@dataclass(frozen=True, slots=True)
class Region:
    """One generated region: its name and where its body lies in the document."""

    name: str
    body_start: int  # just after the start marker's line
    body_end: int  # at the end marker
    line: int  # of the start marker, 1-based


@dataclass(frozen=True, slots=True)
class RenderedDocument:
    """The document with every region regenerated, and which regions were out of date."""

    text: str
    regions: tuple[str, ...]
    stale: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.stale


# -- field tables ------------------------------------------------------------------------------


def _code(value: Any) -> str:
    """``value`` as inline code in a table cell (JSON for anything but a string)."""
    text = value if isinstance(value, str) else canonical_json(value).decode()
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _cell(text: str) -> str:
    """Text safe in one Markdown table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _number(value: float | int) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _constraints(spec: FieldSpec) -> str:
    parts: list[str] = []
    if spec.enum is not None:
        parts.append("one of " + ", ".join(_code(v) for v in spec.enum))
    if spec.format is not None:
        parts.append(f"format {spec.format}")
    if spec.pattern is not None:
        parts.append(f"pattern {_code(spec.pattern)}")
    for label, value in (
        ("minLength", spec.min_length),
        ("maxLength", spec.max_length),
        ("minimum", spec.minimum),
        ("maximum", spec.maximum),
        ("exclusiveMinimum", spec.exclusive_minimum),
        ("exclusiveMaximum", spec.exclusive_maximum),
        ("multipleOf", spec.multiple_of),
        ("minItems", spec.min_items),
        ("maxItems", spec.max_items),
    ):
        if value is not None:
            parts.append(f"{label} {_number(value)}")
    if spec.unit is not None:
        parts.append(f"unit {spec.unit}")
    if spec.has_default:
        parts.append(f"default {_code(spec.default)}")
    if spec.deprecated:
        parts.append("deprecated")
    return "; ".join(parts)


def _rows(fields: Mapping[str, FieldSpec], prefix: str) -> Iterator[FieldRow]:
    for name, spec in fields.items():
        yield from _spec_rows(prefix + name, spec)


def _spec_rows(path: str, spec: FieldSpec) -> Iterator[FieldRow]:
    kind = spec.type + (" or null" if spec.nullable else "")
    if spec.type == "object" and spec.fields is None:
        kind += " (any members)"
    yield FieldRow(
        path=path,
        type=kind,
        required=spec.required,
        constraints=_constraints(spec),
        sensitive=spec.sensitive,
        description=spec.description or "",
    )
    if spec.type == "object" and spec.fields:
        yield from _rows(spec.fields, path + ".")
    elif spec.type == "array" and spec.items is not None:
        item = spec.items
        if item.type == "object" and item.fields:
            yield from _rows(item.fields, path + "[].")
        else:
            yield from _spec_rows(path + "[]", item)


def field_rows(contract: MessageContract) -> list[FieldRow]:
    """Every field of ``contract``'s payload, depth first in declaration order."""
    return list(_rows(contract.payload, ""))


def contract_table(contract: MessageContract) -> str:
    """A summary line and the field table of ``contract``, ending in a newline."""
    facts = [f"owner `{contract.owner}`", contract.status]
    if contract.max_bytes is not None:
        facts.append(f"at most {contract.max_bytes} bytes")
    head = f"**`{contract.ref}`** ({', '.join(facts)})"
    if contract.description:
        head += ": " + " ".join(contract.description.split())
    rows = field_rows(contract)
    if not rows:
        return head + "\n\nNo fields: the payload is the empty object `{}`.\n"
    lines = [
        head,
        "",
        "| field | type | required | constraints | sensitive | description |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        cells = (
            f"`{row.path}`",
            row.type,
            "yes" if row.required else "",
            row.constraints,
            "yes" if row.sensitive else "",
            row.description,
        )
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    if contract.reserved:
        lines += [
            "",
            "Reserved, never to be reused: " + ", ".join(f"`{r}`" for r in contract.reserved) + ".",
        ]
    return "\n".join(lines) + "\n"


def capability_table(catalog: Catalog) -> str:
    """The worker capabilities of ``catalog``: the queue each is served on (the contract's
    ``queue``, else the capability's name), its request and result contracts, error codes and
    time limit. Actions are left out: the engine runs them itself."""
    lines = [
        "| capability | status | queue | request | result | error codes | time limit |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for cap in catalog.capabilities():
        if cap.kind != "worker":
            continue
        limit = f"{cap.limits.time_ms} ms" if cap.limits.time_ms is not None else ""
        cells = (
            f"`{cap.ref}`",
            cap.status,
            f"`{cap.queue or cap.name}`",
            f"`{cap.request}`",
            f"`{cap.result}`",
            ", ".join(f"`{e}`" for e in cap.errors),
            limit,
        )
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


# -- regions -----------------------------------------------------------------------------------


def find_regions(text: str) -> list[Region]:
    """The generated regions of ``text`` in order; raises :class:`DocumentError` for a start
    marker without its end, an end marker without a start, or a region inside another."""
    regions: list[Region] = []
    pos = 0
    starts = list(_START.finditer(text))
    ends = list(_END.finditer(text))
    for start in starts:
        line = text.count("\n", 0, start.start()) + 1
        if start.start() < pos:
            raise DocumentError(f"line {line}: region {start['name']} starts inside another")
        end = next((e for e in ends if e.start() > start.end()), None)
        if end is None:
            raise DocumentError(f"line {line}: region {start['name']} has no {END_MARKER}")
        body_start = start.end() + 1 if text[start.end() : start.end() + 1] == "\n" else start.end()
        regions.append(Region(start["name"], body_start, end.start(), line))
        pos = end.end()
    matched = {r.body_end for r in regions}
    for end in ends:
        if end.start() not in matched:
            line = text.count("\n", 0, end.start()) + 1
            raise DocumentError(f"line {line}: {END_MARKER} without a region it ends")
    return regions


def render_region(name: str, catalog: Catalog) -> str:
    """The body of the region ``name``; raises :class:`DocumentError` when it names nothing."""
    if name == CAPABILITIES:
        return capability_table(catalog)
    if _REF.match(name) is None:
        raise DocumentError(
            f"region {name}: not a message contract (name@version) nor {CAPABILITIES!r}"
        )
    contract = catalog.message(name)
    if contract is None:
        raise DocumentError(f"region {name}: no message contract {name} in the catalog")
    return contract_table(contract)


def render_document(text: str, catalog: Catalog) -> RenderedDocument:
    """``text`` with every generated region rendered afresh from ``catalog``; the prose outside
    the markers is kept byte for byte. ``stale`` names the regions whose body changed."""
    out: list[str] = []
    names: list[str] = []
    stale: list[str] = []
    pos = 0
    for region in find_regions(text):
        body = render_region(region.name, catalog)
        names.append(region.name)
        if text[region.body_start : region.body_end] != body:
            stale.append(region.name)
        out += [text[pos : region.body_start], body]
        pos = region.body_end
    out.append(text[pos:])
    return RenderedDocument("".join(out), tuple(names), tuple(stale))
