"""Checks built on the diff: compatibility modes, declared tolerance, and the publish gate.

Everything here returns :class:`~accord.errors.Diagnostic` values (severity ``error`` refuses,
``warning`` informs) naming the contract references, the change key and the field path, with the
location of the new field when the loader recorded one.

The publish gate (:func:`check_publish`) compares the new version with the latest earlier one, or
with every retained one when the new version says ``transitive``, in the new version's own
``compatibility`` mode. Per change action:

- ``new-wire-version``: refused unless the new wire version is greater than the compared one
  (equal versions with different content count as no bump). With a bump it still needs an
  acknowledgement in the change record when it fails a direction the mode requires: the mode is a
  promise about roll-out order, and breaking it is a decision to be recorded, not a side effect.
- ``consumer-analysis``: refused without an acknowledgement (a :class:`ChangeRecord` for the new
  version listing the change key ``code@path`` or the bare code).
- ``tolerant-reader``: passes when the reader's declared tolerance covers it; otherwise an error
  when the failing direction is one the mode requires, else a warning (the roll-out order the mode
  promises is still safe; the other order would need the tolerance).
An acknowledgement that matches no change is reported as a warning, so a typo cannot hide.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from accord.contracts.compat.diffs import diff, directions, relative_path
from accord.contracts.compat.rules import CA, TR, WV, Change
from accord.contracts.model import FieldSpec, MessageContract
from accord.errors import Diagnostic

__all__ = ["acknowledgements", "check", "check_publish", "tolerance_check", "unknown_fields"]


def _targets(history: Sequence[MessageContract], transitive: bool) -> list[MessageContract]:
    ordered = sorted(history, key=lambda c: c.wire_version)
    return ordered if transitive else ordered[-1:]


def _diagnostic(
    code: str, new: MessageContract, change: Change, text: str, severity: str = "error"
) -> Diagnostic:
    return Diagnostic(
        code=code,
        message=text,
        location=change.location or new.source,
        path=change.path,
        severity=severity,
    )


def check(
    history: Sequence[MessageContract], new: MessageContract, mode: str, transitive: bool = False
) -> list[Diagnostic]:
    """Confluent-style check: every change must hold in each direction ``mode`` requires."""
    wanted = directions(mode)
    out: list[Diagnostic] = []
    for old in _targets(history, transitive):
        for change in diff(old, new).changes:
            for direction in wanted:
                if not getattr(change, direction):
                    text = f"{old.ref} -> {new.ref}: {change.message} [{change.key}]"
                    out.append(_diagnostic(f"compat-not-{direction}", new, change, text))
    return _unique(out)


def acknowledgements(new: MessageContract) -> set[str]:
    return {a for r in new.changes if r.version == new.wire_version for a in r.acknowledges}


def check_publish(previous: Sequence[MessageContract], new: MessageContract) -> list[Diagnostic]:
    wanted = directions(new.compatibility)
    acks = acknowledgements(new)
    used: set[str] = set()
    out: list[Diagnostic] = []
    for old in _targets(previous, new.transitive):
        bumped = new.wire_version > old.wire_version
        for change in diff(old, new).changes:
            acked = change.key in acks or change.code in acks
            used.update({change.key, change.code})
            failing = [d for d in ("backward", "forward") if not getattr(change, d)]
            required = [d for d in failing if d in wanted]
            about = f"{new.ref} against {old.ref}: {change.message} [{change.key}]"
            if change.action == WV and not bumped:
                text = f"{about} is breaking and needs a wire version above {old.wire_version}"
                out.append(_diagnostic("compat-breaking-without-wire-bump", new, change, text))
            elif change.action == WV and required and not acked:
                text = (
                    f"{about} breaks {new.compatibility} compatibility; acknowledge "
                    f"'{change.key}' in the change record for version {new.wire_version}"
                )
                out.append(_diagnostic("compat-unacknowledged-breaking-change", new, change, text))
            elif change.action == CA and not acked:
                text = (
                    f"{about} needs consumer analysis; acknowledge '{change.key}' in the change "
                    f"record for version {new.wire_version}"
                )
                out.append(_diagnostic("compat-unacknowledged-semantic-change", new, change, text))
            elif change.action == TR and failing:
                reader = "new" if "backward" in failing else "old"
                writer = old if reader == "new" else new
                text = (
                    f"{about} fails {'/'.join(failing)} for closed readers; the {reader} version "
                    f"must declare tolerates {{version: {writer.wire_version}, fields: "
                    f"[{relative_path(change.path)}]}}"
                )
                severity = "error" if required else "warning"
                out.append(_diagnostic("compat-tolerance-undeclared", new, change, text, severity))
    for ack in sorted(acks - used):
        text = f"{new.ref} acknowledges {ack!r}, which matches no change against earlier versions"
        out.append(
            Diagnostic("compat-stale-acknowledgement", text, new.source, "changes", "", "warning")
        )
    return _unique(out)


def unknown_fields(
    reader: Mapping[str, FieldSpec], writer: Mapping[str, FieldSpec], base: str = ""
) -> Iterator[str]:
    """Paths (tolerance spelling) the writer may send that the reader does not know."""
    for name in sorted(writer):
        path = f"{base}.{name}" if base else name
        if name not in reader:
            yield path
            continue
        r, w = reader[name], writer[name]
        while r.type == w.type == "array" and r.items is not None and w.items is not None:
            r, w, path = r.items, w.items, f"{path}[]"
        if r.type == w.type == "object":
            yield from unknown_fields(r.fields or {}, w.fields or {}, path)


def tolerance_check(consumer: MessageContract, producer: MessageContract) -> list[Diagnostic]:
    """Does ``consumer`` read everything ``producer`` may send, unknown fields included?

    An unknown field the consumer does not tolerate for the producer's wire version is an error;
    a tolerance declared for that version naming a field the producer does not add is a warning.
    """
    unknown = list(unknown_fields(consumer.payload, producer.payload))
    declared = {
        relative_path(p)
        for t in consumer.tolerates
        if t.version == producer.wire_version
        for p in t.fields
    }
    out = [
        Diagnostic(
            "tolerance-undeclared",
            f"{consumer.ref} rejects unknown field '{p}' sent under {producer.ref}; declare "
            f"tolerates {{version: {producer.wire_version}, fields: [{p}]}}",
            consumer.source,
            f"payload.{p}",
        )
        for p in unknown
        if p not in declared
    ]
    out += [
        Diagnostic(
            "tolerance-unused",
            f"{consumer.ref} tolerates '{p}' from {producer.ref}, which does not send it as an "
            "unknown field",
            consumer.source,
            f"payload.{p}",
            severity="warning",
        )
        for p in sorted(declared - set(unknown))
    ]
    return out


def _unique(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    seen: dict[tuple[str, str, str], Diagnostic] = {}
    for d in diagnostics:
        seen.setdefault((d.path, d.code, d.message), d)
    return [seen[k] for k in sorted(seen)]
