"""Every command's ``--help`` renders (a help text is rich markup: a stray ``[/x]`` in one would
end ``accord … --help`` in a traceback)."""

from __future__ import annotations

from typing import Any

from typer.main import get_command
from typer.testing import CliRunner

from accord.cli import app


def _paths(command: Any, path: list[str]) -> list[list[str]]:
    found = [path]
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        found += _paths(sub, [*path, name])
    return found


def test_every_command_renders_its_help() -> None:
    runner = CliRunner()
    paths = _paths(get_command(app), [])
    assert len(paths) > 50  # the whole tree was walked
    failed = {}
    for path in paths:
        result = runner.invoke(app, [*path, "--help"])
        if result.exit_code != 0 or "Usage" not in result.output:
            failed[" ".join(path)] = repr(result.exception)[:200]
    assert failed == {}
