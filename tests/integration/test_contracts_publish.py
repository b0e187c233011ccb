"""Publishing to a real artefact directory: immutability, idempotence, atomic writes, retention."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from pathlib import Path

import pytest

from accord.adapters.artefacts import INDEX_NAME, ArtefactStore, atomic_write
from accord.canonical import canonical_json
from accord.contracts import compat
from accord.contracts.canonical import contract_digest
from accord.contracts.dsl import parse_text
from accord.contracts.model import MessageContract
from accord.contracts.registry import RetentionPolicy
from accord.contracts.sources import load_directory
from accord.errors import ContractError, ImmutableArtefactError, IncompatibleChange

REPO = Path(__file__).resolve().parents[2]
SOURCES = REPO / "schemas" / "contracts"


def _message(version: int, extra: str = "", head: str = "") -> MessageContract:
    contract = parse_text(
        f"kind: message\nname: m\nwireVersion: {version}\nowner: a\n{head}payload:\n"
        f"  id: {{type: string, required: true}}\n{extra}",
        f"m{version}.yaml",
    )
    assert isinstance(contract, MessageContract)
    return contract


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_publish_writes_artefacts_and_index_then_is_a_no_op(tmp_path: Path) -> None:
    store = ArtefactStore(tmp_path / "published")
    contracts = load_directory(SOURCES)
    first = store.publish(contracts)
    assert len(first.new) == len(contracts) and not first.unchanged
    artefact = json.loads((tmp_path / "published/thumbnail-generation-request/2.json").read_bytes())
    assert artefact["jsonSchema"]["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert artefact["digest"] == contract_digest(
        next(c for c in contracts if (c.name, c.version) == ("thumbnail-generation-request", 2))
    )
    raw = (tmp_path / "published/thumbnail-generation-request/2.json").read_bytes()
    assert raw == canonical_json(artefact) + b"\n"  # stored in canonical form
    index = json.loads((tmp_path / "published" / INDEX_NAME).read_bytes())
    assert len(index["contracts"]) == len(contracts)

    before = _snapshot(tmp_path)
    mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / "published").rglob("*.json")}
    second = store.publish(load_directory(SOURCES))
    assert not second.new and len(second.unchanged) == len(contracts)
    assert _snapshot(tmp_path) == before
    assert mtimes == {p: p.stat().st_mtime_ns for p in (tmp_path / "published").rglob("*.json")}


def test_republishing_different_content_fails_and_writes_nothing(tmp_path: Path) -> None:
    store = ArtefactStore(tmp_path)
    store.publish([_message(1)])
    before = _snapshot(tmp_path)
    with pytest.raises(ImmutableArtefactError) as caught:
        store.publish([_message(1, "  extra: {type: string}\n"), _message(2)])
    assert "message m@1 is already published" in str(caught.value)
    assert "publish the change as version 2" in str(caught.value)
    assert _snapshot(tmp_path) == before  # not even the unrelated new m@2


def test_incompatible_change_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    store = ArtefactStore(tmp_path)
    store.publish([_message(1, "  size: {type: integer, maximum: 10}\n")])
    before = _snapshot(tmp_path)
    with pytest.raises(IncompatibleChange) as caught:
        store.publish([_message(2, "  size: {type: integer, maximum: 99}\n")])
    assert {d.code for d in caught.value.diagnostics} == {"compat-unacknowledged-semantic-change"}
    assert _snapshot(tmp_path) == before


def test_dry_run_decides_but_writes_nothing(tmp_path: Path) -> None:
    plan = ArtefactStore(tmp_path / "p").publish([_message(1)], dry_run=True)
    assert [c.version for c in plan.new] == [1]
    assert not (tmp_path / "p").exists()


def test_a_failed_replace_leaves_no_half_artefact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ArtefactStore(tmp_path)
    store.publish([_message(1)])
    before = _snapshot(tmp_path)

    def crash(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="No space"):
        store.publish([_message(2)])
    monkeypatch.undo()
    assert _snapshot(tmp_path) == before  # no m/2.json, no temp file, index unchanged
    assert [c.version for c in store.published()] == [1]
    assert [c.version for c in store.publish([_message(2)]).new] == [2]  # recovers cleanly


def test_a_crash_between_artefact_and_index_is_recovered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ArtefactStore(tmp_path)
    real_replace = os.replace

    def crash_on_index(src: str, dst: str) -> None:
        if str(dst).endswith(INDEX_NAME):
            raise KeyboardInterrupt  # the process dies after the artefact, before the index
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_index)
    with pytest.raises(KeyboardInterrupt):
        store.publish([_message(1)])
    monkeypatch.undo()
    assert not list(tmp_path.rglob("*.tmp")) and not (tmp_path / INDEX_NAME).exists()
    json.loads((tmp_path / "m" / "1.json").read_bytes())  # complete, parseable
    again = store.publish([_message(1)])
    assert [c.version for c in again.unchanged] == [1]
    assert json.loads((tmp_path / INDEX_NAME).read_bytes())["contracts"][0]["name"] == "m"


def test_atomic_write_replaces_whole_files(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "file.json"
    atomic_write(target, b"one")
    atomic_write(target, b"two")
    assert target.read_bytes() == b"two"
    assert [p.name for p in target.parent.iterdir()] == ["file.json"]


def test_a_tampered_artefact_is_detected_on_read(tmp_path: Path) -> None:
    store = ArtefactStore(tmp_path)
    store.publish([_message(1)])
    path = tmp_path / "m" / "1.json"
    document = json.loads(path.read_bytes())
    document["contract"]["payload"]["id"]["required"] = False
    path.write_bytes(json.dumps(document).encode())
    with pytest.raises(ContractError, match="does not match its contract"):
        store.published()


def test_retire_honours_the_retention_window(tmp_path: Path) -> None:
    store = ArtefactStore(tmp_path)
    old = _message(1, head="status: deprecated\nsupportUntil: 2027-01-01\n")
    store.publish([old, _message(2)])
    policy = RetentionPolicy(dt.timedelta(days=1), dt.timedelta(days=1))
    with pytest.raises(ContractError, match="inside its retention window"):
        store.retire("m@1", dt.datetime(2027, 1, 2, tzinfo=dt.UTC), policy)
    with pytest.raises(ContractError, match="only a deprecated version"):
        store.retire("m@2", dt.datetime(2030, 1, 1, tzinfo=dt.UTC), policy)
    assert (tmp_path / "m" / "1.json").exists()
    store.retire("m@1", dt.datetime(2027, 1, 4, tzinfo=dt.UTC), policy)
    assert not (tmp_path / "m" / "1.json").exists()
    assert [
        e["version"] for e in json.loads((tmp_path / INDEX_NAME).read_bytes())["contracts"]
    ] == [2]


def test_committed_artefacts_match_the_sources(tmp_path: Path) -> None:
    """Every source is published, unchanged: editing a published version without bumping fails."""
    shutil.copytree(REPO / "schemas" / "published", tmp_path / "published")
    plan = ArtefactStore(tmp_path / "published").publish(load_directory(SOURCES), dry_run=True)
    assert not plan.new, [f"{c.name}@{c.version}" for c in plan.new]
    assert len(plan.unchanged) == len(load_directory(SOURCES))


def test_the_published_evolution_of_the_thumbnail_request(tmp_path: Path) -> None:
    store = ArtefactStore(REPO / "schemas" / "published")
    old, new = (
        next(
            c
            for c in store.published()
            if (c.name, c.version) == ("thumbnail-generation-request", v)
        )
        for v in (1, 2)
    )
    assert isinstance(old, MessageContract) and isinstance(new, MessageContract)
    report = compat.diff(old, new)
    by_key = {c.key: (c.backward, c.forward, c.action) for c in report.changes}
    assert by_key["enum-value-added@payload.previewType"] == (True, False, "consumer-analysis")
    assert by_key["limit-relaxed@payload.maxEdge"] == (True, False, "consumer-analysis")
    assert by_key["field-added-optional@payload.generate360Views"] == (
        True,
        False,
        "tolerant-reader",
    )
    assert report.backward_compatible and not report.forward_compatible
    assert not [d for d in compat.check_publish([old], new) if d.severity == "error"]
    assert old.status == "deprecated" and old.support_until == "2027-06-30"
    assert new.payload["maxEdge"].unit == "px" and new.payload["storageConnectionRef"].sensitive
