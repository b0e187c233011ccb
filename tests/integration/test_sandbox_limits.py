"""I10 bounded untrusted work: each limit breach becomes a classified terminal failure.

The functions below run in the sandbox child; the tests hold the parent to its promise that the
worker survives and reports the right code within the limit (plus start-up slack).
"""

from __future__ import annotations

import gzip
import os
import time
import zipfile
from pathlib import Path

import pytest

from accord.errors import StageFailed
from accord.worker.sandbox import Limits, check_input_size, run_limited

HERE = "test_sandbox_limits"
TIGHT = Limits(cpu_seconds=1, wall_seconds=20, memory_bytes=1536 << 20, open_files=32)


def spin() -> None:
    while True:
        pass


def sleep_long() -> None:
    time.sleep(60)


def allocate(mib: int) -> int:
    block = bytearray(mib << 20)
    return len(block)


def open_many(directory: str, count: int) -> int:
    handles = []
    for i in range(count):  # held open on purpose: the limit is the point
        handles.append(Path(directory, f"f{i}").open("w"))  # noqa: SIM115
    return len(handles)


def die() -> None:
    os._exit(3)


def add(a: int, b: int) -> int:
    return a + b


def _code(func: str, args: tuple[object, ...], limits: Limits = TIGHT) -> tuple[str, float]:
    started = time.monotonic()
    with pytest.raises(StageFailed) as caught:
        run_limited(func, args, limits)
    assert caught.value.retryable is False
    return caught.value.failure_code, time.monotonic() - started


def test_a_result_comes_back() -> None:
    assert run_limited(f"{HERE}:add", (2, 3), TIGHT) == 5


def test_cpu_limit_is_a_parse_timeout() -> None:
    code, took = _code(f"{HERE}:spin", ())
    assert code == "parse-timeout"
    assert took < 10


def test_wall_time_is_a_parse_timeout() -> None:
    limits = Limits(cpu_seconds=30, wall_seconds=1.5)
    code, took = _code(f"{HERE}:sleep_long", (), limits)
    assert code == "parse-timeout"
    assert 1.4 < took < 8


def test_address_space_limit_is_a_memory_limit() -> None:
    code, _ = _code(f"{HERE}:allocate", (4096,))
    assert code == "memory-limit"
    assert run_limited(f"{HERE}:allocate", (64,), TIGHT) == 64 << 20  # under the limit it works


def test_open_file_limit_is_classified(tmp_path: Path) -> None:
    code, _ = _code(f"{HERE}:open_many", (str(tmp_path), 100))
    assert code == "input-too-large"


def test_a_dying_child_is_malformed_not_a_crash() -> None:
    code, _ = _code(f"{HERE}:die", ())
    assert code == "malformed-model"


def test_an_oversized_file_is_refused_before_reading(tmp_path: Path) -> None:
    big = tmp_path / "big.stl"
    big.write_bytes(b"\0" * 5000)
    with pytest.raises(StageFailed) as caught:
        check_input_size(big, Limits(input_bytes=4096))
    assert caught.value.failure_code == "input-too-large"
    assert check_input_size(big, Limits(input_bytes=5000)) == 5000


def _load(path: Path, limits: Limits) -> str:
    code, _ = _code("accord_worker_meshes.load:load_model", (str(path), path.name, limits), limits)
    return code


def test_a_3mf_member_declaring_a_huge_size_is_a_bomb(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.3mf"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("3D/3dmodel.model", b"\0" * (64 << 20))  # 64 MiB of zeros, ~64 KiB zipped
    assert bomb.stat().st_size < 200_000
    assert _load(bomb, Limits(decompressed_bytes=16 << 20, cpu_seconds=10)) == "input-too-large"


def test_a_3mf_whose_header_understates_its_member_is_caught(tmp_path: Path) -> None:
    bomb = tmp_path / "liar.3mf"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("3D/3dmodel.model", b"\0" * (8 << 20))
    data = bytearray(bomb.read_bytes())
    for sig, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):  # shrink uncompressed sizes
        at = data.find(sig)
        data[at + offset : at + offset + 4] = (100).to_bytes(4, "little")
    bomb.write_bytes(bytes(data))
    assert _load(bomb, Limits(decompressed_bytes=1 << 20, cpu_seconds=10)) == "malformed-model"


def test_a_gzip_bomb_stops_at_the_cap(tmp_path: Path) -> None:
    bomb = tmp_path / "model.stl.gz"
    with gzip.open(bomb, "wb") as out:
        for _ in range(64):
            out.write(b"\0" * (1 << 20))
    assert bomb.stat().st_size < 200_000
    assert _load(bomb, Limits(decompressed_bytes=8 << 20, cpu_seconds=10)) == "input-too-large"
