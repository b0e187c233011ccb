"""The event loop Accord's processes run on (accord.loop): which one a choice comes to, that the
coroutine really runs on it, and that a loop that cannot be had is refused before anything runs."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from accord import loop as accord_loop
from accord.loop import LoopUnavailable, chosen, run

ROOT = Path(__file__).resolve().parents[2]


async def _loop_module() -> str:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop()).__module__


def _without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        accord_loop.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "uvloop" else real(name, *a),
    )


def test_auto_is_uvloop_where_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCORD_LOOP", raising=False)
    assert importlib.util.find_spec("uvloop") is not None  # a dependency on this platform
    assert chosen() == chosen("auto") == "uvloop"
    assert run(_loop_module()).startswith("uvloop")


def test_asyncio_by_name_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert chosen("asyncio") == "asyncio"
    assert run(_loop_module(), "asyncio").startswith("asyncio")
    monkeypatch.setenv("ACCORD_LOOP", " AsyncIO ")
    assert chosen() == "asyncio"
    assert run(_loop_module()).startswith("asyncio")
    assert chosen("uvloop") == "uvloop"  # an explicit choice wins over the environment


def test_auto_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCORD_LOOP", raising=False)
    _without_uvloop(monkeypatch)
    assert chosen("auto") == "asyncio"
    with pytest.raises(LoopUnavailable, match="uvloop is not installed"):
        chosen("uvloop")


@pytest.mark.parametrize("name", ["tokio", "", "uv loop"])
def test_unknown_loop_is_refused_and_nothing_runs(name: str) -> None:
    if not name:  # empty means the default
        assert chosen(name) in {"uvloop", "asyncio"}
        return
    ran: list[bool] = []

    async def main() -> None:
        ran.append(True)

    coro = main()
    with pytest.raises(LoopUnavailable, match="one of auto, uvloop, asyncio"):
        run(coro, name)
    assert not ran and coro.cr_frame is None  # closed, never started: no "never awaited"


def test_cli_refuses_an_unknown_loop_before_starting() -> None:
    cli = Path(sys.executable).parent / "accord"
    for command in (["engine", "run"], ["demo"]):
        done = subprocess.run(
            [str(cli), *command, "--loop", "tokio"],
            check=False, cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2, done
        assert "unknown event loop 'tokio'" in done.stdout + done.stderr
