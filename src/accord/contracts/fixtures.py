"""Golden fixtures derived from a contract: valid and invalid messages with expected verdicts.

Pure and deterministic: :func:`derive_fixtures` builds each message *by construction* and states
the expected outcome from the construction alone (the failing paths it planted, the normalised
value by its own small default-filling walk), never by running a validator, so the fixtures can
catch a validator that is wrong. Every binding must reproduce the verdict and the failing paths.

Derived cases: ``minimal`` (only what must be sent; optional fields omitted, defaults filled),
``full`` (every field), ``null-<path>`` (explicit null where nullable); and invalid
``missing-``, ``null-`` (not nullable), ``unknown-`` (at the root, in nested objects and array
items), ``type-`` (wrong type), limit violations (``too-long-``, ``too-small-``, ``pattern-``,
``enum-``, ``format-``, …) and ``many-errors`` (several paths at once, to prove *every* path is
reported). Fixture file = ``{"description", "message", "expect": {"ok", "paths", "normalised"?}}``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from accord.contracts.fixture_values import message_of as _message
from accord.contracts.fixture_values import violations_of
from accord.contracts.model import FieldSpec, MessageContract
from accord.contracts.normalise import plain
from accord.contracts.paths import join

__all__ = ["derive_fixtures", "file_slug"]

Fixture = dict[str, Any]
_WRONG: dict[str, Any] = {
    "string": 12345,
    "integer": "12",
    "number": "1.5",
    "boolean": "true",
    "object": ["not", "an", "object"],
    "array": {"not": "an array"},
}


def file_slug(path: str) -> str:
    """A file-name-safe spelling of a field path: ``views[0].angle`` → ``views-0-angle``."""
    out = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in path)
    return "-".join(piece for piece in out.split("-") if piece) or "root"


def _with_defaults(fields: Mapping[str, FieldSpec], value: Any) -> Any:
    """The DSL's default rule, written independently of the validators it is used to test."""
    if not isinstance(value, dict):
        return value
    out = dict(value)
    for name, spec in sorted(fields.items()):
        if name not in out and spec.has_default:
            out[name] = plain(spec.default)
        if name in out:
            out[name] = _field_defaults(spec, out[name])
    return out


def _field_defaults(spec: FieldSpec, value: Any) -> Any:
    if spec.type == "object" and spec.fields is not None:
        return _with_defaults(spec.fields, value)
    if spec.type == "array" and spec.items is not None and isinstance(value, list):
        return [_field_defaults(spec.items, item) for item in value]
    return value


def _walk(
    fields: Mapping[str, FieldSpec], message: dict[str, Any], path: str
) -> Iterator[tuple[str, FieldSpec, dict[str, Any], str]]:
    """Every (path, spec, holder object, name) reachable in ``message`` (first array item only)."""
    for name, spec in sorted(fields.items()):
        here = join(path, name)
        yield here, spec, message, name
        value = message.get(name)
        item_spec, holder = spec, value
        if spec.type == "array" and spec.items is not None and isinstance(value, list) and value:
            item_spec, holder, here = spec.items, value[0], join(here, 0)
        if item_spec.type == "object" and item_spec.fields is not None and isinstance(holder, dict):
            yield from _walk(item_spec.fields, holder, here)


def derive_fixtures(contract: MessageContract) -> dict[str, Fixture]:
    """``{"valid/<case>.json" | "invalid/<case>.json": fixture}`` for ``contract``."""
    fields = contract.payload
    out: dict[str, Fixture] = {}

    def valid(case: str, description: str, message: dict[str, Any]) -> None:
        expect = {"ok": True, "paths": [], "normalised": _with_defaults(fields, message)}
        out[f"valid/{case}.json"] = {
            "description": description,
            "message": message,
            "expect": expect,
        }

    def invalid(case: str, description: str, message: Any, paths: list[str]) -> None:
        expect = {"ok": False, "paths": sorted(set(paths))}
        out[f"invalid/{case}.json"] = {
            "description": description,
            "message": message,
            "expect": expect,
        }

    valid(
        "minimal",
        "only required fields without defaults; defaults fill the rest",
        _message(fields, full=False),
    )
    valid("full", "every declared field present", _message(fields, full=True))
    full = _message(fields, full=True)
    for path, spec, _, _ in _walk(fields, full, ""):
        slug = file_slug(path)
        if spec.nullable:
            valid(
                f"null-{slug}",
                f"explicit null where {path} is nullable",
                _set(contract, path, None),
            )
        else:
            invalid(
                f"null-{slug}",
                f"explicit null where {path} is not nullable",
                _set(contract, path, None),
                [path],
            )
        if spec.required and not spec.has_default:
            invalid(
                f"missing-{slug}",
                f"required field {path} is missing",
                _set(contract, path, _DELETE),
                [path],
            )
        invalid(
            f"type-{slug}",
            f"{path} has the wrong type ({spec.type} expected)",
            _set(contract, path, _WRONG[spec.type]),
            [path],
        )
        for kind, bad, suffix in violations_of(spec):
            invalid(
                f"{kind}-{slug}",
                f"{path}{suffix} breaks its {kind} rule",
                _set(contract, path, bad),
                [path + suffix],
            )
        if spec.type in {"object", "array"}:
            inner = _unknown_target(spec, path)
            if inner is not None:
                invalid(
                    f"unknown-{file_slug(inner)}",
                    f"unknown member inside {path}",
                    _set(contract, inner, "surprise"),
                    [inner],
                )
    invalid(
        "unknown-root",
        "a member the contract does not declare",
        {**full, "unexpectedField": True},
        ["unexpectedField"],
    )
    invalid("not-an-object", "the message is not an object", ["not", "an", "object"], [""])
    required = [n for n, s in sorted(fields.items()) if s.required and not s.has_default]
    many = {**full, "unexpectedField": 1}
    paths = ["unexpectedField"]
    for name in required[:1]:
        del many[name]
        paths.append(name)
    typed = [n for n in sorted(fields) if n not in required[:1]][:2]
    for name in typed:
        many[name] = _WRONG[fields[name].type]
        paths.append(name)
    invalid("many-errors", "several failures at once; every failing path is reported", many, paths)
    return out


_DELETE = object()


def _unknown_target(spec: FieldSpec, path: str) -> str | None:
    if spec.type == "object" and spec.fields is not None:
        return join(path, "unexpectedField")
    items = spec.items if spec.type == "array" else None
    if items is not None and items.type == "object" and items.fields is not None:
        return join(join(path, 0), "unexpectedField")
    return None


def _set(contract: MessageContract, path: str, value: Any) -> dict[str, Any]:
    """The full message with the member at ``path`` replaced (or deleted with ``_DELETE``)."""
    message = _message(contract.payload, full=True)
    holder: Any = message
    steps = _steps(path)
    for step in steps[:-1]:
        holder = holder[step]
    last = steps[-1]
    if value is _DELETE:
        del holder[last]
    else:
        holder[last] = value
    return message


def _steps(path: str) -> list[str | int]:
    steps: list[str | int] = []
    for piece in path.split("."):
        name, _, rest = piece.partition("[")
        steps.append(name)
        if rest:
            steps.append(int(rest.rstrip("]")))
    return steps
