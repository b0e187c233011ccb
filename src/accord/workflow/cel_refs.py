"""What a CEL decision reads: a small lexer and a scanner for ``context``/``stages`` paths.

The CEL runtime checks syntax and types; it does not say *which fields* an expression reads. The
contract layer needs exactly that, so this module lexes the source (strings, numbers,
identifiers, operators; ``//`` comments) and collects every static path rooted at a variable:

- ``context.a.b`` / ``context["a"].b`` → ``Reference("context", None, "result", ("a", "b"))``
- ``stages["s"].result.x`` / ``stages.s.result.x`` → ``Reference("stage", "s", "result", ("x",))``
- ``stages["s"].state`` → ``Reference("stage", "s", "state", ())``

``stages`` itself must always be indexed by a literal name (``DynamicReference`` otherwise):
the engine hands an expression only the stages it names, and the contract layer must know which
results it reads. A path ends at the first dynamic index, method call (``.size()``) or
operator. A path written as the argument of the ``has()`` macro is recorded with
``kind="has"``: the type layer treats the tested field (and only that field) as guarded anywhere
in the same expression. The guard is not flow-sensitive (``!has(x) && x`` passes admission);
such a read fails at run time as an ``evaluation-error`` and follows the decision's
``on_evaluation_error`` edge.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["DynamicReference", "Reference", "Token", "scan", "token_texts"]

_TOKEN = re.compile(
    r"""
    (?P<space>\s+|//[^\n]*)
  | (?P<string>[rRbB]{0,2}(?:'''[\s\S]*?'''|\"\"\"[\s\S]*?\"\"\"
               |'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"))
  | (?P<number>0[xX][0-9a-fA-F]+[uU]?|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[uU]?|\.\d+(?:[eE][+-]?\d+)?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>==|!=|<=|>=|&&|\|\||[-+*/%<>!?:.,()\[\]{}])
    """,
    re.VERBOSE,
)


class DynamicReference(ValueError):
    """``stages`` used other than as ``stages["name"]``: what it reads cannot be checked."""


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # string | number | ident | op
    text: str
    offset: int

    def string_value(self) -> str | None:
        if self.kind != "string":
            return None
        body = self.text.lstrip("rRbB")
        quote = 3 if body[:3] in ("'''", '"""') else 1
        return body[quote:-quote]


@dataclass(frozen=True, slots=True)
class Reference:
    source: Literal["context", "stage"]
    stage: str | None
    part: Literal["result", "state"]
    path: tuple[str, ...]
    kind: Literal["read", "has"] = "read"
    offset: int = 0  # character offset of the root variable in the source


def _lex(source: str) -> list[Token]:
    tokens: list[Token] = []
    pos = 0
    while pos < len(source):
        m = _TOKEN.match(source, pos)
        if m is None:
            raise ValueError(f"unexpected character {source[pos]!r} at column {pos + 1}")
        kind = m.lastgroup or "op"
        if kind != "space":
            tokens.append(Token(kind, m.group(), pos))
        pos = m.end()
    return tokens


def _key(tokens: list[Token], i: int) -> tuple[str | None, int]:
    """A static key at ``tokens[i]``: ``.ident`` or ``["str"]``; returns (key, next index)."""
    if i + 1 < len(tokens) and tokens[i].text == "." and tokens[i + 1].kind == "ident":
        if i + 2 < len(tokens) and tokens[i + 2].text == "(":
            return None, i  # a method call, not a field
        return tokens[i + 1].text, i + 2
    if (
        i + 2 < len(tokens)
        and tokens[i].text == "["
        and tokens[i + 1].kind == "string"
        and tokens[i + 2].text == "]"
    ):
        return tokens[i + 1].string_value(), i + 3
    return None, i


def _reference(tokens: list[Token], i: int) -> Reference | None:
    root = tokens[i]
    guarded = (
        i >= 2
        and tokens[i - 1].text == "("
        and tokens[i - 2].text == "has"
        and (i < 3 or tokens[i - 3].text != ".")
    )
    kind: Literal["read", "has"] = "has" if guarded else "read"
    j = i + 1
    stage: str | None = None
    part: Literal["result", "state"] = "result"
    if root.text == "stages":
        stage, j = _key(tokens, j)
        if stage is None:
            raise DynamicReference(
                f"column {root.offset + 1}: `stages` must be indexed by a literal stage name"
            )
        which, j = _key(tokens, j)
        if which == "state":
            return Reference("stage", stage, "state", (), kind, root.offset)
        if which != "result":
            return None
    path: list[str] = []
    while True:
        key, j = _key(tokens, j)
        if key is None:
            break
        path.append(key)
    source: Literal["context", "stage"] = "stage" if stage is not None else "context"
    return Reference(source, stage, part, tuple(path), kind, root.offset)


def token_texts(source: str) -> list[str]:
    """The lexical tokens of ``source`` (``ValueError`` on a character CEL cannot lex)."""
    return [t.text for t in _lex(source)]


def scan(source: str) -> tuple[list[str], tuple[Reference, ...]]:
    """Token texts of ``source`` and every static reference it makes; ``ValueError`` on a
    character CEL cannot lex."""
    tokens = _lex(source)
    refs: list[Reference] = []
    for i, tok in enumerate(tokens):
        if tok.kind != "ident" or tok.text not in ("context", "stages"):
            continue
        if i > 0 and tokens[i - 1].text == ".":
            continue  # a field that happens to be called ``context``
        ref = _reference(tokens, i)
        if ref is not None:
            refs.append(ref)
    return [t.text for t in tokens], tuple(refs)
