"""YAML source text to a positioned node tree, and typed reads that say where each problem is.

Contract sources are authored by people, so every finding must name ``file:line:column``. The usual
YAML loaders either drop positions or stop at the first duplicate key; this module *composes* the
document with ruamel.yaml (YAML 1.2, so ``yes`` stays a string) and converts it to a small frozen
tree of :class:`Node` values that carry a :class:`~accord.errors.Location` each. Every problem —
syntax, duplicate keys, several documents in one file, non-string keys, alias cycles — becomes a
:class:`~accord.errors.Diagnostic`, and all of them are reported together.

The same module holds the one :class:`Reader` of such trees, shared by the contract DSL
(:mod:`accord.contracts.dsl`) and the workflow schema (:mod:`accord.workflow.check_schema`): it
never raises, records each problem as a :class:`~accord.errors.Diagnostic` at the line and column
of the offending node (or of its key, :func:`location_of`) and lets the caller carry on, so one
run reports every problem in a file. Each DSL words its problems with its own stable codes in a
subclass (``dsl-*`` in :class:`accord.contracts.dsl.reader.ContractReader`, ``schema-*`` in
:class:`accord.workflow.schema_fields.SchemaReader`); the rule for what a value's type is
(:func:`holds`) is this module's, so both read ``true``, ``1`` and ``1.0`` alike.

Pure: it takes text and a file name, never touches the file system. Lines and columns count from 1.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Literal, TypeGuard, TypeVar

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import AliasEvent, CollectionEndEvent, CollectionStartEvent, ScalarEvent
from ruamel.yaml.nodes import MappingNode, ScalarNode, SequenceNode
from ruamel.yaml.nodes import Node as RawNode

from accord.errors import Diagnostic, Location

__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_NODES",
    "Node",
    "Reader",
    "compose",
    "holds",
    "location_of",
]

# Bounds on a source, checked before the document is composed (see _prescan): a hostile file is
# refused in milliseconds instead of exhausting the C stack, the memory or the patience of CI.
MAX_DEPTH = 48  # contracts nest a few levels; anything deeper is a mistake or an alias bomb
MAX_BYTES = 1 << 20  # 1 MiB of UTF-8 per source; the largest real contract is a few KiB
MAX_NODES = 100_000  # nodes after alias expansion (an alias counts every node it stands for)

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Node:
    """A YAML node: ``scalar`` (``value``), ``map`` (``entries``) or ``seq`` (``items``)."""

    kind: Literal["scalar", "map", "seq"]
    location: Location
    value: Any = None
    entries: tuple[tuple[str, Node, Location], ...] = ()  # key, value node, key location
    items: tuple[Node, ...] = field(default=())

    def get(self, key: str) -> Node | None:
        for name, node, _ in self.entries:
            if name == key:
                return node
        return None

    def plain(self) -> Any:
        """The node as plain Python data (dicts, lists, scalars); first duplicate key wins."""
        if self.kind == "map":
            out: dict[str, Any] = {}
            for key, node, _ in self.entries:
                out.setdefault(key, node.plain())
            return out
        if self.kind == "seq":
            return [n.plain() for n in self.items]
        return self.value


def location_of(node: Node, key: str | None = None) -> Location:
    """Where ``key`` is written inside mapping ``node``: a scalar's own position, the key's for
    a mapping or list (its first line may be far below), else the node itself."""
    if key is not None and node.kind == "map":
        for name, value, key_loc in node.entries:
            if name == key:
                scalar = value.kind == "scalar" and value.location.line
                return value.location if scalar else key_loc
    return node.location


def holds(value: object, kind: type[_T]) -> TypeGuard[_T]:
    """``value`` has Python type ``kind`` as an author means it: a ``bool`` is never an ``int``
    nor a number, and an ``int`` is a number (``kind`` ``float``)."""
    if isinstance(value, bool) and kind in (int, float):
        return False
    if kind is float and isinstance(value, int):
        return True
    return isinstance(value, kind)


class Reader:
    """Collects positioned diagnostics while typed values are read out of a node tree.

    A read that finds a problem records it and returns a placeholder (``None`` or a default), so
    checking goes on; :attr:`diagnostics` holds every finding in the order it was made.
    """

    def __init__(self) -> None:
        self.diagnostics: list[Diagnostic] = []

    @property
    def failed(self) -> bool:
        """Whether any finding so far is an error (warnings do not fail a read)."""
        return any(d.severity == "error" for d in self.diagnostics)

    def error(
        self, code: str, message: str, location: Location | None, path: str = "", stage: str = ""
    ) -> None:
        """Record a problem at ``location`` (the field ``path``, in workflow ``stage``)."""
        self.diagnostics.append(Diagnostic(code, message, location, path, stage))

    def error_at(
        self, code: str, message: str, node: Node, key: str | None = None, stage: str = ""
    ) -> None:
        """Record a problem with ``key`` of mapping ``node`` (or with ``node`` itself), at the
        place :func:`location_of` finds; the path is ``key``."""
        self.error(code, message, location_of(node, key), key or "", stage)


def _loc(filename: str, raw: RawNode) -> Location:
    mark = raw.start_mark
    return Location(filename, mark.line + 1, mark.column + 1)


class _Converter:
    def __init__(self, filename: str, yaml: YAML) -> None:
        self.filename = filename
        self.constructor = yaml.constructor
        self.diagnostics: list[Diagnostic] = []
        self.open: set[int] = set()  # the collections being converted, root to here
        self.cycles: set[int] = set()  # those already reported as holding themselves

    def error(self, code: str, message: str, location: Location) -> None:
        self.diagnostics.append(Diagnostic(code, message, location))

    def convert(self, raw: RawNode, depth: int) -> Node:
        location = _loc(self.filename, raw)
        if depth > MAX_DEPTH:
            self.error("yaml-too-deep", f"nesting deeper than {MAX_DEPTH} levels", location)
            return Node("scalar", location, None)
        if isinstance(raw, MappingNode | SequenceNode):
            return self._collection(raw, location, depth)
        assert isinstance(raw, ScalarNode)
        value = self.constructor.construct_object(raw, deep=True)
        if isinstance(value, dt.datetime | dt.date):
            value = value.isoformat()  # dates are compared as ISO text, quoted or not
        elif isinstance(value, bytes):
            self.error("yaml-unsupported", "binary scalars are not allowed", location)
            value = None
        return Node("scalar", location, value)

    def _collection(self, raw: MappingNode | SequenceNode, location: Location, depth: int) -> Node:
        if id(raw) in self.open:  # an alias inside its own anchor: expanding it never ends
            if id(raw) not in self.cycles:
                self.cycles.add(id(raw))
                message = "the node anchored here holds an alias to itself (an endless cycle)"
                self.error("yaml-alias-cycle", message, location)
            return Node("scalar", location, None)
        self.open.add(id(raw))
        try:
            if isinstance(raw, MappingNode):
                return self._mapping(raw, location, depth)
            items = tuple(self.convert(item, depth + 1) for item in raw.value)
            return Node("seq", location, items=items)
        finally:
            self.open.discard(id(raw))

    def _mapping(self, raw: MappingNode, location: Location, depth: int) -> Node:
        seen: dict[str, Location] = {}
        entries: list[tuple[str, Node, Location]] = []
        for key_raw, value_raw in raw.value:
            key_loc = _loc(self.filename, key_raw)
            key = (
                self.constructor.construct_object(key_raw, deep=True)
                if isinstance(key_raw, ScalarNode)
                else None
            )
            if not isinstance(key, str) or key_raw.tag == "tag:yaml.org,2002:merge":
                self.error(
                    "yaml-bad-key", f"mapping keys must be plain strings, got {key!r}", key_loc
                )
                continue
            if key in seen:
                self.error(
                    "yaml-duplicate-key",
                    f"duplicate key {key!r} (first defined at {seen[key]})",
                    key_loc,
                )
                continue
            seen[key] = key_loc
            entries.append((key, self.convert(value_raw, depth + 1), key_loc))
        return Node("map", location, entries=tuple(entries))


def _too_large(text: str) -> int | None:
    """The UTF-8 size of ``text`` when it is over :data:`MAX_BYTES` (measured only if it may)."""
    if len(text) * 4 <= MAX_BYTES:
        return None
    size = len(text) if len(text) > MAX_BYTES else len(text.encode("utf-8", "surrogatepass"))
    return size if size > MAX_BYTES else None


def _prescan(text: str, filename: str) -> Diagnostic | None:
    """The first bound ``text`` breaks, found in its parse events before anything is composed.

    ruamel.yaml's composer recurses in C (a document nested 100,000 deep overflows the stack)
    and the tree it builds shares each anchored node among its aliases, which the conversion to
    :class:`Node` expands (nine levels of nine aliases are 387 million nodes). The event stream
    has neither problem: it is read one event at a time, so nesting past :data:`MAX_DEPTH` is
    stopped where it starts, and the nodes every alias stands for (the size of its anchor's
    subtree, known once the anchor has ended) are added up until :data:`MAX_NODES` is passed.
    A syntax error is left to the composer, which reports it the same way."""
    size = _too_large(text)
    if size is not None:
        message = f"the source is {size:,} bytes, over the limit of {MAX_BYTES:,} (1 MiB)"
        return Diagnostic("yaml-too-large", message, Location(filename, 1, 1))
    opened: list[tuple[int, str | None]] = []  # node count at the start, anchor
    sizes: dict[str, int] = {}  # anchor -> nodes it stands for
    nodes = aliases = 0
    events = YAML(typ="safe", pure=False).parse(text)
    try:
        for event in events:
            if len(opened) > MAX_DEPTH and not isinstance(event, CollectionEndEvent):
                message = f"nesting deeper than {MAX_DEPTH} levels"
                return Diagnostic("yaml-too-deep", message, _mark(filename, event))
            if isinstance(event, ScalarEvent):
                nodes += 1
                if event.anchor:
                    sizes[event.anchor] = 1
            elif isinstance(event, CollectionStartEvent):
                opened.append((nodes, event.anchor))
                nodes += 1
            elif isinstance(event, CollectionEndEvent):
                start, anchor = opened.pop()
                if anchor:
                    sizes[anchor] = nodes - start
            elif isinstance(event, AliasEvent):
                aliases += 1
                nodes += sizes.get(event.anchor, 1)  # an unknown anchor: the composer says so
            if nodes > MAX_NODES:
                expanded = f" once its {aliases:,} alias(es) are expanded" if aliases else ""
                message = f"more than {MAX_NODES:,} nodes{expanded}"
                return Diagnostic("yaml-too-large", message, _mark(filename, event))
    finally:
        events.close()
    return None


def _mark(filename: str, event: Any) -> Location:
    mark = event.start_mark
    return Location(filename, mark.line + 1, mark.column + 1)


def compose(text: str, filename: str) -> tuple[Node | None, list[Diagnostic]]:
    """Compose exactly one YAML document; return its tree (``None`` if unusable) and findings.

    A source over :data:`MAX_BYTES`, nested deeper than :data:`MAX_DEPTH` or of more than
    :data:`MAX_NODES` nodes with its aliases expanded is refused (``yaml-too-large``,
    ``yaml-too-deep``) before it is composed; an alias inside its own anchor is
    ``yaml-alias-cycle``."""
    yaml = YAML(typ="safe", pure=False)  # libyaml (ruamel.yaml.clib): ~8x faster, same marks
    converter = _Converter(filename, yaml)
    try:
        bound = _prescan(text, filename)
        if bound is not None:
            return None, [bound]
        documents = list(yaml.compose_all(text))
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = Location(filename, mark.line + 1, mark.column + 1) if mark else Location(filename)
        problem = " ".join(p for p in (exc.problem, exc.context) if p) or str(exc)
        return None, [Diagnostic("yaml-syntax", problem, where)]
    except YAMLError as exc:
        return None, [Diagnostic("yaml-syntax", str(exc), Location(filename))]
    documents = [d for d in documents if d is not None]
    if not documents:
        return None, [
            Diagnostic("yaml-empty", "the file holds no YAML document", Location(filename, 1, 1))
        ]
    if len(documents) > 1:
        converter.error(
            "yaml-multiple-documents",
            "one contract per file: a second YAML document starts here",
            _loc(filename, documents[1]),
        )
    try:
        root = converter.convert(documents[0], 0)
    except (YAMLError, ValueError, RecursionError) as exc:
        return None, [Diagnostic("yaml-syntax", str(exc), _loc(filename, documents[0]))]
    return root, converter.diagnostics
