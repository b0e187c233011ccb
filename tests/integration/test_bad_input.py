"""Bad input at the command line is a clear one-line refusal, never a crash nor a hang.

Each case runs the real ``accord`` binary as a subprocess (a segfault or a runaway parse must be
seen as what it is, not caught by an in-process runner) with a timeout, and checks: a non-zero
exit, one error line that names the bad part, no Python traceback, and a quick finish.

- hostile YAML (nesting 100,000 deep in flow and block style, an alias bomb, a self-referencing
  alias, a 50 MB source) for ``accord contracts lint`` and ``accord workflow check``;
- an integer of 5,000 digits in a message for ``accord contracts validate``;
- malformed store and transport URLs for ``runs list``, ``engine reconcile``, ``engine run`` and
  ``worker run`` (``demo`` opens them through the same ``open_engine``, after its contract phase
  has published and generated in the repository, so it is not run here);
- handler names that are not ``MODULE[:ATTR]`` for ``accord worker run``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tests.services import ensure_redis

ROOT = Path(__file__).resolve().parents[2]
ACCORD = ROOT / ".venv" / "bin" / "accord"
TIMEOUT_S = 20
FAST_S = 10  # well under the timeout: a bounded refusal, not a parse that happened to end
WORKER = "accord_worker_thumbnail_render.handler:worker"


def accord(
    *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> tuple[int, str, float]:
    """Run ``accord ARGS``; the exit code, stdout+stderr, and the seconds it took."""
    start = time.monotonic()
    done = subprocess.run(
        [str(ACCORD), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, "COLUMNS": "80", **(env or {})},
        check=False,
    )
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


def assert_refused(
    rc: int, out: str, elapsed: float, *names: str, codes: tuple[int, ...] = (1, 2)
) -> str:
    """A clean refusal: exit in ``codes``, no traceback, fast, and one line naming every name."""
    assert "Traceback" not in out, out[-3000:]
    assert rc in codes, (rc, out[-3000:])
    assert elapsed < FAST_S, f"took {elapsed:.1f}s"
    lines = [line for line in out.splitlines() if all(n in line for n in names)]
    assert lines, f"no line names {names}:\n{out[-3000:]}"
    return lines[0]


# -- 1. hostile YAML ----------------------------------------------------------------------------

DEPTH = 100_000


def _flow_deep(path: Path) -> None:
    path.write_text("kind: message\npayload: " + "[" * DEPTH + "]" * DEPTH + "\n")


def _flow_map_deep(path: Path) -> None:
    path.write_text("kind: message\npayload: " + "{a: " * DEPTH + "b" + "}" * DEPTH + "\n")


def _block_deep(path: Path) -> None:
    path.write_text("kind: message\npayload:\n  " + "- " * DEPTH + "x\n")


def _indent_deep(path: Path) -> None:  # 1,000 levels of indentation (100,000 would be 5 GB)
    path.write_text("kind: message\npayload:\n" + "".join(" " * i + "k:\n" for i in range(1, 1001)))


def _alias_bomb(path: Path) -> None:
    lines = ["kind: message", "a0: &a0 [" + ", ".join(["lol"] * 9) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    path.write_text("\n".join(lines) + "\n")


def _alias_cycle(path: Path) -> None:  # a node that holds itself nine times over
    path.write_text("kind: message\npayload: &x [" + ", ".join(["*x"] * 9) + "]\n")


def _huge(path: Path) -> None:
    row = "  field: {type: string, required: true, minLength: 1, maxLength: 128}\n"
    with path.open("w") as f:
        f.write("kind: message\npayload:\n")
        f.write(row * (50_000_000 // len(row)))


HOSTILE = {
    "flow-deep": (_flow_deep, "yaml-too-deep"),
    "flow-map-deep": (_flow_map_deep, "yaml-too-deep"),
    "block-deep": (_block_deep, "yaml-too-deep"),
    "indent-deep": (_indent_deep, "yaml-too-deep"),
    "alias-bomb": (_alias_bomb, "yaml-too-large"),
    "alias-cycle": (_alias_cycle, "yaml-alias-cycle"),
    "50MB": (_huge, "yaml-too-large"),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_contract_source_is_refused_fast(tmp_path: Path, kind: str) -> None:
    make, code = HOSTILE[kind]
    source = tmp_path / f"{kind}.yaml"
    make(source)
    rc, out, elapsed = accord("contracts", "lint", str(source))
    line = assert_refused(rc, out, elapsed, str(source), code)
    assert line.startswith(f"{source}:"), line  # file:line:column first


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_workflow_source_is_refused_fast(tmp_path: Path, kind: str) -> None:
    make, code = HOSTILE[kind]
    source = tmp_path / f"{kind}.yaml"
    make(source)
    rc, out, elapsed = accord("workflow", "check", str(source))
    line = assert_refused(rc, out, elapsed, str(source), code, codes=(1,))
    assert line.startswith(f"{source}:"), line


def test_hostile_source_in_a_contracts_directory_is_refused(tmp_path: Path) -> None:
    """The catalog a workflow is checked against is read with the same bounds."""
    contracts = tmp_path / "contracts"
    contracts.mkdir()
    _alias_bomb(contracts / "bomb.yaml")
    workflow = ROOT / "workflows" / "model-ingest.yaml"
    rc, out, elapsed = accord("workflow", "check", str(workflow), "--contracts", str(contracts))
    assert_refused(rc, out, elapsed, "bomb.yaml", "yaml-too-large", codes=(1,))


def test_the_bounds_leave_real_sources_alone() -> None:
    rc, out, _ = accord("contracts", "lint")
    assert rc == 0, out
    assert "error" not in out.lower().replace("0 error(s)", ""), out


# -- 2. integers too long to convert ------------------------------------------------------------

LONG = "9" * 5_000


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ('{"entryId": ' + LONG + "}", "entryId"),
        ('{"entryId": "e", "tags": ["a", -' + LONG + "]}", "tags[1]"),
        ('{"entryId": "e", "x y": {"n": ' + LONG + "}}", '["x y"].n'),
    ],
    ids=["top", "array-negative", "nested"],
)
def test_validate_refuses_an_integer_too_long_naming_its_path(
    tmp_path: Path, body: str, path: str
) -> None:
    message = tmp_path / "message.json"
    message.write_text(body)
    rc, out, elapsed = accord("contracts", "validate", "catalogue-entry@1", str(message))
    line = assert_refused(rc, out, elapsed, path, "5000 digits", codes=(1,))
    assert len(line) < 300, line
    rc, out, elapsed = accord("contracts", "validate", "catalogue-entry@1", str(message), "--json")
    assert_refused(rc, out, elapsed, codes=(1,))
    doc = json.loads(out)
    assert doc["ok"] is False and doc["accepted"] is False
    assert [v["path"] for v in doc["violations"]] == [path]
    assert doc["violations"][0]["code"] == "number-too-long"


def test_validate_keeps_long_digit_strings(tmp_path: Path) -> None:
    """Digits inside a string are text, not a number: the contract judges them (too long)."""
    message = tmp_path / "message.json"
    message.write_text('{"entryId": "' + LONG + '"}')
    rc, out, _ = accord("contracts", "validate", "catalogue-entry@1", str(message), "--json")
    assert "Traceback" not in out and rc == 1, out
    codes = {v["path"]: v["code"] for v in json.loads(out)["violations"]}
    assert codes.get("entryId") not in (None, "number-too-long"), codes


# -- 3. malformed store and transport URLs ------------------------------------------------------

# (url, a fragment the error must name)
COMMON_BAD = [
    ("file:///etc/passwd", "'file'"),
    ("http://169.254.169.254/latest/meta-data", "'http'"),
    ("::::", "unknown scheme"),
    ("bogus://x", "'bogus'"),
    ("sqlite:///{tmp}/x.db?busy_timeout_ms=abc", "busy_timeout_ms='abc'"),
    ("sqlite:///{tmp}/x.db?frob=1", "frob"),
]
UNREACHABLE = "redis://127.0.0.1:1/0"  # nothing listens there
STORE_BAD = [
    *COMMON_BAD,
    (UNREACHABLE, "127.0.0.1:1"),
    ("redis://127.0.0.1:6379/0?prefix=a:b", "'a:b'"),
    ("redis://127.0.0.1:6379/0?prefix=a*", "'a*'"),
    ("redis://127.0.0.1:6379/abc", "'abc'"),
    ("redis://127.0.0.1:99999/0", "99999"),
    ("redis://[::1/0", "[::1"),
    ("redis://127.0.0.1:6379/0?shards=x", "shards='x'"),
]
TRANSPORT_BAD = [
    *COMMON_BAD,
    ("bullmq://127.0.0.1:6379/0?prefix=a:b", "'a:b'"),
    ("bullmq://127.0.0.1:6379/0?prefix=a*", "'a*'"),
    ("bullmq://127.0.0.1:6379/abc", "'abc'"),
    ("bullmq://127.0.0.1:6379/0?stalled_ms=x", "stalled_ms='x'"),
    ("bullmq://127.0.0.1:6379/0?frob=1", "frob"),
    ("bullmq://[::1/0", "[::1"),
    ("amqp://guest:guest@127.0.0.1:5672/?confirm_ms=x", "confirm_ms='x'"),
    ("amqp://guest:guest@127.0.0.1:5672/?prefix=a*", "'a*'"),
    ("amqp://guest:guest@127.0.0.1:5672/?frob=1", "frob"),
]


def assert_error_line(out: str, _first: str, names: str) -> None:
    """The refusal is one ``error:`` line naming the bad part (a log line may name the URL too)."""
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and names in errors[0], out[-3000:]


def _url(template: str, tmp: Path) -> str:
    return template.replace("/{tmp}", str(tmp))


def _store_commands(url: str, tmp: Path) -> dict[str, list[str]]:
    return {
        "runs list": ["runs", "list", "--store", url],
        "engine reconcile": ["engine", "reconcile", "--store", url, "--transport", "memory://"],
        "engine run": ["engine", "run", "--store", url, "--transport", "memory://"],
        "worker run": ["worker", "run", WORKER, "--transport", "memory://", "--store", url,
                       "--state", str(tmp / "state")],
    }  # fmt: skip


def _transport_commands(url: str, tmp: Path) -> dict[str, list[str]]:
    return {
        "engine reconcile": ["engine", "reconcile", "--store", "memory://", "--transport", url],
        "engine run": ["engine", "run", "--store", "memory://", "--transport", url],
        "worker run": ["worker", "run", WORKER, "--transport", url, "--state", str(tmp / "st")],
    }  # fmt: skip


STORE_CASES = [
    pytest.param(
        template, names, command, id=f"{template}-{command}",
    )
    for template, names in STORE_BAD
    for command in ("runs list", "engine reconcile", "engine run", "worker run")
]  # fmt: skip

TRANSPORT_CASES = [
    pytest.param(template, names, command, id=f"{command}-{template}")
    for template, names in TRANSPORT_BAD
    for command in ("engine reconcile", "engine run", "worker run")
]

Outcome = tuple[int, str, float]
AT_ONCE = 4  # processes at a time: each mostly imports, so two cores keep four busy


@pytest.fixture(scope="module")
def url_outcomes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[str, str, str], Outcome]:
    """The command of every URL case selected in this session, each run as its own ``accord``
    process, ``AT_ONCE`` at a time rather than one after another (a refusal is mostly the
    interpreter starting). Keyed by (``store`` or ``transport``, URL template, command); each
    test below checks its own."""
    ensure_redis()
    builders = {
        test_bad_store_url_is_a_one_line_refusal.__name__: ("store", _store_commands),
        test_bad_transport_url_is_a_one_line_refusal.__name__: ("transport", _transport_commands),
    }
    cases: dict[tuple[str, str, str], list[str]] = {}
    for item in request.session.items:
        if isinstance(item, pytest.Function) and item.originalname in builders:
            kind, commands = builders[item.originalname]
            template, command = (str(item.callspec.params[k]) for k in ("template", "command"))
            tmp = tmp_path_factory.mktemp("case")
            cases[(kind, template, command)] = commands(_url(template, tmp), tmp)[command]
    with ThreadPoolExecutor(AT_ONCE) as pool:
        done = {key: pool.submit(accord, *args) for key, args in cases.items()}
        return {key: future.result() for key, future in done.items()}


@pytest.mark.parametrize(("template", "names", "command"), STORE_CASES)
def test_bad_store_url_is_a_one_line_refusal(
    url_outcomes: dict[tuple[str, str, str], Outcome], command: str, template: str, names: str
) -> None:
    rc, out, elapsed = url_outcomes[("store", template, command)]
    assert_error_line(out, assert_refused(rc, out, elapsed, names), names)


@pytest.mark.parametrize(("template", "names", "command"), TRANSPORT_CASES)
def test_bad_transport_url_is_a_one_line_refusal(
    url_outcomes: dict[tuple[str, str, str], Outcome], command: str, template: str, names: str
) -> None:
    rc, out, elapsed = url_outcomes[("transport", template, command)]
    assert_error_line(out, assert_refused(rc, out, elapsed, names), names)


# -- 4. handler names that are not MODULE[:ATTR] ------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    ["../../etc/passwd", "a/b", "..", "x.y:z:w", "", ":worker", "json:", "json", "json:dumps",
     "failing_at_import", "accord_worker_thumbnail_render.handler:nope", ".relative"],
)  # fmt: skip
def test_bad_handler_name_is_a_usage_error(tmp_path: Path, spec: str) -> None:
    (tmp_path / "failing_at_import.py").write_text("raise RuntimeError('boom at import')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    rc, out, elapsed = accord(
        "worker", "run", spec, "--transport", "memory://", "--state", str(tmp_path / "s"),
        cwd=tmp_path, env=env,
    )  # fmt: skip
    line = assert_refused(rc, out, elapsed, "error:", repr(spec), codes=(2,))
    assert len(out.strip().splitlines()) == 1, out
    assert len(line) < 300, line
