"""Shared pieces of the TypeScript worker tests: building the worker, running it as a process
on its own BullMQ key prefix, and writing cube models as binary STL."""

from __future__ import annotations

import json
import os
import select
import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest
from tests.services import REDIS_DB

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "workers" / "metadata-extract-ts"
BINDINGS = ROOT / "bindings" / "typescript"


def cube_stl(edge: float, offset: tuple[float, float, float]) -> bytes:
    """A binary STL of an axis-aligned cube: 12 outward-wound triangles over 8 corners."""
    corners = [
        (x * edge + offset[0], y * edge + offset[1], z * edge + offset[2])
        for z in (0, 1) for y in (0, 1) for x in (0, 1)
    ]  # fmt: skip
    quads = [(0, 2, 3, 1), (4, 5, 7, 6), (0, 1, 5, 4), (2, 6, 7, 3), (1, 3, 7, 5), (0, 4, 6, 2)]
    tris = [t for a, b, c, d in quads for t in ((a, b, c), (a, c, d))]
    out = bytearray(b"cube".ljust(80, b" ") + struct.pack("<I", len(tris)))
    for tri in tris:
        out += struct.pack("<3f", 0, 0, 0)
        for i in tri:
            out += struct.pack("<3f", *corners[i])
        out += b"\0\0"
    return bytes(out)


def _run(cmd: list[str], cwd: Path) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        pytest.fail(f"`{' '.join(cmd)}` in {cwd} failed:\n{done.stdout}\n{done.stderr}")


def _newest(directory: Path) -> float:
    return max(p.stat().st_mtime for p in directory.rglob("*.ts"))


def built_worker() -> Path:
    """The compiled worker entry point, installing and building what is missing or stale."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("Node.js and npm are required for the TypeScript worker test")
    if not (BINDINGS / "dist" / "index.js").exists():
        _run(["npm", "ci", "--no-audit", "--no-fund"], BINDINGS)
        _run(["npm", "run", "build"], BINDINGS)
    if not (WORKER / "node_modules" / "bullmq").exists():
        _run(["npm", "ci", "--no-audit", "--no-fund"], WORKER)
    main = WORKER / "dist" / "src" / "main.js"
    if not main.exists() or main.stat().st_mtime < _newest(WORKER / "src"):
        _run(["npm", "run", "build"], WORKER)
    return main


class NodeWorker:
    """The worker process on its own key prefix, serving one storage root."""

    def __init__(
        self, main: Path, prefix: str, storage: Path, log: Path,
        env: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        self.prefix = prefix
        self.url = f"bullmq://127.0.0.1:6379/{REDIS_DB}?prefix={prefix}&stalled_ms=1000"
        self.worker_id = f"ts-{prefix}"
        cmd = ["node", str(main), "--transport", self.url, "--storage-root", str(storage),
               "--heartbeat-ms", "100", "--worker-id", self.worker_id]  # fmt: skip
        self.log = log  # a file, not a pipe: a full pipe would stall the worker
        with log.open("wb") as err:
            environ = {**os.environ, **(env or {})}
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=environ)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and self.proc.poll() is None:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
            if ready:
                line = json.loads(self.proc.stdout.readline())
                assert line["event"] == "ready" and line["queue"] == "metadata"
                return
        self.stop()
        pytest.fail(f"the TypeScript worker did not start: {self.stderr()}")

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
