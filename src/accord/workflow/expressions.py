"""Decision expressions: CEL, compiled and checked once, evaluated in microseconds.

Expressions see two variables: ``context`` (the run input, a map) and ``stages`` (stage name →
``{"result": map, "state": string}``). Compilation uses ``cel-expr-python`` (the C++ CEL
runtime) and is cached by source in a module-level LRU — compiling is pure, so the cache is too.

Admission bounds evaluation cost statically, before anything runs:

- size: at most :data:`MAX_SOURCE_CHARS` characters;
- complexity: at most :data:`MAX_TOKENS` lexical tokens (a linear bound on AST nodes);
- no comprehension macros (``all``, ``exists``, ``exists_one``, ``map``, ``filter``): without
  them a CEL program is loop-free, so its evaluation cost is linear in its size;
- the result type must be ``bool`` where the checker knows it (``dyn`` is allowed and checked
  at run time).

Compile-time errors raise :class:`ExpressionError` with ``expression-syntax``, ``expression-type``,
``expression-too-large``, ``expression-too-costly``, ``expression-comprehension`` or
``expression-dynamic-reference`` (``stages`` not indexed by a literal stage name). At run time
:func:`evaluate` raises ``evaluation-error`` for any CEL error (missing key, bad operand) and for a
non-bool result; the engine then follows the decision's ``on_evaluation_error`` edge.

The references an expression makes (``context.a.b``, ``stages["s"].result.x``) and the paths it
tests with ``has()`` are extracted by :mod:`accord.workflow.cel_refs`, so the type layer can check
them against contracts and refuse reads of optional fields not guarded by ``has()``.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from cel_expr_python import cel

from accord.errors import AccordError
from accord.workflow.cel_refs import DynamicReference, Reference, scan, token_texts

__all__ = [
    "MAX_SOURCE_CHARS",
    "MAX_TOKENS",
    "CompiledExpression",
    "ExpressionError",
    "compile_expression",
    "evaluate",
]

MAX_SOURCE_CHARS = 1024
MAX_TOKENS = 256
_COMPREHENSIONS = frozenset({"all", "exists", "exists_one", "map", "filter"})


class ExpressionError(AccordError):
    code = "expression-error"

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{code}: {message}")


@dataclass(frozen=True, slots=True)
class CompiledExpression:
    source: str
    return_type: str  # CEL type name: ``bool`` or ``dyn``
    references: tuple[Reference, ...]
    tokens: int
    checked: str  # base64 of the serialised checked expression
    program: Any = field(compare=False, repr=False)

    @property
    def summary(self) -> str:
        """The checked form recorded in plans: result type and every path read or tested.

        Derived from the source, so it is stable across CEL runtime versions (the runtime's
        serialised checked AST is not guaranteed byte-stable, which would break plan digests).
        """
        reads = sorted({_ref_text(r) for r in self.references if r.kind == "read"})
        tests = sorted({_ref_text(r) for r in self.references if r.kind == "has"})
        return f"type={self.return_type};reads={','.join(reads)};has={','.join(tests)}"

    @property
    def stages(self) -> tuple[str, ...]:
        """Stage names whose results the expression reads, in first-use order."""
        seen: dict[str, None] = {}
        for r in self.references:
            if r.stage is not None:
                seen.setdefault(r.stage, None)
        return tuple(seen)


def _ref_text(r: Reference) -> str:
    root = "context" if r.stage is None else f"stages[{r.stage!r}].{r.part}"
    return "".join([root, *(f"[{p!r}]" for p in r.path)])


def _env() -> Any:
    t = cel.Type
    return cel.NewEnv(
        variables={
            "context": t.Map(t.STRING, t.DYN),
            "stages": t.Map(t.STRING, t.Map(t.STRING, t.DYN)),
        }
    )


_ENV = _env()


@lru_cache(maxsize=4096)
def compile_expression(source: str) -> CompiledExpression:
    """Compile and check ``source`` once; raise :class:`ExpressionError` on refusal."""
    if len(source) > MAX_SOURCE_CHARS:
        raise ExpressionError(
            "expression-too-large", f"{len(source)} characters (limit {MAX_SOURCE_CHARS})"
        )
    dynamic = ""
    try:
        tokens, references = scan(source)
    except DynamicReference as exc:
        dynamic, tokens, references = str(exc), token_texts(source), ()
    except ValueError as exc:
        raise ExpressionError("expression-syntax", str(exc)) from None
    if len(tokens) > MAX_TOKENS:
        raise ExpressionError("expression-too-costly", f"{len(tokens)} tokens (limit {MAX_TOKENS})")
    for i, tok in enumerate(tokens[1:-1], start=1):
        if tok in _COMPREHENSIONS and tokens[i - 1] == "." and tokens[i + 1] == "(":
            raise ExpressionError(
                "expression-comprehension",
                f"comprehension `.{tok}(…)` is not allowed: its cost is unbounded at admission",
            )
    try:
        program = _ENV.compile(source)
    except RuntimeError as exc:
        raise ExpressionError("expression-syntax", _first_line(str(exc))) from None
    if dynamic:  # reported after syntax, which is the more basic problem
        raise ExpressionError("expression-dynamic-reference", dynamic)
    rtype = program.return_type().name().lower()
    if rtype not in ("bool", "dyn"):
        raise ExpressionError(
            "expression-type", f"expression yields {rtype}, a decision needs bool"
        )
    checked = base64.b64encode(program.serialize()).decode("ascii")
    return CompiledExpression(source, rtype, references, len(tokens), checked, program)


def _first_line(message: str) -> str:
    text = message.replace("INVALID_ARGUMENT: ", "")
    return text.splitlines()[0] if text else "invalid expression"


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def evaluate(
    source: str, context: Mapping[str, Any], stages: Mapping[str, Mapping[str, Any]]
) -> bool:
    """Evaluate a decision; ``ExpressionError("evaluation-error")`` unless it yields a bool."""
    try:
        compiled = compile_expression(source)
    except ExpressionError as exc:
        raise ExpressionError("evaluation-error", exc.message) from None
    try:
        value = compiled.program.eval(data={"context": _plain(context), "stages": _plain(stages)})
        if value.type().name() == "*error*" or value.type() == cel.Type.ERROR:
            raise ExpressionError("evaluation-error", str(value.value()))
        result = value.value()
    except ExpressionError:
        raise
    except Exception as exc:  # the C++ runtime reports conversion failures as assorted types
        raise ExpressionError("evaluation-error", f"{type(exc).__name__}: {exc}") from None
    if not isinstance(result, bool):
        raise ExpressionError(
            "evaluation-error", f"expression yielded {type(result).__name__}, not bool"
        )
    return result
