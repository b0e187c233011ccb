"""Typed bindings: ``${context.a.b}`` and ``${stages["name"].result.a.b}`` in stage inputs.

A binding is a *whole* string value: ``"${context.modelId}"`` becomes a :class:`~plan.Binding`
and is replaced at run time by the value it names, with its own type (not stringified).
Partial interpolation such as ``"x-${context.a}"`` is **refused** (``binding-interpolation``):
building strings is a worker's job, and a refusal keeps every input's type knowable at compile
time. A literal ``${`` can still be sent by escaping it as ``$${``.

Grammar (identifiers are ``[A-Za-z_][A-Za-z0-9_]*``; quoted keys allow any other name)::

    binding   := "${" ( "context" segment* | "stages" key ".result" segment* ) "}"
    key       := "[" quoted "]" | "." identifier
    segment   := "." identifier | "[" quoted "]"

The resolver is pure: :func:`resolve_inputs` walks literal dicts/lists, replaces every binding,
and raises :class:`BindingError` with exactly one of three codes — ``binding-missing`` (a key or
stage result is absent), ``binding-null`` (present but ``null``), ``binding-type`` (present with
the wrong type for ``Binding.expected_type``, or a path step through a non-object).

A sealed value (:mod:`accord.contracts.sealing`, a string token standing for a sensitive field)
binds wherever its field's type is expected: the machine never sees inside it, the part that
opens it checks it. A path *into* a sealed value is ``binding-type`` (it is not an object here).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from accord.contracts.sealing import is_sealed
from accord.errors import AccordError
from accord.workflow.values import Binding, InputValue

__all__ = [
    "BindingError",
    "canonical_text",
    "find_bindings",
    "is_binding_text",
    "parse_binding",
    "parse_input",
    "resolve_binding",
    "resolve_inputs",
    "type_matches",
]

BINDING_CODES = ("binding-missing", "binding-null", "binding-type")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_WHOLE = re.compile(r"^\$\{(?P<body>.*)\}$", re.DOTALL)
_SEGMENT = re.compile(
    r"""\.(?P<ident>[A-Za-z_][A-Za-z0-9_]*)|\[\s*(?:"(?P<dq>[^"\\]*)"|'(?P<sq>[^'\\]*)')\s*\]"""
)


class BindingError(AccordError):
    """A binding that cannot be parsed (compile time) or resolved (run time)."""

    code = "binding-error"

    def __init__(self, code: str, path: str, message: str) -> None:
        self.code = code
        self.path = path
        self.message = message
        super().__init__(f"{code} at {path or '$'}: {message}")


def is_binding_text(value: object) -> bool:
    """``True`` when ``value`` is a string that mentions ``${`` (unescaped)."""
    return isinstance(value, str) and "${" in value.replace("$${", "")


def _segments(text: str, start: int, raw: str) -> tuple[str, ...]:
    out: list[str] = []
    pos = start
    while pos < len(text):
        m = _SEGMENT.match(text, pos)
        if m is None:
            raise BindingError("binding-syntax", "", f"cannot parse {raw!r} at offset {pos}")
        out.append(m.group("ident") or m.group("dq") or m.group("sq") or "")
        pos = m.end()
    return tuple(out)


def canonical_text(stage: str | None, path: tuple[str, ...]) -> str:
    """One spelling per binding (``.ident`` where possible, ``["key"]`` otherwise), so equal
    bindings written differently give equal plans and digests."""
    parts = [f".{p}" if _IDENT.match(p) else f'["{p}"]' for p in path]
    root = "context" if stage is None else f'stages["{stage}"].result'
    return "${" + root + "".join(parts) + "}"


def parse_binding(text: str, expected_type: str | None = None) -> Binding:
    """Parse a whole-string binding; raise ``BindingError`` (``binding-syntax`` /
    ``binding-interpolation``) when ``text`` is not exactly one binding."""
    m = _WHOLE.match(text.strip())
    if m is None or "${" in m.group("body"):
        raise BindingError(
            "binding-interpolation",
            "",
            f"{text!r}: a binding must be the whole value; string interpolation is not supported",
        )
    body = m.group("body").strip()
    if body == "context" or body.startswith(("context.", "context[")):
        path = _segments(body, 7, text)
        return Binding("context", path, None, expected_type, canonical_text(None, path))
    if body.startswith(("stages.", "stages[")):
        segs = _segments(body, 6, text)
        if len(segs) < 2 or segs[1] != "result" or not segs[0]:
            raise BindingError(
                "binding-syntax", "", f'{text!r}: expected stages["name"].result.<path>'
            )
        path = segs[2:]
        return Binding("stage", path, segs[0], expected_type, canonical_text(segs[0], path))
    raise BindingError(
        "binding-syntax", "", f"{text!r}: a binding reads `context.…` or `stages[…].result.…`"
    )


def parse_input(value: Any) -> InputValue:
    """Turn a DSL input value into plan form: binding strings become :class:`Binding`, nested
    dicts/lists are converted recursively, ``$${`` unescapes to a literal ``${``."""
    if isinstance(value, str):
        if is_binding_text(value):
            return parse_binding(value)
        return value.replace("$${", "${")
    if isinstance(value, Mapping):
        return {str(k): parse_input(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [parse_input(v) for v in value]
    return value


def find_bindings(value: InputValue, path: str = "") -> list[tuple[str, Binding]]:
    """Every binding inside ``value`` with its dotted input path."""
    if isinstance(value, Binding):
        return [(path, value)]
    found: list[tuple[str, Binding]] = []
    if isinstance(value, Mapping):
        for k, v in value.items():
            found += find_bindings(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += find_bindings(v, f"{path}[{i}]")
    return found


def type_matches(expected: str, value: Any) -> bool:
    """Whether ``value`` is of contract type ``expected`` (``integer`` excludes ``bool``)."""
    if expected == "string":
        return isinstance(value, str)
    if expected == "boolean":
        return isinstance(value, bool)
    if expected == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if expected == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if expected == "object":
        return isinstance(value, Mapping)
    if expected == "array":
        return isinstance(value, list | tuple)
    return True


def resolve_binding(
    binding: Binding,
    context: Mapping[str, Any],
    results: Mapping[str, Mapping[str, Any]],
    where: str = "",
) -> Any:
    """The value ``binding`` names, type-checked; see the module docstring for the codes."""
    if binding.source == "stage":
        stage = binding.stage or ""
        if stage not in results:
            raise BindingError(
                "binding-missing", where, f"{binding.raw}: stage {stage!r} has no result"
            )
        current: Any = results[stage]
    else:
        current = context
    for i, key in enumerate(binding.path):
        if current is None:
            step = ".".join(binding.path[:i]) or "(root)"
            raise BindingError("binding-null", where, f"{binding.raw}: {step} is null")
        if not isinstance(current, Mapping):
            step = ".".join(binding.path[:i]) or "(root)"
            raise BindingError("binding-type", where, f"{binding.raw}: {step} is not an object")
        if key not in current:
            raise BindingError(
                "binding-missing",
                where,
                f"{binding.raw}: field {'.'.join(binding.path[: i + 1])} is missing",
            )
        current = current[key]
    if current is None:
        raise BindingError("binding-null", where, f"{binding.raw}: value is null")
    if (
        binding.expected_type
        and not type_matches(binding.expected_type, current)
        and not is_sealed(current)  # a sealed value has the type of what it seals
    ):
        raise BindingError(
            "binding-type",
            where,
            f"{binding.raw}: expected {binding.expected_type}, got {type(current).__name__}",
        )
    return current


def _resolve(value: InputValue, context: Any, results: Any, where: str) -> Any:
    if isinstance(value, Binding):
        return resolve_binding(value, context, results, where)
    if isinstance(value, Mapping):
        return {k: _resolve(v, context, results, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_resolve(v, context, results, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def resolve_inputs(
    inputs: Mapping[str, InputValue],
    context: Mapping[str, Any],
    results: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any]:
    """Replace every binding in ``inputs`` (recursively) by its value; pure."""
    return {k: _resolve(v, context, results, k) for k, v in inputs.items()}
