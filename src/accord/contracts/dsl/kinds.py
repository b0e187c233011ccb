"""The four document kinds of the contract DSL: ``message``, ``worker``, ``action``, ``policy``.

:func:`parse_document` reads ``kind`` first, then checks the document against that kind's closed
key set (anything else is ``dsl-unknown-key``), reads the shared keys
(:mod:`~accord.contracts.dsl.common`) and the kind's own: a message's payload, outcomes, reserved
names and declared tolerances; a capability's request/result references, error codes, queue
(workers only), limits and idempotency; a policy's rules. References to other contracts are
returned as :class:`~accord.contracts.dsl.common.Reference` values with their locations, for
:mod:`accord.contracts.dsl` to resolve across the whole set.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Literal, cast

from accord.contracts.dsl.common import (
    CAPABILITY_NAME,
    CODE,
    CONTRACT_NAME,
    IDEMPOTENCY,
    KEYS,
    REF,
    REQUIRED,
    Reference,
    check_changes,
    parse_common,
)
from accord.contracts.dsl.fields import parse_fields
from accord.contracts.dsl.reader import ContractReader
from accord.contracts.model import (
    CapabilityContract,
    Contract,
    ContractRef,
    Limits,
    MessageContract,
    PolicyContract,
    Tolerance,
)
from accord.contracts.yamlsource import Node
from accord.errors import Location

__all__ = ["CAPABILITY_NAME", "CONTRACT_NAME", "Reference", "parse_document"]


def parse_document(
    reader: ContractReader, root: Node, *, source: Location
) -> tuple[Contract | None, list[Reference]]:
    """Parse one document; ``None`` when any problem was reported."""
    before = len(reader.diagnostics)
    if root.kind != "map":
        reader.error("dsl-wrong-type", "a contract document must be a mapping", root.location, "")
        return None, []
    kind_node = root.get("kind")
    if kind_node is None:
        reader.error("dsl-missing-key", "required key 'kind' is missing", root.location, "kind")
        return None, []
    kind = reader.scalar(kind_node, "kind", str)
    if kind not in KEYS:
        if kind is not None:
            reader.error(
                "dsl-bad-kind",
                f"kind must be one of {', '.join(KEYS)}, got {kind!r}",
                kind_node.location,
                "kind",
            )
        return None, []
    entries = reader.mapping(root, "", KEYS[kind], ("name", "owner", *REQUIRED[kind])) or {}
    refs: list[Reference] = []
    common = parse_common(reader, entries, kind)
    if kind == "message":
        contract: Any = _message(reader, entries, common, refs, source)
    elif kind == "policy":
        contract = _policy(reader, entries, common, refs, source)
    else:
        contract = _capability(reader, entries, common, refs, source, kind=kind)
    if len(reader.diagnostics) > before:
        return None, refs
    return cast(Contract, contract), refs


def _message(
    reader: ContractReader,
    e: dict[str, Node],
    common: dict[str, Any],
    refs: list[Reference],
    source: Location,
) -> MessageContract | None:
    version = reader.positive_int(e["wireVersion"], "wireVersion") if "wireVersion" in e else None
    payload = parse_fields(reader, e["payload"], "payload") if "payload" in e else None
    kw: dict[str, Any] = {}
    if "outcomes" in e:
        pattern = r"^[a-z][a-z0-9-]*(@[1-9][0-9]*)?$"
        outcomes = reader.texts(e["outcomes"], "outcomes", pattern, "name or name@version") or []
        kw["outcomes"] = tuple(name for name, _ in outcomes)
        refs += [
            Reference(n, node.location, f"outcomes[{i}]") for i, (n, node) in enumerate(outcomes)
        ]
    if "reserved" in e:
        kw["reserved"] = tuple(n for n, _ in reader.texts(e["reserved"], "reserved") or ())
    if "tolerates" in e:
        kw["tolerates"] = _tolerates(reader, e["tolerates"], version)
    if "compatibility" in e:
        mode = reader.scalar(e["compatibility"], "compatibility", str)
        if mode not in ("backward", "forward", "full", "none"):
            reader.error(
                "dsl-bad-value",
                "compatibility must be backward, forward, full or none",
                e["compatibility"].location,
                "compatibility",
            )
        kw["compatibility"] = mode
    if "transitive" in e:
        kw["transitive"] = reader.scalar(e["transitive"], "transitive", bool)
    if "maxBytes" in e:
        kw["max_bytes"] = reader.positive_int(e["maxBytes"], "maxBytes")
    check_changes(reader, common, version, e.get("changes"))
    if payload is not None:
        _check_reserved(reader, payload, kw.get("reserved", ()), e["payload"])
    if version is None or payload is None or None in common.values() or None in kw.values():
        return None
    return MessageContract(
        wire_version=version, payload=MappingProxyType(payload), source=source, **common, **kw
    )


def _check_reserved(
    reader: ContractReader, payload: dict[str, Any], reserved: tuple[str, ...], node: Node
) -> None:
    def walk(fields: dict[str, Any], prefix: str, node: Node | None) -> None:
        for name, spec in fields.items():
            path = f"{prefix}{name}"
            if path in reserved:
                keys = {k: loc for k, _, loc in node.entries} if node is not None else {}
                reader.error(
                    "dsl-reserved-field",
                    f"field {path!r} uses a reserved name",
                    keys.get(name, spec.location),
                    f"payload.{path}",
                )
            if spec.fields is not None:
                walk(dict(spec.fields), f"{path}.", None)
            if spec.items is not None and spec.items.fields is not None:
                walk(dict(spec.items.fields), f"{path}[].", None)

    walk(payload, "", node)


def _tolerates(reader: ContractReader, node: Node, own: int | None) -> tuple[Tolerance, ...]:
    if node.kind != "seq":
        reader.error("dsl-wrong-type", "tolerates must be a list", node.location, "tolerates")
        return ()
    out = []
    for index, item in enumerate(node.items):
        path = f"tolerates[{index}]"
        e = reader.mapping(item, path, ("version", "fields"), ("version", "fields"))
        if not e or "version" not in e or "fields" not in e:
            continue
        version = reader.positive_int(e["version"], f"{path}.version")
        fields = reader.texts(e["fields"], f"{path}.fields")
        if version is not None and version == own:
            reader.error(
                "dsl-tolerance",
                "a tolerance names another wire version, not its own",
                e["version"].location,
                f"{path}.version",
            )
        if version is not None and fields:
            out.append(Tolerance(version, tuple(f for f, _ in fields)))
    return tuple(out)


def _ref(
    reader: ContractReader, e: dict[str, Node], key: str, refs: list[Reference]
) -> ContractRef | None:
    if key not in e:
        return None
    text = reader.text(e[key], key, REF, "name@version")
    if text is None:
        return None
    refs.append(Reference(text, e[key].location, key))
    return ContractRef.parse(text)


def _capability(
    reader: ContractReader,
    e: dict[str, Node],
    common: dict[str, Any],
    refs: list[Reference],
    source: Location,
    *,
    kind: str,
) -> CapabilityContract | None:
    version = reader.positive_int(e["version"], "version") if "version" in e else None
    kw: dict[str, Any] = {
        "request": _ref(reader, e, "request", refs),
        "result": _ref(reader, e, "result", refs),
    }
    if "errors" in e:
        kw["errors"] = tuple(c for c, _ in reader.texts(e["errors"], "errors", CODE) or ())
    if "queue" in e:
        if kind == "action":
            reader.error(
                "dsl-action-queue",
                "an action runs in the engine and has no queue",
                e["queue"].location,
                "queue",
            )
        kw["queue"] = reader.text(e["queue"], "queue", r"^[a-z][a-z0-9.-]*$")
    if "limits" in e:
        kw["limits"] = _limits(reader, e["limits"])
    if "idempotency" in e:
        kw["idempotency"] = reader.scalar(e["idempotency"], "idempotency", str)
        if kw["idempotency"] not in IDEMPOTENCY:
            reader.error(
                "dsl-bad-value",
                f"idempotency must be one of {', '.join(IDEMPOTENCY)}",
                e["idempotency"].location,
                "idempotency",
            )
    if "cacheable" in e:
        kw["cacheable"] = reader.scalar(e["cacheable"], "cacheable", bool)
    check_changes(reader, common, version, e.get("changes"))
    if version is None or None in common.values() or None in kw.values():
        return None
    return CapabilityContract(
        kind=cast(Literal["worker", "action"], kind), version=version, source=source, **common, **kw
    )


def _limits(reader: ContractReader, node: Node) -> Limits | None:
    keys = {"timeMs": "time_ms", "memoryBytes": "memory_bytes", "inputBytes": "input_bytes"}
    e = reader.mapping(node, "limits", keys)
    if e is None:
        return None
    values = {keys[k]: reader.positive_int(v, f"limits.{k}") for k, v in e.items()}
    return None if None in values.values() else Limits(**values)


def _policy(
    reader: ContractReader,
    e: dict[str, Node],
    common: dict[str, Any],
    refs: list[Reference],
    source: Location,
) -> PolicyContract | None:
    version = reader.positive_int(e["version"], "version") if "version" in e else None
    rules = None
    if "rules" in e:
        if e["rules"].kind != "map" or not e["rules"].entries:
            reader.error(
                "dsl-wrong-type", "rules must be a non-empty mapping", e["rules"].location, "rules"
            )
        else:
            rules = MappingProxyType(e["rules"].plain())
    applies: list[ContractRef] = []
    if "appliesTo" in e:
        for index, (text, node) in enumerate(
            reader.texts(e["appliesTo"], "appliesTo", REF, "name@version") or ()
        ):
            refs.append(Reference(text, node.location, f"appliesTo[{index}]"))
            applies.append(ContractRef.parse(text))
    check_changes(reader, common, version, e.get("changes"))
    if version is None or rules is None or None in common.values():
        return None
    return PolicyContract(
        version=version, rules=rules, applies_to=tuple(applies), source=source, **common
    )
