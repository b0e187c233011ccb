"""One contract suite over every object-store adapter: the filesystem and S3 (real SeaweedFS).

Each test gets an empty store (a fresh directory; a fresh prefix in the shared server's bucket).
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from accord.adapters.objects import FileObjectStore, open_object_store
from accord.adapters.objects.s3 import S3ObjectStore
from accord.objects.ports import (
    ObjectDenied,
    ObjectExists,
    ObjectNotFound,
    ObjectStore,
    ObjectUnavailable,
)
from tests.services import ensure_seaweedfs

BUCKET = "accord-contract"


def _s3(prefix: str, identity: str = "admin") -> S3ObjectStore:
    server = ensure_seaweedfs()
    access, secret = server.credentials(identity)
    store = S3ObjectStore(BUCKET, endpoint=server.endpoint, prefix=prefix, access_key=access,
                          secret_key=secret)  # fmt: skip
    if identity == "admin":
        store.ensure_bucket()
    _opened.append(store)
    return store


_opened: list[ObjectStore] = []


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    yield
    while _opened:
        _opened.pop().close()


@pytest.fixture(params=["fs", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    opened: ObjectStore
    if request.param == "fs":
        opened = FileObjectStore(tmp_path / "objects")
    else:
        opened = _s3(f"t-{uuid.uuid4().hex[:12]}")
    yield opened


def test_put_then_get_returns_the_bytes_and_metadata(store: ObjectStore) -> None:
    info = store.put("a/b/c.json", b'{"x":1}', metadata={"expires-at-ms": "1700000000000"})
    assert (info.key, info.size) == ("a/b/c.json", 7)
    got = store.get("a/b/c.json")
    assert got.data == b'{"x":1}'
    assert got.metadata == {"expires-at-ms": "1700000000000"}
    assert store.head("a/b/c.json").size == 7
    assert store.head("a/b/c.json").metadata == {"expires-at-ms": "1700000000000"}


def test_a_missing_key_is_an_explicit_not_found(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFound):
        store.get("nothing/here.json")
    with pytest.raises(ObjectNotFound):
        store.head("nothing/here.json")


def test_overwrite_replaces_and_delete_removes(store: ObjectStore) -> None:
    store.put("k.bin", b"old")
    store.put("k.bin", b"new")
    assert store.get("k.bin").data == b"new"
    store.delete("k.bin")
    store.delete("k.bin")  # deleting a missing key is not an error
    with pytest.raises(ObjectNotFound):
        store.get("k.bin")


def test_conditional_write_refuses_an_existing_key(store: ObjectStore) -> None:
    store.put("once.json", b"first", if_absent=True)
    with pytest.raises(ObjectExists):
        store.put("once.json", b"second", if_absent=True)
    assert store.get("once.json").data == b"first"


def test_concurrent_conditional_writers_of_one_key_write_once(store: ObjectStore) -> None:
    won: list[bytes] = []
    lost: list[bytes] = []
    barrier = threading.Barrier(6)

    def write(n: int) -> None:
        body = f"writer-{n}".encode()
        barrier.wait()
        try:
            store.put("race.json", body, if_absent=True)
            won.append(body)
        except ObjectExists:
            lost.append(body)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1, won
    assert len(lost) == 5
    assert store.get("race.json").data == won[0]


def test_list_by_prefix_is_sorted(store: ObjectStore) -> None:
    for key in ("p/b.json", "p/a.json", "q/c.json", "p/sub/d.json"):
        store.put(key, b"x")
    assert store.list("p/") == ["p/a.json", "p/b.json", "p/sub/d.json"]
    assert store.list() == ["p/a.json", "p/b.json", "p/sub/d.json", "q/c.json"]


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", "./a", "a\\b"])
def test_keys_that_leave_the_store_are_refused(store: ObjectStore, key: str) -> None:
    with pytest.raises(ObjectDenied):
        store.put(key, b"x")
    with pytest.raises(ObjectDenied):
        store.get(key)


def test_a_signed_url_reads_exactly_its_object(store: ObjectStore) -> None:
    store.put("signed/one.bin", b"payload-1")
    store.put("signed/two.bin", b"payload-2")
    url = store.presign("signed/one.bin", "get", 60)
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.read() == b"payload-1"


def test_open_object_store_by_url(tmp_path: Path) -> None:
    fs = open_object_store(f"file://{tmp_path}")
    fs.put("x.json", b"1")
    assert (tmp_path / "x.json").read_bytes() == b"1"
    server = ensure_seaweedfs()
    access, secret = server.credentials()
    s3 = open_object_store(f"s3://{BUCKET}/via-url?endpoint={server.endpoint}",
                           access_key=access, secret_key=secret)  # fmt: skip
    _opened.append(s3)
    s3.put("x.json", b"2")
    assert s3.get("x.json").data == b"2"
    assert "secret" not in s3.url and server.endpoint in s3.url
    with pytest.raises(ValueError, match="credentials never go in the URL"):
        open_object_store(f"s3://user:pw@{BUCKET}/p?endpoint={server.endpoint}")
    with pytest.raises(ValueError, match="scheme must be"):
        open_object_store("gs://bucket/x")


# -- S3 only: what a signature protects ---------------------------------------------------------


def test_s3_tampered_and_expired_signed_urls_are_refused() -> None:
    store = _s3(f"t-{uuid.uuid4().hex[:12]}")
    store.put("a.bin", b"a")
    store.put("b.bin", b"b")
    url = store.presign("a.bin", "get", 60)
    for forged in (url.replace("a.bin", "b.bin"), url.replace("Expires=60", "Expires=600")):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(forged, timeout=10)
        assert refused.value.code == 403
        refused.value.close()
    with pytest.raises(ObjectDenied):
        store.presign("a.bin", "get", 0)


def test_s3_wrong_secret_and_write_only_identity_are_denied_not_missing() -> None:
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    _s3(prefix).put("x.json", b"1")
    server = ensure_seaweedfs()
    access, _ = server.credentials()
    wrong = S3ObjectStore(BUCKET, endpoint=server.endpoint, prefix=prefix, access_key=access,
                          secret_key="not-the-secret")  # fmt: skip
    _opened.append(wrong)
    with pytest.raises(ObjectDenied):
        wrong.get("x.json")
    writer = _s3(prefix, "writer")
    with pytest.raises(ObjectDenied):
        writer.get("x.json")
    with pytest.raises(ObjectDenied):
        writer.get("missing.json")  # no read right: not even absence is disclosed


def test_s3_unreachable_server_is_unavailable() -> None:
    dead = S3ObjectStore(BUCKET, endpoint="http://127.0.0.1:9", access_key="a", secret_key="b")
    _opened.append(dead)
    with pytest.raises(ObjectUnavailable):
        dead.get("x.json")
