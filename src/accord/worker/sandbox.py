"""Run untrusted parsing in a child process under hard limits (reliability rule I10).

``run_limited("pkg.module:function", args, limits)`` calls the function in a child started from a
``forkserver`` (a clean process, never a fork of the threaded worker). In the child, before the
function runs, ``setrlimit`` caps CPU seconds, address space and open files; the parent waits at
most ``wall_seconds`` and then kills it. Input bytes are checked by the caller before reading
(:func:`check_input_size`) and by the parsers while decompressing (``limits.decompressed_bytes``).

Every way the child can end maps to one classified, terminal
:class:`~accord.errors.StageFailed` — the worker itself never crashes:

==========================  =====================================================
child outcome               failure code
==========================  =====================================================
raised ``StageFailed``      its own code (``input-too-large``, ``unsupported-format`` …)
``MemoryError``             ``memory-limit``
killed by ``SIGXCPU``       ``parse-timeout`` (CPU seconds)
outlived ``wall_seconds``   ``parse-timeout`` (wall time)
``EMFILE``                  ``input-too-large`` (the model opens too many files)
any other exception/death   ``malformed-model``
==========================  =====================================================

Heavy imports (trimesh, numpy, matplotlib) take seconds, so modules named with
:func:`register_preload` are imported once by the fork server and each child starts warm. As
with any ``multiprocessing`` start method but ``fork``, a main script must guard its entry point
with ``if __name__ == "__main__"`` (console scripts and pytest do).
"""

from __future__ import annotations

import errno
import importlib
import multiprocessing
import os
import resource
import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Any

from accord.errors import StageFailed

__all__ = ["Limits", "check_input_size", "register_preload", "run_limited"]

_MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds for one untrusted parse. Defaults follow the metadata worker's contract."""

    input_bytes: int = 512 * _MIB
    decompressed_bytes: int = 1024 * _MIB
    cpu_seconds: int = 60
    memory_bytes: int = 1024 * _MIB  # address space of the child, including the warm imports
    wall_seconds: float = 120.0
    open_files: int = 64

    @classmethod
    def from_contract(cls, limits: dict[str, int], **overrides: Any) -> Limits:
        """From a capability contract's ``limits`` (``timeMs``, ``memoryBytes``, ``inputBytes``)."""
        wall = limits.get("timeMs", 120_000) / 1000
        input_bytes = limits.get("inputBytes", 512 * _MIB)
        values: dict[str, Any] = {
            "input_bytes": input_bytes,
            "decompressed_bytes": 2 * input_bytes,
            "memory_bytes": limits.get("memoryBytes", 1024 * _MIB),
            "wall_seconds": wall,
            "cpu_seconds": max(1, int(wall)),
        }
        values.update(overrides)
        return cls(**values)


def failure(code: str, reason: str, **details: object) -> StageFailed:
    """A terminal classified failure; the one constructor every limit check uses."""
    return StageFailed(reason, failure_code=code, retryable=False, details=dict(details))


def check_input_size(path: Path, limits: Limits) -> int:
    """Refuse a file larger than ``limits.input_bytes`` before a byte of it is read."""
    size = path.stat().st_size
    if size > limits.input_bytes:
        raise failure(
            "input-too-large",
            f"input is {size} bytes, over the limit of {limits.input_bytes}",
            sizeBytes=size,
            limitBytes=limits.input_bytes,
        )
    return size


_preload: list[str] = []
_context: ForkServerContext | None = None
_lock = threading.Lock()


def register_preload(*modules: str) -> None:
    """Modules the fork server imports once (effective if called before the first run)."""
    for module in modules:
        if module not in _preload:
            _preload.append(module)


def _ctx() -> ForkServerContext:
    global _context  # noqa: PLW0603 - one fork server per process, started on first use
    with _lock:
        if _context is None:
            ctx = multiprocessing.get_context("forkserver")
            # "__main__" too: each child would otherwise re-import the main script itself
            ctx.set_forkserver_preload(["__main__", "accord.worker.sandbox", *_preload])
            _context = ctx
        return _context


def _apply_limits(limits: Limits) -> None:
    cpu = max(1, int(limits.cpu_seconds))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a killed parse leaves no core file


def _child(conn: Connection, func: str, args: Sequence[Any], limits: Limits) -> None:
    os.environ["MPLBACKEND"] = "Agg"
    try:
        module_name, _, attr = func.partition(":")
        fn = getattr(importlib.import_module(module_name), attr)
        _apply_limits(limits)
        result = fn(*args)
        message: tuple[Any, ...] = ("ok", result)
    except StageFailed as exc:
        message = ("fail", exc.failure_code, exc.reason, exc.details)
    except MemoryError:
        message = ("fail", "memory-limit", f"parse exceeded {limits.memory_bytes} bytes", {})
    except OSError as exc:
        if exc.errno == errno.EMFILE:
            reason = f"parse opened more than {limits.open_files} files"
            message = ("fail", "input-too-large", reason, {})
        else:
            message = ("fail", "malformed-model", f"{type(exc).__name__}: {exc}"[:500], {})
    except Exception as exc:
        message = ("fail", "malformed-model", f"{type(exc).__name__}: {exc}"[:500], {})
    try:
        conn.send(message)
    except MemoryError:
        conn.send(("fail", "memory-limit", "result too large to return", {}))
    finally:
        conn.close()


def run_limited(func: str, args: Sequence[Any], limits: Limits) -> Any:
    """Call ``func`` (``"module:function"``) with ``args`` in a limited child; return its result.

    Raises :class:`StageFailed` (never retryable) for every limit breach or parse failure.
    """
    ctx = _ctx()
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(sender, func, tuple(args), limits), daemon=True)
    proc.start()
    sender.close()
    try:
        if receiver.poll(limits.wall_seconds):
            try:
                message = receiver.recv()
            except EOFError:
                message = None
        else:
            message = "timeout" if proc.is_alive() else None
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        receiver.close()
    if message == "timeout":
        raise failure("parse-timeout", f"parse ran past {limits.wall_seconds:g} s of wall time")
    if isinstance(message, tuple):
        if message[0] == "ok":
            return message[1]
        _, code, reason, details = message
        raise StageFailed(reason, failure_code=code, retryable=False, details=details)
    return _classify_death(proc.exitcode, limits)


def _classify_death(exitcode: int | None, limits: Limits) -> Any:
    if exitcode in (-signal.SIGXCPU, -signal.SIGKILL):
        raise failure("parse-timeout", f"parse used more than {limits.cpu_seconds} CPU seconds")
    if exitcode == -signal.SIGABRT:
        # a native (C++) allocation failing under RLIMIT_AS aborts instead of raising MemoryError
        raise failure("memory-limit", f"parser aborted under a {limits.memory_bytes}-byte limit")
    raise failure("malformed-model", f"parser exited without a result (exit code {exitcode})")
