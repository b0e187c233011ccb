"""Every reference the code makes to a document or a module resolves in the repository.

Docstrings and comments cite the project's own documents (``docs/architecture.md §4``,
``docs/reliability.md``, ``bench/RESULTS.md``) and modules
(``:mod:`accord.engine.runtime.intake```).
A move or a renamed heading that leaves one dangling fails here, not in a reader's hands.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(
    p
    for folder in ("src/accord", "tests", "bench", "workers")
    for p in (ROOT / folder).rglob("*")
    if p.suffix in {".py", ".lua", ".ts"}
    and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)  # bench/.venvs …
    and "node_modules" not in p.parts
    and "generated" not in p.parts
    and "dist" not in p.parts
)
DOC = re.compile(
    r"(?<![\"'/])\b((?:docs|bench|schemas)/[\w./-]+\.md|[A-Z][A-Za-z]+\.md)(?: (§\d+))?"
)
DESIGN = re.compile(r"\b(ARCHITECTURE|RELIABILITY|COMPATIBILITY|COMPONENTS|STYLE)\b(?:\.md| §)")
ROLE = re.compile(r":(?:mod|class|func|meth|data|attr|exc):`~?(accord(?:\.\w+)+)`")


def _references(pattern: re.Pattern[str]) -> list[tuple[str, re.Match[str], Path]]:
    found = []
    for path in SOURCES:
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in pattern.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{path.relative_to(ROOT)}:{line}", match, path))
    return found


def test_every_cited_document_and_section_exists() -> None:
    missing = []
    cited = _references(DOC)
    assert cited, "the pattern finds no reference at all: the test would prove nothing"
    for where, match, source in cited:
        name, section = match.group(1), match.group(2)
        doc = ROOT / name if "/" in name else source.parent / name  # a bare name: beside its citer
        if not doc.is_file():
            missing.append(f"{where}: {name} does not exist")
            continue
        if section:
            number = section.removeprefix("§")
            heading = re.compile(rf"^#+ {number}\. ", re.M)
            if not heading.search(doc.read_text(encoding="utf-8")):
                missing.append(f"{where}: {name} has no section {section}")
    assert not missing, "\n".join(missing)


def test_no_reference_names_a_document_outside_the_repository() -> None:
    outside = [f"{where}: {m.group(0)}" for where, m, _ in _references(DESIGN)]
    assert not outside, "cite the project's own docs/ instead:\n" + "\n".join(outside)


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_qualified_cross_reference_resolves() -> None:
    cited = _references(ROLE)
    assert cited
    dangling = sorted({f"{w}: {m.group(1)}" for w, m, _ in cited if not _resolves(m.group(1))})
    assert not dangling, "cross-references that do not resolve:\n" + "\n".join(dangling)
