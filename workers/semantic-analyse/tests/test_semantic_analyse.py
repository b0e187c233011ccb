"""semantic.analyse@4: tags follow from the geometry, with reasons, deterministically."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import trimesh
from accord_worker_semantic_analyse import handle
from accord_worker_semantic_analyse.analysis import describe
from hypothesis import given
from hypothesis import strategies as st

from accord.contracts.dsl import load_file
from accord.contracts.validate import validate
from accord.worker.sandbox import Limits
from accord.worker.sdk import Context
from accord.worker.storage import StorageMap

SAMPLES = Path(__file__).resolve().parents[3] / "examples" / "models"


def _analyse(root: Path, name: str, max_tags: int = 20) -> dict[str, Any]:
    (root / "acme" / "models").mkdir(parents=True, exist_ok=True)
    model_id = name.rsplit(".", 1)[0]
    shutil.copy(SAMPLES / name, root / "acme" / "models" / name)
    services = {
        "storage": StorageMap.local(root),
        "limits": Limits(cpu_seconds=30, wall_seconds=60),
    }
    ctx = Context(
        "run-1", "semantic-analysis", 1, "f1", "acme", "semantic.analyse@4", "k", {}, services
    )
    return handle({"modelId": model_id, "maxTags": max_tags}, ctx)


def _labels(result: dict[str, Any]) -> set[str]:
    return {t["label"] for t in result["tags"]}


def test_torus_and_plate_have_a_through_hole(tmp_path: Path) -> None:
    for name in ("torus.obj", "plate-with-hole.stl"):
        got = _analyse(tmp_path, name)
        assert {"has-through-holes", "flat", "mirror-symmetric"} <= _labels(got), got
        assert any(d.startswith("has-through-holes: genus 1") for d in got["descriptors"])


def test_sphere_is_convex_compact_and_sphere_like(tmp_path: Path) -> None:
    got = _analyse(tmp_path, "icosphere.ply")
    assert {"convex", "compact", "sphere-like"} <= _labels(got)
    assert "has-through-holes" not in _labels(got) and got["confidence"] >= 0.9


def test_two_part_bracket_is_multi_part_and_elongated(tmp_path: Path) -> None:
    got = _analyse(tmp_path, "bracket.glb")
    assert {"multi-part", "elongated"} <= _labels(got)
    assert "convex" not in _labels(got)


@pytest.mark.parametrize("name", ["torus.obj", "bracket.glb", "cube.3mf"])
def test_results_satisfy_semantic_analysis_v1(tmp_path: Path, name: str) -> None:
    contract = load_file(SAMPLES.parents[1] / "schemas" / "contracts" / "semantic-analysis.v1.yaml")
    checked = validate(contract, _analyse(tmp_path, name))
    assert checked.ok, checked.violations


@pytest.mark.parametrize(("height", "thin"), [(0.4, True), (20.0, False)])
def test_thin_walls_are_found_by_inward_rays(tmp_path: Path, height: float, thin: bool) -> None:
    (tmp_path / "acme" / "models").mkdir(parents=True)
    trimesh.creation.box(extents=(40.0, 40.0, height)).export(tmp_path / "acme/models/sheet.stl")
    services = {"storage": StorageMap.local(tmp_path), "limits": Limits(cpu_seconds=30)}
    ctx = Context(
        "run", "semantic-analysis", 1, "f", "acme", "semantic.analyse@4", "k", {}, services
    )
    got = handle({"modelId": "sheet"}, ctx)
    assert ("thin-walls" in _labels(got)) is thin
    if thin:
        (reason,) = [d for d in got["descriptors"] if d.startswith("thin-walls")]
        assert "thickness 0.4 units (taken as mm)" in reason


def test_analysis_is_deterministic_and_bounded(tmp_path: Path) -> None:
    first = _analyse(tmp_path, "torus.obj", max_tags=2)
    assert first == _analyse(tmp_path, "torus.obj", max_tags=2)
    assert len(first["tags"]) == 2
    assert all(0 <= t["confidence"] <= 1 for t in first["tags"])


_measures = st.fixed_dictionaries(
    {
        "extents": st.lists(st.floats(0, 1e6), min_size=3, max_size=3).map(
            lambda e: sorted(e, reverse=True)
        ),
        "mirror": st.lists(st.floats(0, 1), min_size=3, max_size=3),
        "closed": st.booleans(),
        "components": st.one_of(st.none(), st.integers(1, 50)),
        "solidity": st.one_of(st.none(), st.floats(0, 1)),
        "sphericity": st.one_of(st.none(), st.floats(0, 1)),
        "genus": st.one_of(st.none(), st.integers(0, 10)),
        "thickness": st.one_of(st.none(), st.floats(0, 100)),
        "size": st.floats(0, 1e6),
        "faces": st.integers(1, 10**6),
        "units": st.sampled_from(["mm", "cm", "m", "in", "unknown"]),
    }
)


@given(_measures, st.integers(1, 50))
def test_describe_always_fits_the_result_contract(measures: dict[str, Any], max_tags: int) -> None:
    got = describe(measures, max_tags)
    assert len(got["tags"]) <= max_tags and len(got["descriptors"]) <= 32
    assert all(re.fullmatch(r"[a-z0-9][a-z0-9 -]{0,39}", t["label"]) for t in got["tags"])
    assert all(0 <= t["confidence"] <= 1 for t in got["tags"]) and 0 <= got["confidence"] <= 1
    assert all(1 <= len(d) <= 200 for d in got["descriptors"])
    labels = [t["label"] for t in got["tags"]]
    assert len(labels) == len(set(labels))


@pytest.mark.parametrize("extents", [[10.0, 1.0, 1.0], [10.0, 10.0, 1.0]])
def test_shape_tags_follow_extents(extents: list[float]) -> None:
    base = {"mirror": [0, 0, 0], "closed": True, "components": 1, "solidity": 0.8,
            "sphericity": 0.5, "genus": 0, "thickness": 5.0, "size": 10.0,
            "faces": 100}  # fmt: skip
    labels = {t["label"] for t in describe({**base, "extents": extents}, 20)["tags"]}
    assert ("elongated" in labels) == (extents[0] / extents[1] >= 2.5)
    assert ("flat" in labels) == (extents[1] / extents[2] >= 3)
