"""The filesystem object store: atomic writes with digests, refs resolved by configuration."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accord.errors import StageFailed
from accord.worker.storage import StorageMap


def test_put_bytes_returns_key_size_and_digest_of_what_is_on_disk(tmp_path: Path) -> None:
    store = StorageMap.local(tmp_path).open("local", "acme")
    key, size, digest = store.put_bytes("thumbnails/m1/gallery.png", b"\x89PNG-bytes")
    on_disk = (tmp_path / "acme" / "thumbnails" / "m1" / "gallery.png").read_bytes()
    assert (key, size) == ("thumbnails/m1/gallery.png", len(on_disk))
    assert digest == "sha256:" + hashlib.sha256(on_disk).hexdigest()
    assert store.get_path(key).read_bytes() == on_disk
    assert not [
        p for p in (tmp_path / "acme" / "thumbnails" / "m1").iterdir() if p.name.startswith(".tmp")
    ]


@settings(max_examples=25, deadline=None)
@given(st.binary(max_size=4096))
def test_overwrites_are_whole(data: bytes) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        store = StorageMap.local(tmp).open(None, "acme")
        store.put_bytes("a/b.bin", b"old")
        _, size, digest = store.put_bytes("a/b.bin", data)
        assert store.get_path("a/b.bin").read_bytes() == data
        assert size == len(data) and digest.endswith(hashlib.sha256(data).hexdigest())


def test_unknown_ref_and_missing_object_are_classified(tmp_path: Path) -> None:
    storage_map = StorageMap.local(tmp_path)
    with pytest.raises(StageFailed) as unknown:
        storage_map.open("s3-prod", "acme")
    assert unknown.value.failure_code == "storage-unavailable"
    assert "s3-prod" not in str(unknown.value)  # the ref is sensitive: never echoed
    with pytest.raises(StageFailed) as missing:
        storage_map.open("local", "acme").get_path("models/none.stl")
    assert missing.value.failure_code == "object-not-found"


def test_writes_cannot_escape_through_keys(tmp_path: Path) -> None:
    store = StorageMap.local(tmp_path).open("local", "acme")
    with pytest.raises(StageFailed) as caught:
        store.put_bytes("../other/x.png", b"x")
    assert caught.value.failure_code == "invalid-object-key"
    assert not (tmp_path / "other").exists()


def test_find_model_by_convention(tmp_path: Path) -> None:
    store = StorageMap.local(tmp_path).open("local", "acme")
    store.put_bytes("models/m1.obj", b"v 0 0 0\n")
    assert store.find_model("m1", ["stl", "obj"]) == "models/m1.obj"
    with pytest.raises(StageFailed):
        store.find_model("m2", ["stl", "obj"])
