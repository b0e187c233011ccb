"""Object keys and tenants: every traversal encoding is refused, and no key leaves root/tenant."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accord.errors import StageFailed
from accord.worker.paths import resolve_object, validate_object_key, validate_tenant

HOSTILE_KEYS = [
    "../secret",
    "models/../../secret",
    "models/..",
    "./models/a.stl",
    "/etc/passwd",
    "C:/Windows/win.ini",
    "c:model.stl",
    "models\\..\\secret",
    "..\\secret",
    "models/%2e%2e/secret",
    "%2e%2e/secret",
    "%252e%252e/secret",
    "models%2f..%2fsecret",
    "models/%c0%ae%c0%ae/secret",  # overlong UTF-8 for '.'
    "models/\u2025/secret",  # two-dot leader, folds to '..'
    "models/\uff0e\uff0e/secret",  # fullwidth full stops
    "models\uff0fsecret",  # fullwidth solidus
    "models/a.stl\x00.png",
    "models/\x01a.stl",
    "models//a.stl",
    "",
    "a" * 1025,
]


@pytest.mark.parametrize("key", HOSTILE_KEYS)
def test_hostile_keys_are_refused_as_invalid_object_key(key: str, tmp_path: Path) -> None:
    with pytest.raises(StageFailed) as caught:
        resolve_object(tmp_path, "acme", key)
    assert caught.value.failure_code == "invalid-object-key"
    assert caught.value.retryable is False


@pytest.mark.parametrize("tenant", ["", "../acme", "acme/x", "a" * 65, "ac me", "acme\x00"])
def test_bad_tenants_are_refused(tenant: str) -> None:
    with pytest.raises(StageFailed) as caught:
        validate_tenant(tenant)
    assert caught.value.failure_code == "invalid-object-key"


def test_plain_keys_resolve_under_the_tenant(tmp_path: Path) -> None:
    path = resolve_object(tmp_path, "acme", "models/plate-with-hole.stl")
    assert path == (tmp_path / "acme" / "models" / "plate-with-hole.stl").resolve()


def test_a_symlink_out_of_the_root_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.stl").write_text("solid x\nendsolid x\n")
    base = tmp_path / "root" / "acme"
    base.mkdir(parents=True)
    os.symlink(outside, base / "models")
    os.symlink(outside / "secret.stl", base / "direct.stl")
    for key in ("models/secret.stl", "direct.stl"):
        with pytest.raises(StageFailed) as caught:
            resolve_object(tmp_path / "root", "acme", key)
        assert caught.value.failure_code == "invalid-object-key"


def test_a_tenant_directory_linked_out_of_the_root_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "root").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "root" / "acme")
    with pytest.raises(StageFailed):
        resolve_object(tmp_path / "root", "acme", "a.stl")


def test_a_symlink_inside_the_tenant_is_followed(tmp_path: Path) -> None:
    base = tmp_path / "acme"
    (base / "real").mkdir(parents=True)
    os.symlink(base / "real", base / "alias")
    assert resolve_object(tmp_path, "acme", "alias/a.stl") == (base / "real" / "a.stl").resolve()


_segment = st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=12)


@given(st.lists(_segment, min_size=1, max_size=5))
def test_any_accepted_key_stays_under_root(segments: list[str]) -> None:
    key = "/".join(segments)
    root = Path("/srv/objects")
    try:
        validate_object_key(key)
    except StageFailed as exc:
        assert exc.failure_code == "invalid-object-key"
        return
    resolved = resolve_object(root, "acme", key)
    assert resolved.is_relative_to(root.resolve() / "acme")
    assert ".." not in key.split("/") and "%" not in key and "\\" not in key


@given(st.sampled_from(["..", "%2e%2e", "%2E%2e", "\uff0e\uff0e", ".%2e"]), _segment)
def test_dot_dot_in_any_encoding_anywhere_is_refused(dots: str, name: str) -> None:
    for key in (f"{dots}/{name}", f"models/{dots}/{name}", f"models/{dots}"):
        with pytest.raises(StageFailed):
            validate_object_key(key)
