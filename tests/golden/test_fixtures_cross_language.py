"""Golden fixtures: Python and TypeScript give the expected verdict, paths and normalised value.

Every fixture under ``schemas/fixtures`` runs through the Python validator and, in one ``node``
process, through the compiled TypeScript package; both must match the fixture's expectation
(which was derived by construction, not by running either validator).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from accord.contracts.dsl import load_directory
from accord.contracts.fixtures import derive_fixtures
from accord.contracts.model import MessageContract
from accord.contracts.validate import Validator

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "schemas" / "fixtures"
PACKAGE = ROOT / "bindings" / "typescript"


def _contracts() -> dict[tuple[str, int], MessageContract]:
    found = load_directory(ROOT / "schemas" / "contracts")
    return {(c.name, c.wire_version): c for c in found if isinstance(c, MessageContract)}


def _fixtures() -> dict[str, dict[str, Any]]:
    out = {}
    for path in sorted(FIXTURES.glob("*/*/*/*.json")):
        out[path.relative_to(FIXTURES).as_posix()] = json.loads(path.read_text("utf-8"))
    return out


@pytest.fixture(scope="module")
def ts_verdicts() -> dict[str, Any]:
    if not (PACKAGE / "node_modules" / "typescript").is_dir():
        pytest.fail("bindings/typescript/node_modules is missing: run `make node` (npm ci)")
    build = subprocess.run(
        ["node", "node_modules/typescript/bin/tsc", "-p", "tsconfig.json"],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run(
        ["node", "dist/cli/verdicts.js", str(FIXTURES)],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    verdicts: dict[str, Any] = json.loads(run.stdout)
    return verdicts


def test_every_message_contract_has_valid_and_invalid_fixtures() -> None:
    names = {tuple(k.split("/")[:3]) for k in _fixtures()}
    for name, version in _contracts():
        assert (name, str(version), "valid") in names
        assert (name, str(version), "invalid") in names


def test_committed_derived_fixtures_are_current() -> None:
    committed = _fixtures()
    for (name, version), contract in _contracts().items():
        if contract.status == "planned":
            continue
        for rel, fixture in derive_fixtures(contract).items():
            assert committed.get(f"{name}/{version}/{rel}") == fixture, f"{name}@{version} {rel}"


def test_python_verdicts_match_every_fixture() -> None:
    contracts = _contracts()
    fixtures = _fixtures()
    assert len(fixtures) > 300
    for key, fixture in fixtures.items():
        name, version = key.split("/")[:2]
        result = Validator.for_contract(contracts[(name, int(version))]).validate(
            fixture["message"]
        )
        expect = fixture["expect"]
        assert (result.ok, result.paths) == (expect["ok"], expect["paths"]), key
        assert key.split("/")[2] == ("valid" if expect["ok"] else "invalid"), key
        if expect["ok"]:
            assert result.value == expect["normalised"], key


def test_typescript_agrees_with_python_on_every_fixture(ts_verdicts: dict[str, Any]) -> None:
    fixtures = _fixtures()
    assert sorted(ts_verdicts) == sorted(fixtures)
    contracts = _contracts()
    for key, fixture in fixtures.items():
        name, version = key.split("/")[:2]
        py = Validator.for_contract(contracts[(name, int(version))]).validate(fixture["message"])
        ts = ts_verdicts[key]
        assert (ts["ok"], ts["paths"]) == (py.ok, py.paths), key
        assert (ts["ok"], ts["paths"]) == (fixture["expect"]["ok"], fixture["expect"]["paths"])
        if py.ok:
            assert ts["normalised"] == py.value == fixture["expect"]["normalised"], key


RAW_CASES: list[tuple[str, int, bytes]] = [
    ("progress", 1, b'{"percent": 10, "message": "a,\\"b{[: x"}'),
    ("progress", 1, b'{"percent": 10, "percent": 11}'),
    ("technical-metadata", 1, b'{"bounds": {"min": {"x": 1, "x": 2}}}'),
    ("technical-metadata", 1, b'{"bounds": {"min": {"x": 1}, "max": {"x": 2}}}'),
    ("progress", 1, b'{"percent": NaN}'),
    ("progress", 1, b'{"percent": -Infinity}'),
    ("progress", 1, b'{"percent": 1, "message": "\xff"}'),
    ("progress", 1, b'\xef\xbb\xbf{"percent": 1}'),
    ("progress", 1, b'{"percent": 1, "message": "\\ud800"}'),
    ("progress", 1, b'{"percent": 1, "message": "\\ud83d\\ude00"}'),
    ("progress", 1, b'{"percent": 1, "message": ' + b"[" * 70 + b"]" * 70 + b"}"),
    ("progress", 1, b'{"percent": 1, "message": ' + b"[" * 63 + b"]" * 63 + b"}"),
    ("progress", 1, b'{"percent": 1, "message": "' + b"x" * (1 << 20) + b'"}'),
    ("progress", 1, b'{"percent": '),
    ("progress", 1, b""),
]


def test_typescript_agrees_with_python_on_raw_input(
    tmp_path: Path, ts_verdicts: dict[str, Any]
) -> None:
    """Byte-level refusals (size, encoding, duplicates, depth, …) carry the same codes."""
    assert ts_verdicts  # the fixture builds the package
    import base64

    cases = [
        {"contract": c, "version": v, "base64": base64.b64encode(data).decode()}
        for c, v, data in RAW_CASES
    ]
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps(cases))
    run = subprocess.run(
        ["node", "dist/cli/verdicts.js", "--raw", str(spec)],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    ts = json.loads(run.stdout)
    contracts = _contracts()
    expected_codes = [
        [],
        ["duplicate-key"],
        ["duplicate-key"],
        None,
        ["non-finite-number"],
        ["non-finite-number"],
        ["not-utf8"],
        ["malformed-json"],
        ["lone-surrogate"],
        [],
        ["too-deep"],
        None,
        ["oversized"],
        ["malformed-json"],
        ["malformed-json"],
    ]
    for (name, version, data), verdict, codes in zip(RAW_CASES, ts, expected_codes, strict=True):
        py = Validator.for_contract(contracts[(name, version)]).validate(data)
        py_verdict = {
            "ok": py.ok,
            "codes": [v.code for v in py.violations],
            "paths": [v.path for v in py.violations],
        }
        assert verdict == py_verdict, data[:80]
        if codes is not None:
            assert py_verdict["codes"] == codes, data[:80]
