"""The monorepo's packages as the development rules see them, read from file texts (no I/O).

Every folder under ``workers/`` holding a ``pyproject.toml`` (Python) or a ``package.json``
(TypeScript) is a package. What the rules need of one is read from its own files:

- its **capabilities**: the ``name@version`` it binds. In Python, the first argument of
  ``worker.handler(...)`` or ``worker.bind(...)``, a string literal or a module-level string
  constant; in TypeScript, an exported ``…CAPABILITY… = "name@version"`` constant;
- the **contracts its source names** (any ``name@version`` in a string, docstrings included), so
  a worker that validates a contract of its own beside its capability's is reached by it;
- the **local packages it installs**: a Python dependency whose name is another package's
  distribution name, a TypeScript ``file:`` dependency (``file:../../bindings/typescript`` is
  the language's commons, another ``workers/`` folder a local package);
- the **repository folders its tests read** (``Path(__file__).parents[3] / "examples" /
  "models"``): a change there reaches the worker, and its sparse checkout must hold them;
- whether it has a suite of its own (``tests/`` or ``test/``) and a ``Containerfile``.

A package with a suite is a *worker* of the rules (it gets a CI file); one without is a library
(``workers/meshes``) that reaches the workers installing it.
"""

from __future__ import annotations

import ast
import json
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

__all__ = [
    "COMMONS",
    "REF_PATTERN",
    "Language",
    "Layout",
    "LayoutError",
    "Package",
    "read_package",
]

Language: TypeAlias = Literal["python", "typescript"]

# what every package of a language installs from the repository besides its own folder
COMMONS: Mapping[Language, tuple[str, ...]] = {
    "python": ("src", "pyproject.toml"),
    "typescript": ("bindings/typescript",),
}
REF_PATTERN = re.compile(r"\b([a-z][a-z0-9-]*(?:\.[a-z0-9][a-z0-9-]*)*)@([1-9][0-9]*)\b")
_CAPABILITY_REF = re.compile(r"^[a-z][a-z0-9-]*(?:\.[a-z0-9][a-z0-9-]*)*@[1-9][0-9]*$")
_TS_CAPABILITY = re.compile(
    r"export\s+const\s+\w*CAPABILITY\w*\s*(?::\s*string\s*)?=\s*[\"']([^\"']+)[\"']"
)
_ROOT_READ = re.compile(r"parents\[3\]\s*/\s*[\"']([\w.-]+)[\"'](?:\s*/\s*[\"']([\w-]+)[\"'])?")
_DIST = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class LayoutError(ValueError):
    """A package file that cannot be read; ``where`` names the file (and line)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where


@dataclass(frozen=True, slots=True)
class Package:
    name: str  # the folder name under workers/
    language: Language
    distribution: str  # the pyproject or package.json name
    capabilities: tuple[str, ...] = ()
    mentions: frozenset[str] = frozenset()  # name@version strings its source names
    requires: tuple[str, ...] = ()  # distribution names (Python) / repository folders (file:)
    reads: tuple[str, ...] = ()  # repository folders its tests read
    has_suite: bool = False
    containerfile: bool = False
    version: str = "0.1.0"

    @property
    def path(self) -> str:
        return f"workers/{self.name}"

    @property
    def image(self) -> str:
        return f"accord-worker-{self.name}"


def _normal(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _python_source(path: str, text: str) -> tuple[list[str], set[str]]:
    """The capabilities a Python module binds and every ``name@version`` its strings name."""
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        raise LayoutError(f"{path}:{exc.lineno or 0}", f"not Python: {exc.msg}") from exc
    constants: dict[str, str] = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign | ast.AnnAssign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    constants[target.id] = node.value.value
    bound: list[str] = []
    mentions: set[str] = set()
    for item in ast.walk(tree):
        if isinstance(item, ast.Constant) and isinstance(item.value, str):
            mentions.update(f"{n}@{v}" for n, v in REF_PATTERN.findall(item.value))
        if (
            isinstance(item, ast.Call)
            and isinstance(item.func, ast.Attribute)
            and item.func.attr in {"handler", "bind"}
            and item.args
        ):
            arg = item.args[0]
            value = (
                arg.value
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                else constants.get(arg.id)
                if isinstance(arg, ast.Name)
                else None
            )
            if value is not None and _CAPABILITY_REF.match(value):
                bound.append(value)
    return bound, mentions


def _reads(texts: Iterable[str]) -> set[str]:
    found: set[str] = set()
    for text in texts:
        for first, second in _ROOT_READ.findall(text):
            found.add(f"{first}/{second}" if second else first)
    return found


def read_package(name: str, files: Mapping[str, str]) -> Package:
    """The :class:`Package` ``workers/<name>`` is, from ``files`` (paths relative to its folder:
    the manifest, its sources under ``src/`` and its tests; other files only by name)."""
    where = f"workers/{name}"
    capabilities: list[str] = []
    mentions: set[str] = set()
    has_suite = any(p.startswith(("tests/", "test/")) for p in files)
    tests = [t for p, t in files.items() if p.startswith(("tests/", "test/"))]
    if "pyproject.toml" in files:
        language: Language = "python"
        try:
            project = tomllib.loads(files["pyproject.toml"]).get("project", {})
        except tomllib.TOMLDecodeError as exc:
            raise LayoutError(f"{where}/pyproject.toml", f"not TOML: {exc}") from exc
        distribution = project.get("name")
        if not isinstance(distribution, str):
            raise LayoutError(f"{where}/pyproject.toml", "project.name is missing")
        requires = tuple(
            _normal(m.group(1))
            for dep in project.get("dependencies", [])
            if (m := _DIST.match(dep)) is not None
        )
        version = str(project.get("version", "0.0.0"))
        for path, text in sorted(files.items()):
            if path.startswith("src/") and path.endswith(".py"):
                bound, named = _python_source(f"{where}/{path}", text)
                capabilities.extend(bound)
                mentions |= named
    elif "package.json" in files:
        language = "typescript"
        try:
            manifest = json.loads(files["package.json"])
        except json.JSONDecodeError as exc:
            raise LayoutError(f"{where}/package.json:{exc.lineno}", f"not JSON: {exc.msg}") from exc
        distribution = manifest.get("name")
        if not isinstance(distribution, str):
            raise LayoutError(f"{where}/package.json", "name is missing")
        version = str(manifest.get("version", "0.0.0"))
        folders: list[str] = []
        for spec in manifest.get("dependencies", {}).values():
            if isinstance(spec, str) and spec.startswith("file:"):
                parts = [where, *spec.removeprefix("file:").split("/")]
                resolved: list[str] = []
                for part in "/".join(parts).split("/"):
                    if part == "..":
                        if resolved:
                            resolved.pop()
                    elif part not in {"", "."}:
                        resolved.append(part)
                folders.append("/".join(resolved))
        requires = tuple(folders)
        for path, text in sorted(files.items()):
            if path.startswith("src/") and path.endswith(".ts"):
                capabilities.extend(
                    c for c in _TS_CAPABILITY.findall(text) if _CAPABILITY_REF.match(c)
                )
                mentions.update(f"{n}@{v}" for n, v in REF_PATTERN.findall(text))
    else:
        raise LayoutError(where, "neither pyproject.toml nor package.json")
    return Package(
        name=name,
        language=language,
        distribution=distribution,
        capabilities=tuple(dict.fromkeys(capabilities)),
        mentions=frozenset(mentions),
        requires=requires,
        reads=tuple(sorted(r for r in _reads(tests) if not r.startswith("schemas"))),
        has_suite=has_suite,
        containerfile="Containerfile" in files,
        version=version,
    )


@dataclass(frozen=True)
class Layout:
    """Every package under ``workers/``, by folder name."""

    packages: Mapping[str, Package]
    _by_distribution: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "_by_distribution", {_normal(p.distribution): n for n, p in self.packages.items()}
        )

    @property
    def workers(self) -> list[Package]:
        """The packages with a suite of their own, by name: each gets a CI file."""
        return [self.packages[n] for n in sorted(self.packages) if self.packages[n].has_suite]

    def direct_requires(self, name: str) -> tuple[str, ...]:
        """The local packages ``name`` names as dependencies, by folder name."""
        found: list[str] = []
        for dep in self.packages[name].requires:
            local = self._by_distribution.get(dep) or (
                dep.removeprefix("workers/") if dep.startswith("workers/") else None
            )
            if local is not None and local in self.packages and local != name:
                found.append(local)
        return tuple(sorted(set(found)))

    def local_requires(self, name: str) -> tuple[str, ...]:
        """The local packages ``name`` installs, directly or through another, by name."""
        return tuple(n for n in self.install_order(name) if n != name)

    def install_order(self, name: str) -> tuple[str, ...]:
        """``name``'s local packages, each after those it installs, then ``name`` itself."""
        order: list[str] = []

        def visit(current: str, stack: frozenset[str]) -> None:
            for dep in self.direct_requires(current):
                if dep not in order and dep not in stack:
                    visit(dep, stack | {current})
            if current not in order:
                order.append(current)

        visit(name, frozenset())
        return tuple(order)
