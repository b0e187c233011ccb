"""`accord policy refresh|show`: each refresh a new immutable revision, bad input refused with
the file and field paths, one JSON document with --json in every outcome."""

from __future__ import annotations

import json
from pathlib import Path

from tests.etsy_double.support import CONTRACTS, RULES
from typer.testing import CliRunner

from accord.canonical import digest_of
from accord.cli import app


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def _refresh(source: Path, policies: Path, *extra: str) -> tuple[int, str]:
    where = ["--from", str(source), "--policies", str(policies), "--contracts", str(CONTRACTS)]
    return _run("policy", "refresh", "etsy", *where, *extra)


def test_refresh_writes_revisions_and_leaves_equal_values_alone(tmp_path: Path) -> None:
    source, policies = tmp_path / "limits.json", tmp_path / "policies"
    source.write_text(json.dumps(RULES))
    code, out = _refresh(source, policies, "--json")
    first = json.loads(out)
    assert (
        code == 0 and first["written"] and first["version"] == "marketplace-listing-limits/etsy@1"
    )
    assert first["digest"] == digest_of(RULES)
    code, out = _refresh(source, policies, "--json")
    assert code == 0 and json.loads(out)["written"] is False
    source.write_text("# YAML works too\n" + "\n".join(
        f"{k}: {json.dumps(v)}" for k, v in (RULES | {"maxTags": 5}).items()))  # fmt: skip
    code, out = _refresh(source, policies, "--json")
    second = json.loads(out)
    assert code == 0 and second["version"] == "marketplace-listing-limits/etsy@2"
    folder = policies / "etsy" / "marketplace-listing-limits"
    assert sorted(p.name for p in folder.iterdir()) == ["1.json", "2.json", "current.json"]
    assert json.loads((folder / "1.json").read_text())["rules"]["maxTags"] == 13
    assert json.loads((folder / "current.json").read_text())["revision"] == 2
    code, out = _run("policy", "show", "etsy", "--policies", str(policies), "--json")
    assert code == 0 and json.loads(out)["rules"]["maxTags"] == 5


def test_bad_values_are_refused_with_their_paths_and_nothing_written(tmp_path: Path) -> None:
    source, policies = tmp_path / "limits.json", tmp_path / "policies"
    bad = RULES | {"maxTags": "many", "tagPattern": "[unclosed"}
    del bad["priceMax"]
    source.write_text(json.dumps(bad))
    code, out = _refresh(source, policies, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["exit"] == 1
    paths = {d["path"] for d in doc["diagnostics"]}
    assert paths == {"maxTags", "priceMax"} and all(d["file"] == str(source)
                                                    for d in doc["diagnostics"])  # fmt: skip
    source.write_text(json.dumps(RULES | {"tagPattern": "[unclosed"}))
    code, out = _refresh(source, policies, "--json")
    assert code == 1 and json.loads(out)["diagnostics"][0]["path"] == "tagPattern"
    source.write_text(json.dumps(RULES | {"priceMin": 10, "priceMax": 5}))
    code, out = _refresh(source, policies)
    assert code == 1 and "priceMin is above priceMax" in out and "Traceback" not in out
    assert not policies.exists()


def test_unreadable_or_missing_files_and_unknown_marketplaces_are_refused(tmp_path: Path) -> None:
    source = tmp_path / "broken.yaml"
    source.write_text("titleMaxLength: [\n")
    code, out = _refresh(source, tmp_path / "p", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["diagnostics"][0]["line"] == 2
    code, out = _refresh(tmp_path / "absent.yaml", tmp_path / "p", "--json")
    assert code == 1 and "no such file" in json.loads(out)["error"]
    code, out = _run("policy", "refresh", "amazon", "--from", str(source), "--json")
    assert code == 2 and "no policy shape" in json.loads(out)["error"]
    code, out = _run("policy", "show", "etsy", "--policies", str(tmp_path / "none"), "--json")
    assert code == 1 and json.loads(out)["error"].startswith("no marketplace-listing-limits")
